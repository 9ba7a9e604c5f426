"""What one traced (or real) training step held: the tracer's categories, a phase's breakdown and the result.

Pure data (no torch): ``tracer.trace_step`` fills a :class:`TraceResult`; ``tracer_depth``, ``trace_batch``, the
allocator replay and the trace cache read it, and :func:`components_from_trace` reads it as the estimate's
activation components. Split from ``tracer`` to keep that module under the guide's ~500 lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fitcheck.report import Category, Component, Location, Phase

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
        pending_grads: Per row of ``series[Phase.BACKWARD]``, the bytes of the final ``.grad`` storages whose
            ``AccumulateGrad`` had not yet returned after that event (:func:`pending_grads`; empty where the measured
            pass was not the first since ``zero_grad``): what :func:`accumulating_step` adds.
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
    pending_grads: tuple[int, ...] = field(default=(), compare=False, repr=False)

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


def pending_grads(start: int, end: int, returned: list[tuple[int, int]], grads: Mapping[int, int]) -> tuple[int, ...]:
    """``TraceResult.pending_grads`` of a first pass's backward region (events ``start`` .. ``end``, the recorder's
    window: its first row is the state at entry): after each event, the bytes of the gradients in ``grads``
    (serial -> bytes: the final ``.grad`` storages) whose ``AccumulateGrad`` returned at a later or the same event
    (``returned``: (event index, ``.grad`` serial), from a post-accumulate-grad hook)."""
    if end < start:  # a region still open when recording stopped runs to the last event (recorder.series)
        end = max([start, *(i for i, _ in returned)])
    at = [(i, grads[g]) for i, g in returned if g in grads and start <= i <= end]
    left = sum(n for _, n in at)
    freed: dict[int, int] = {}
    for i, n in at:
        freed[i] = freed.get(i, 0) + n
    rows = []
    for i in range(start, end + 1):
        rows.append(left)
        left -= freed.get(i, 0)
    return tuple(rows)


def accumulating_step(result: TraceResult) -> TraceResult:
    """A first pass's trace as the accumulating micro-step of the same step (the second and later passes of a
    ``gradient_accumulation_steps`` window) runs it, from the one pass traced.

    torch 2.13 ``torch/csrc/autograd/functions/accumulate_grad.h`` ``accumulateGrad``: in the first pass after
    ``zero_grad(set_to_none=True)`` each new gradient is stolen and becomes ``.grad``; in a later pass ``.grad``
    exists from the pass's start and the new gradient (made by the same ops at the same events: the engine runs the
    same nodes in the same order, ``AccumulateGrad``'s ``sequence_nr`` is ``UINT64_MAX``, ``autograd/node.h``) is
    added into it in place and freed when ``AccumulateGrad`` returns. So after each event of backward the later pass
    holds the first pass's bytes plus every gradient whose ``AccumulateGrad`` has not returned yet
    (``pending_grads``), counted as gradients; the phase's peak is redrawn over those rows. The same release
    ``allocator_compose._accumulated`` adds to the replay's events. Forward and the start of backward hold every
    gradient besides (a constant: the same peak event), which the formulas count as the ``gradients`` model state
    (``core/states/model_states.py``), so those phases are left as traced. Equal, phase by phase, to the second
    pass of ``trace_step(grad_accum=2)``, and through ``PinnedPath`` (``tests/test_pinned_recipe.py``); the real CPU
    step too (``benchmarks/accumulating_view_check.py``)."""
    rows = result.series.get(Phase.BACKWARD, ())
    if not result.pending_grads or len(rows) != len(result.pending_grads):
        return result
    at = CATEGORIES.index(GRADS)
    later = tuple(tuple(n + extra if c == at else n for c, n in enumerate(row))
                  for row, extra in zip(rows, result.pending_grads, strict=True))
    return replace(result, phases={**result.phases, Phase.BACKWARD: breakdown_at_peak(later)},
                   series={**result.series, Phase.BACKWARD: later}, pending_grads=())


def resident_gradients_step(result: TraceResult) -> TraceResult:
    """A trace's step as a run whose every gradient byte exists before backward (ZeRO-3's resident flat gradient
    buffer, ``core/states/sharding.py`` ``Partition.gradients_resident``; ``core/states/accumulation.py``
    ``gradients_held_from_start``) runs it, in every micro-step: the ``.grad`` the traced pass makes one by one are
    all held from the phase's start (``final_grads`` in every row of ``Phase.BACKWARD``), and the phase's peak is
    redrawn over those rows. Each new whole gradient on its way into that buffer is ``model_states``'
    ``buffers.zero3_gathered_params`` (``sharding.zero3_gradient_in_flight``), not the trace's. Without this the
    peak row is one where most gradients are "not made yet" and ``components_from_trace`` leaves them out: real
    deepspeed 0.19.8 ZeRO-3 engine, tiny Llama (``benchmarks/accumulation_engines_cpu.py``), during backward -9.10 %
    / -4.28 % at 2 x 32 / 2 x 128 tokens; with it the head's weight-gradient moment of that engine is matched (the
    formula's ``head`` moment)."""
    rows = result.series.get(Phase.BACKWARD, ())
    if not rows:
        return result
    at = CATEGORIES.index(GRADS)
    held = tuple(tuple(result.final_grads if c == at else n for c, n in enumerate(row)) for row in rows)
    return replace(result, phases={**result.phases, Phase.BACKWARD: breakdown_at_peak(held)},
                   series={**result.series, Phase.BACKWARD: held}, pending_grads=())


def components_from_trace(result: TraceResult) -> tuple[Component, ...]:
    """Split a trace into components whose per-phase sum with the model states equals the trace."""
    src = "fake-tensor trace of the real model step (fitcheck.torch_adapters.tracer)"
    acts: dict[Phase, int] = {}
    logits: dict[Phase, int] = {}
    temps: dict[Phase, int] = {}
    for phase, b in result.phases.items():
        states = b.get(PARAMS) + b.get(OPTSTATE)
        if phase is Phase.OPTIMIZER_STEP:
            # optimizer-step temporaries belong to fitcheck.core.states.model_states; only leftovers are ours
            acts[phase] = b.get(ACTIVATIONS) + b.get(INPUTS) + b.get(LOGITS)
            continue
        if phase is Phase.BACKWARD:
            # model_states counts every gradient here; the residual is what else was alive at the peak
            rest = b.total - states - result.final_grads
            acts[phase] = min(b.get(ACTIVATIONS) + b.get(INPUTS), max(rest, 0))
            # the logits' gradient still alive early in backward (vocab-sized): logits, so that a TRL trainer's
            # fused head replaces it too (core/step.py traced_body_formula_head); the sum is unchanged
            logits[phase] = min(b.get(LOGITS), max(rest - acts[phase], 0))
            temps[phase] = max(rest - acts[phase] - logits[phase], 0)
        else:
            acts[phase] = b.get(ACTIVATIONS) + b.get(INPUTS)
            logits[phase] = b.get(LOGITS)
            temps[phase] = b.get(TEMPORARIES) + b.get(GRADS)
    return (
        Component("activations.traced", Category.ACTIVATIONS, Location.DEVICE, acts, src),
        Component("logits.traced", Category.LOGITS, Location.DEVICE, logits, src),
        Component("temporaries.traced", Category.TEMPORARIES, Location.DEVICE, temps, src),
    )


__all__ = ["ACTIVATIONS", "CATEGORIES", "GRADS", "INPUTS", "LOGITS", "OPTSTATE", "PARAMS", "TEMPORARIES",
           "PhaseBreakdown", "TraceResult", "accumulating_step", "breakdown_at_peak", "components_from_trace",
           "pending_grads", "resident_gradients_step"]
