"""The full-depth allocation sequence built from one and two layer groups equals a real deeper fake trace.

The caching-allocator replay needs every layer's events (the gap does not extrapolate linearly in depth:
``fitcheck/torch_adapters/allocator_replay.py``); ``allocator_deepen.deepen`` builds them from the two traces the
tracer runs anyway. Checked against ``trace_step`` of the real deeper model (tiny Llama, three steps with fused
AdamW as ``benchmarks/gpu_truth_step.py`` runs them), event for event up to storage renaming, and the replay of
both through ``fitcheck.core.caching`` gives the same peaks.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import LLAMA_8_LAYERS

from fitcheck.core.caching import AllocatorConf
from fitcheck.torch_adapters.allocator_deepen import DeepenError, canonical, deepen
from fitcheck.torch_adapters.allocator_replay import replay_events
from fitcheck.torch_adapters.tracer import trace_step

CONFIG = LLAMA_8_LAYERS
STEP = {"seq_len": 32, "micro_batch": 2, "optimizer": "adamw_torch_fused", "steps": 3, "cuda_kernels": True}


@pytest.mark.parametrize("extra", [{}, {"checkpointing": True}, {"dtype": "float32", "mixed_precision": "bf16"}],
                         ids=["bf16", "checkpointing", "fp32-autocast"])
def test_deepened_sequence_is_the_deeper_trace(extra: dict[str, object]) -> None:
    events = {d: trace_step(CONFIG, num_layers=d, **{**STEP, **extra}).alloc_events for d in (1, 2, 3)}
    built = deepen(events[1], events[2], 3)
    assert len(built) == len(events[3])
    assert canonical(built) == canonical(events[3])
    conf = AllocatorConf()
    real, synth = replay_events([events[3]], conf), replay_events([built], conf)
    assert (synth.peak_allocated, synth.peak_reserved) == (real.peak_allocated, real.peak_reserved)


def test_deepen_refuses_what_is_not_an_insertion() -> None:
    one = [(0, 1024, "setup"), (1, 2048, "forward"), (1, -2048, "forward")]
    two = [(0, 1024, "setup"), (1, 4096, "forward"), (1, -4096, "forward")]  # a changed size, not a new block
    with pytest.raises(DeepenError):
        deepen(one, two, 4)
    with pytest.raises(DeepenError):
        deepen(one, one, 1)
