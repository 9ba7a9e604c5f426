"""A full fine-tune's post-attention RMSNorm backward, checkpointed, 16-bit (issue 20, off-grid probe seed 114).

With its MLP's weight gradients made and five fp32 h-wide temporaries of the norm's chain rule alive, the bottom
layer's post-attention norm backward is the phase's peak wherever a layer's gradients outweigh its per-token
tensors and the vocabulary is small (``fitcheck/core/activations/norm_backward.py``): Llama-2-70B bf16 4 x 960 was
-27.1 % during backward while printing ``pinned: true``. Here Llama-2-70B and Qwen2.5-7B configs scaled down by 8
(h 1024, I 3584, 8 heads of 128, one KV head, a 4000-token vocabulary, 2 layers), traced on fake tensors at shapes
where that moment is the peak (main's formula: -12 .. -27 %) and where the MLP's is; about a second a case.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import narrow_catalog_config

from fitcheck.report import Phase
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, phase_errors
from fitcheck.torch_adapters.tracer import trace_step

BOUND = 0.005


@pytest.mark.parametrize(("model", "family", "batch", "seq"), [
    ("meta-llama/Llama-2-70b-hf", "llama", 4, 120),
    ("meta-llama/Llama-2-70b-hf", "llama", 2, 256),
    ("meta-llama/Llama-2-70b-hf", "llama", 8, 512),  # the MLP's moment
    ("Qwen/Qwen2.5-7B", "qwen2", 1, 480),
])
def test_during_backward_equals_the_trace(model: str, family: str, batch: int, seq: int) -> None:
    cfg = narrow_catalog_config(model, bos_token_id=1, eos_token_id=2)
    cfg.pop("rope_scaling", None)
    cfg.update(hidden_size=1024, intermediate_size=3584, num_attention_heads=8, num_key_value_heads=1, head_dim=128,
               vocab_size=4000)
    spec = cell_spec(Cell(family, "full", True, "sdpa", "bf16", seq, batch), cfg)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    errs = phase_errors(spec, components_from_trace(trace_step(cfg, num_layers=2, **kw)))
    assert abs(errs[Phase.BACKWARD]) <= BOUND, errs
