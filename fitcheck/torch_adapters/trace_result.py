"""What one traced (or real) training step held: the tracer's categories, a phase's breakdown and the result.

Pure data (no torch): ``tracer.trace_step`` fills a :class:`TraceResult`; ``tracer_depth``, ``trace_batch``, the
allocator replay and the trace cache read it. Split from ``tracer`` (which re-exports every name) to keep that
module under the guide's ~500 lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fitcheck.report import Phase

PARAMS = "parameters"
GRADS = "gradients"
OPTSTATE = "optimizer_state"
ACTIVATIONS = "activations"
LOGITS = "logits"
TEMPORARIES = "temporaries"
INPUTS = "inputs"
CATEGORIES = (PARAMS, GRADS, OPTSTATE, ACTIVATIONS, LOGITS, TEMPORARIES, INPUTS)


@dataclass(frozen=True)
class PhaseBreakdown:
    """Live bytes at the peak of one phase.

    Attributes:
        total: All live bytes at that moment.
        by_category: Category name -> bytes (sums to ``total``).
    """

    total: int
    by_category: Mapping[str, int]

    def get(self, category: str) -> int:
        """Bytes of one category (0 if absent)."""
        return int(self.by_category.get(category, 0))


@dataclass(frozen=True)
class TraceResult:
    """What one traced (or real) training step held in memory.

    Attributes:
        phases: Phase -> breakdown at that phase's peak.
        num_layers: Depth traced (or extrapolated to).
        final_grads: Bytes of all gradients at the end of backward.
        seconds: Wall time of the trace (model build + two steps).
        extra: Benchmark measurements attached to it.
        series: Phase -> live bytes by category (``CATEGORIES`` order) after every event of that phase; the
            phase's breakdown is the one at its largest total (``breakdown_at_peak``).
        structure: A hash of the measured step's allocation sequence (category and alloc/free of each event,
            not sizes): two traces with equal structure ran the same allocations, so their series align event
            by event (``fitcheck.torch_adapters.trace_batch``).
        alloc_events: Every storage allocation and free of the trace in order, as ``(serial, +bytes / -bytes,
            region allocated in)``: the sequence the caching-allocator replay runs (``allocator_replay``).
        region_starts: Index in ``alloc_events`` of the first event of each region of each step (forward, head,
            backward, optimizer, ``zero_grad``), in order: where one pass over the layers ends and the next begins
            (``allocator_deepen``).
        accumulated_after: ``(gradient serial, serial, +1 / -1)`` for each ``.grad`` the first pass made: the
            allocation (+1) or free (-1) right before its ``AccumulateGrad`` returned (a post-accumulate-grad hook),
            where a later pass of an accumulation window frees that gradient (``allocator_compose.whole_run``).
    """

    phases: Mapping[Phase, PhaseBreakdown]
    num_layers: int
    final_grads: int
    seconds: float = 0.0
    extra: Mapping[str, float] = field(default_factory=dict)
    series: Mapping[Phase, tuple[tuple[int, ...], ...]] = field(default_factory=dict, compare=False, repr=False)
    structure: int = field(default=0, compare=False)
    alloc_events: tuple[tuple[int, int, str], ...] = field(default=(), compare=False, repr=False)
    region_starts: tuple[int, ...] = field(default=(), compare=False, repr=False)
    accumulated_after: tuple[tuple[int, int, int], ...] = field(default=(), compare=False, repr=False)

    @property
    def peak(self) -> int:
        """Largest live bytes over the phases."""
        return max(b.total for b in self.phases.values())

    @property
    def peak_phase(self) -> Phase:
        """The phase with the largest live total."""
        return max(self.phases, key=lambda p: self.phases[p].total)


def breakdown_at_peak(series: tuple[tuple[int, ...], ...]) -> PhaseBreakdown:
    """The breakdown at the first event with the largest live total of a phase's series."""
    best = max(range(len(series)), key=lambda i: sum(series[i]))
    by_cat = {c: n for c, n in zip(CATEGORIES, series[best], strict=True) if n}
    return PhaseBreakdown(total=sum(by_cat.values()), by_category=by_cat)


__all__ = ["ACTIVATIONS", "CATEGORIES", "GRADS", "INPUTS", "LOGITS", "OPTSTATE", "PARAMS",
           "TEMPORARIES", "PhaseBreakdown", "TraceResult", "breakdown_at_peak"]
