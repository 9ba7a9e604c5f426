"""QLoRA loaded in fp32 without checkpointing: the top layer's down_proj ``MatMul4Bit`` backward (issue 20).

bitsandbytes 0.50.2 ``autograd/_functions.py`` ``MatMul4Bit.backward`` computes
``grad_output @ dequantize_4bit(B, ctx.state).to(grad_output.dtype)``: the whole weight dequantized in its load
dtype (fp32) and its cast to the compute dtype (bf16) are alive together, on top of every layer's saved tensors.
The formula modelled that moment only for a recomputed (checkpointed) layer, so without checkpointing it was under
the trace at short sequences on wide layers (``benchmarks/envelope_ranges.py`` llama/qlora/nockpt/eager/fp32
-2.07 %, mistral -3.03 %, qwen2 -2.03 % at 1 x 512; ``lora_recompute.unrecomputed_base_backward``).

A Llama-3.1-8B config narrowed to h 256 with a wide MLP (I 2752) and a 128-token vocabulary, so that this moment
is the backward peak, 2 layers traced on fake tensors (a few seconds each). On main the during-backward phase is
under the trace by the dequantized weight and its cast less the MLP working set (-16.3 % sdpa, -16.1 % eager).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from tiny_models import narrow_catalog_config

from fitcheck.report import Phase
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, phase_errors
from fitcheck.torch_adapters.tracer import trace_step


def _narrow_wide_mlp() -> dict[str, Any]:
    cfg = narrow_catalog_config("meta-llama/Llama-3.1-8B", bos_token_id=1, eos_token_id=2)
    cfg.pop("rope_scaling", None)
    cfg.update(intermediate_size=2752, vocab_size=128, num_hidden_layers=2)
    return cfg


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_fp32_load_during_backward_equals_the_trace(attn: str) -> None:
    cfg = _narrow_wide_mlp()
    spec = cell_spec(Cell("llama", "qlora", False, attn, "fp32", 64, 1), cfg)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    errs = phase_errors(spec, components_from_trace(trace_step(cfg, num_layers=2, **kw)))
    assert errs[Phase.BACKWARD] == 0.0, errs
