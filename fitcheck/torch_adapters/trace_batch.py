"""Traces at two micro-batches answer every micro-batch of the same step: sizes are affine in the micro-batch.

At a fixed sequence length the step runs the same ATen ops at every micro-batch; each storage it allocates is
either independent of the micro-batch (parameters, gradients, norms' weights, scalars) or proportional to it
(every activation, the logits, the loss's per-token tensors, the s x s attention scores of each sequence). So
the live bytes of each category after each event of the step are affine in the micro-batch, and two traces at
micro-batches ``b1 != b2`` whose allocation sequences are the same (``TraceResult.structure``) give every other
micro-batch event by event. The peak of a phase is the largest of those affine totals, which moves from one
event to another as the micro-batch grows (late in backward, when gradients dominate, at small micro-batches;
at its start at large ones), so the interpolation is done per event and the peak taken afterwards, never on the
peaks themselves. ``tests/test_trace_batch.py`` checks the claim against a third trace, phase by phase.

A micro-batch of 1 does not run the same allocations as the others (a transpose of one sequence is already
contiguous: one copy fewer), so it is always traced and never used as a probe; when two traces do not run the
same allocations for any other reason, nothing is interpolated: the micro-batch asked is traced.

``BatchTraces`` keeps the traces of one kind of step (everything of ``trace_arguments.trace_kwargs`` but the
micro-batch) and answers any micro-batch: the first two asked of 2 or more are traced, every later one is
interpolated from them (one trace per depth of ``tracer_depth.depth_plan`` each).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fitcheck.report import Phase
from fitcheck.torch_adapters.step_traces import kept_trace
from fitcheck.torch_adapters.trace_result import (
    TraceResult,
    accumulating_step,
    breakdown_at_peak,
    resident_gradients_step,
)
from fitcheck.torch_adapters.tracer_depth import combine_depths, depth_plan, first_layer_apart, residual_promoted


def at_micro_batch(first: TraceResult, b_first: int, second: TraceResult, b_second: int,
                   micro_batch: int) -> TraceResult | None:
    """The trace at ``micro_batch`` from traces of the same step at two other micro-batches.

    Args:
        first: The trace at ``b_first`` sequences.
        b_first: Its micro-batch.
        second: The trace at ``b_second`` sequences (``!= b_first``).
        b_second: Its micro-batch.
        micro_batch: The micro-batch wanted.

    Returns:
        The per-event affine interpolation (or extrapolation), or None when the two traces did not run the
        same allocations (then the micro-batch must be traced).
    """
    if b_first == b_second or first.structure != second.structure or not first.series:
        return None
    if any(len(first.series[p]) != len(second.series.get(p, ())) for p in first.series):
        return None
    t = (micro_batch - b_first) / (b_second - b_first)
    series: dict[Phase, tuple[tuple[int, ...], ...]] = {}
    for phase, events in first.series.items():
        rows = []
        for x, y in zip(events, second.series[phase], strict=True):
            row = tuple(round(a + (b - a) * t) for a, b in zip(x, y, strict=True))
            if min(row) < 0:
                return None
            rows.append(row)
        series[phase] = tuple(rows)
    phases = {phase: breakdown_at_peak(rows) for phase, rows in series.items()}
    grads = round(first.final_grads + (second.final_grads - first.final_grads) * t)
    return TraceResult(phases, first.num_layers, grads, 0.0, series=series, structure=first.structure)


class BatchTraces:
    """The traces of one kind of step at one sequence length, answering any micro-batch.

    Attributes:
        traced: micro-batch -> the depth traces run at it (``tracer_depth.depth_plan``).
        interpolated: How many answers came from interpolation.
    """

    def __init__(self, config: Mapping[str, Any], kwargs: Mapping[str, Any], skip_first: bool = False,
                 shared: dict[str, Any] | None = None) -> None:
        """Args:
        config: config.json mapping of the model.
        kwargs: ``tracer.trace_step`` keyword arguments but ``micro_batch`` and ``num_layers``.
        shared: A path's trace cache, where each trace is kept for the whole-run replays that run the same step
            (``step_traces.kept_trace``); None: this object's own.
        skip_first: Trace two and three layer groups where the bottom layer's moment differs
            (``tracer_depth.first_layer_apart``); the benchmarks' reference traces. The default path keeps one
            and two groups: the allocator replay deepens those (``allocator_whole_run.replay_whole_run``). Two and
            three groups on every path where layer 0 reads another dtype (``tracer_depth.residual_promoted``).
        """
        self.config = config
        self.kwargs = {k: v for k, v in kwargs.items() if k not in ("micro_batch", "num_layers")}
        # two and three groups where layer 0 reads another dtype (residual_promoted), on every path
        self.plan = depth_plan(config, self.kwargs.get("freeze"),
                               (skip_first and first_layer_apart(self.kwargs)) or residual_promoted(self.kwargs))
        self.traced: dict[int, tuple[TraceResult, ...]] = {}
        self.interpolated = 0
        self.shared: dict[str, Any] = {} if shared is None else shared

    def _trace(self, micro_batch: int) -> tuple[TraceResult, ...]:
        if micro_batch not in self.traced:
            self.traced[micro_batch] = tuple(
                kept_trace(self.shared, self.config, n, {**self.kwargs, "micro_batch": micro_batch}) for n in self.plan
            )
        return self.traced[micro_batch]

    def result(self, micro_batch: int, accumulating: bool = False, resident: bool = False) -> TraceResult:
        """The full-depth trace result at ``micro_batch`` (traced, or interpolated from two traced ones).

        ``accumulating``: the step as a later micro-step of a gradient accumulation window runs it
        (``trace_result.accumulating_step`` of each depth's trace, before the depths and micro-batches are combined);
        the traces kept (``traced``, shared with the replays) stay the first pass's. ``resident``: every gradient held
        from the start of backward (ZeRO-3's resident buffer, ``trace_result.resident_gradients_step``), the same
        way."""
        # a micro-batch of 1 runs other allocations (a transpose of a batch of one is already contiguous: one
        # copy fewer; Qwen3-8B, Llama-2-7B, every method tried): it is traced, and never a probe for the others
        probes = [b for b in self.traced if b >= 2]
        if micro_batch in self.traced or micro_batch < 2 or len(probes) < 2:
            runs = self._trace(micro_batch)
            # traced: the deepest run's allocation sequence goes with it (allocator_replay replays it)
            return dataclasses.replace(combine_depths(self.config, _as_run(runs, accumulating, resident)),
                                       alloc_events=runs[-1].alloc_events)
        near = sorted(probes, key=lambda b: (abs(b - micro_batch), b))[:2]
        low, high = (_as_run(self.traced[b], accumulating, resident) for b in near)
        parts = [at_micro_batch(low[i], near[0], high[i], near[1], micro_batch) for i in range(len(self.plan))]
        if any(p is None for p in parts):
            return combine_depths(self.config, _as_run(self._trace(micro_batch), accumulating, resident))
        self.interpolated += 1
        return combine_depths(self.config, tuple(p for p in parts if p is not None))


def _as_run(runs: tuple[TraceResult, ...], accumulating: bool, resident: bool = False) -> tuple[TraceResult, ...]:
    """Each depth's trace as traced (the first pass after ``zero_grad``), or as a later micro-step of an
    accumulation window runs it (``accumulating_step``), or as a run holding every gradient from the start of
    backward does (``resident_gradients_step``)."""
    if accumulating:
        return tuple(map(accumulating_step, runs))
    return tuple(map(resident_gradients_step, runs)) if resident else runs
