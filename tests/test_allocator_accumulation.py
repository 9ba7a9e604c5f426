"""Gradient accumulation in the whole-run replay: ``gradient_accumulation_steps`` forward and backward passes per
optimizer step, the later ones allocating each gradient, adding it into ``.grad`` in place and freeing it (torch
2.13 ``accumulate_grad.h``), checked against a real accumulating trace and a real Trainer.

Before session 11 ``allocator_compose.whole_run`` composed one pass per step whatever the accumulation (issue 19):
the composed run's peak allocated missed the first pass's gradients alive during the later passes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dataclasses import replace

from tiny_models import LLAMA_8_LAYERS, REPLAY_LORA, REPLAY_STEP

from benchmarks.cpu_truth import Row, spec_for
from fitcheck.spec import DeviceType, TrainingSpec
from fitcheck.torch_adapters.allocator_compose import whole_run
from fitcheck.torch_adapters.allocator_replay import replay_events, replay_steady_state, replay_whole_run
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_optimizer import trace_optimizer

CASES = {"bf16": {}, "lora": {"lora": REPLAY_LORA, "mixed_precision": "bf16"}}


@pytest.mark.parametrize("kind", list(CASES))
def test_composed_accumulation_is_the_accumulating_trace(kind: str) -> None:
    """Two passes per step, three steps: the composed run has the real trace's events and regions and replays to
    its peaks; one pass per step (the old composition) misses the first pass's gradients."""
    extra = {**REPLAY_STEP, **CASES[kind]}
    real = trace_step(LLAMA_8_LAYERS, num_layers=2, **{**extra, "optimizer": "adamw_torch_fused", "steps": 3,
                                                        "grad_accum": 2})
    step = trace_step(LLAMA_8_LAYERS, num_layers=2, **{**extra, "optimizer": None, "steps": 1})
    opt, opt_starts = trace_optimizer(LLAMA_8_LAYERS, num_layers=2, **{**extra, "optimizer": "adamw_torch_fused",
                                                                       "steps": 3})
    events, starts = whole_run(step.alloc_events, step.region_starts, opt, opt_starts, 3, 2)
    assert len(events) == len(real.alloc_events) and starts == real.region_starts
    a, b = replay_events([events]), replay_events([real.alloc_events])
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)
    old = replay_events([whole_run(step.alloc_events, step.region_starts, opt, opt_starts, 3)[0]])
    assert old.peak_allocated < b.peak_allocated


def _spec(**kw: object) -> TrainingSpec:
    spec = spec_for(Row("accum", LLAMA_8_LAYERS, seq=32, batch=2, dtype="bfloat16", optim="adamw_torch_fused",
                        **kw))
    return replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))


def test_fast_accumulating_run_equals_the_full_depth_trace() -> None:
    """Eight layers, two passes per step: composed at one and two layers and deepened, the peaks of the real
    eight-layer accumulating trace."""
    spec = _spec(ckpt=True)
    spec = replace(spec, batch=replace(spec.batch, grad_accum=2))
    fast, slow = replay_whole_run(spec), replay_steady_state(spec)
    assert (fast.peak_allocated, fast.peak_reserved) == (slow.peak_allocated, slow.peak_reserved)
