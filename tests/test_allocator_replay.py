"""The traced step's own allocation sequence, replayed through the caching allocator (``allocator_replay``), and
its use in the estimate where a trace exists (it replaces the published 11 % of ``core/allocator.py``).

Fails on the code before issue 19: ``TraceResult`` had no ``alloc_events`` and ``estimate`` no ``gap_fraction``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from benchmarks.cpu_truth import LLAMA, Row, spec_for
from fitcheck.core import estimate
from fitcheck.spec import DeviceType
from fitcheck.torch_adapters import PinnedPath, replay_events, replay_step
from fitcheck.torch_adapters.tracer import trace_step


def _cuda_spec(seq: int = 256) -> object:
    spec = spec_for(Row("replay", LLAMA, seq=seq, batch=2, dtype="bfloat16", optim="adamw_torch"))
    return replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))


def test_replayed_allocations_are_the_traced_ones() -> None:
    result = trace_step(LLAMA, seq_len=256, micro_batch=2, dtype="bfloat16", optimizer="adamw_torch")
    live = peak = 0
    for _serial, signed, _tag in result.alloc_events:
        live += signed
        peak = max(peak, live)
    replayed = replay_events([result.alloc_events])
    # the allocator counts each block rounded up to 512 B: never less than the live bytes, barely more
    assert peak <= replayed.peak_allocated <= peak * 1.01
    assert replayed.peak_reserved >= replayed.peak_allocated
    assert replayed.gap_fraction >= 0


def test_lengths_that_vary_change_what_stays_reserved() -> None:
    # the step's own tensors: a CPU spec's trace has no cuBLAS workspaces, which a CUDA process allocates once, in
    # whichever step runs first (cuda_emulation item 4), so they would sit in different blocks in the two sequences
    spec = spec_for(Row("replay", LLAMA, seq=256, batch=2, dtype="bfloat16", optim="adamw_torch"))
    one = replay_step(spec)  # type: ignore[arg-type]
    varied = replay_step(spec, (128, 256, 192, 256))  # type: ignore[arg-type]
    assert varied.lengths == (128, 256, 192, 256)
    # the longest step sets the allocated peak (a later trace's step also holds its own inputs and step counters)
    assert one.peak_allocated <= varied.peak_allocated <= one.peak_allocated * 1.01
    assert varied.peak_reserved >= one.peak_reserved  # shorter steps leave blocks the longer ones cannot reuse


def test_a_traced_estimate_uses_the_replayed_gap() -> None:
    spec = _cuda_spec()
    path = PinnedPath("always")
    report = path(spec)  # type: ignore[arg-type]
    gap = path.gap_fraction(spec)  # type: ignore[arg-type]
    assert gap is not None
    comps, _ = path.activations(spec)  # type: ignore[arg-type]
    fixed = estimate(spec, activations=comps)  # type: ignore[arg-type]
    assert report.peak_allocated_bytes == fixed.peak_allocated_bytes
    if abs(gap - 0.11) > 0.01:
        assert report.peak_reserved_bytes != fixed.peak_reserved_bytes
    said = [f.message for f in report.findings if f.code == "alloc-fragmentation"]
    assert not said or "replayed" in said[0]
    # the whole run replayed is this run (one process, this micro-batch): its own reserved bytes carry, a floor
    measured = path.replayed_gap(spec)  # type: ignore[arg-type]
    assert measured.fraction == gap and measured.reserved > 0
    assert report.peak_reserved_bytes == estimate(spec, activations=comps,  # type: ignore[arg-type]
                                                  replayed=measured).peak_reserved_bytes >= measured.reserved
    # another micro-batch of the same kind of step reuses the replay's fraction, not its bytes
    other = replace(spec, batch=replace(spec.batch, micro_batch=1))  # type: ignore[attr-defined]
    path(other)
    assert path.replayed_gap(other) == type(measured)(gap)
