"""QLoRA with peft's default targets (q_proj, v_proj), checkpointed: the MLP's 4-bit backward (issue 20).

With no adapter on the MLP, up_proj's ``MatMul4Bit.backward`` dequantizes its whole weight on the recomputed
layer (``fitcheck/core/activations/qlora_base_mlp.py``); at short sequences of an fp32 load that weight and its
compute-dtype cast are the phase's peak, which the formula missed (Llama-3.1-8B 1 x 512: -29.5 %). A
Llama-3.1-8B config narrowed to h 256 / I 688, 2 layers, a 1024-token vocabulary (so that a layer moment, not
the LM head, is the worst), traced on fake tensors at shapes where the weight is the peak and where the
per-token working set is; each case takes about a second.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tiny_models import narrow_catalog_config

from fitcheck.core.activations.envelope_range import recipe_suffix
from fitcheck.report import Phase
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, phase_errors
from fitcheck.torch_adapters.tracer import trace_step

BOUND = 0.005


def _qv_spec(precision: str, batch: int, seq: int) -> tuple[dict[str, Any], TrainingSpec]:
    cfg = narrow_catalog_config("meta-llama/Llama-3.1-8B", bos_token_id=1, eos_token_id=2)
    cfg.pop("rope_scaling", None)
    spec = cell_spec(Cell("llama", "qlora", True, "sdpa", precision, seq, batch), cfg)
    assert spec.lora is not None
    return cfg, dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, target_modules=("q_proj", "v_proj")))


@pytest.mark.parametrize(("precision", "batch", "seq"), [
    ("fp32", 1, 64),  # the dequantized fp32 weight + its bf16 cast are the peak (main: -20 %)
    ("fp32", 2, 160),
    ("fp32", 8, 512),  # the per-token working set is
    ("bf16", 1, 64),
])
def test_during_backward_equals_the_trace(precision: str, batch: int, seq: int) -> None:
    cfg, spec = _qv_spec(precision, batch, seq)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    errs = phase_errors(spec, components_from_trace(trace_step(cfg, num_layers=2, **kw)))
    assert abs(errs[Phase.BACKWARD]) <= BOUND, errs
    assert abs(errs[Phase.FORWARD_END]) <= BOUND, errs


def test_default_targets_have_their_own_range_rows() -> None:
    """peft's default targets are pinned only by ``+qv`` rows (``benchmarks/envelope_ranges.py --targets q,v``);
    a target set with no rows is not pinned at all."""
    _, spec = _qv_spec("fp32", 1, 64)
    assert recipe_suffix(spec) == "+qv"
    assert spec.lora is not None
    other = dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, target_modules=("q_proj", "k_proj")))
    assert recipe_suffix(other) is None
    every = dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, target_modules=("all-linear",)))
    assert recipe_suffix(every) == ""
