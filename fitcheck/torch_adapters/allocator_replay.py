"""The traced step's own allocations and frees, replayed through the caching allocator (``fitcheck.core.caching``).

The fake-tensor tracer records every storage it creates and frees, in order (``TraceResult.alloc_events``). This
module replays that sequence -- the model's parameters, then the warm-up and steady-state steps -- through torch's
caching-allocator rules, and, for later steps of other lengths (a length distribution: ``seq_lengths``), only their
steady-state step on the same allocator, as a dataloader that varies the padded length would run them.

Traced at the reduced depth the tracer extrapolates from (two repeating layer groups), the replay gives the
allocator's gap (peak reserved - peak allocated) as a fraction of the step's transient bytes at its peak: the
fraction this model's own sequence leaves, where ``core/allocator.py`` otherwise applies a published 11 %.

That fraction does not carry from two layer groups to the full depth: replayed at 1, 2, 3, 4, 8 and 16 layers,
Llama-3.2-1B's gap under checkpointing (8 x 2048) is 3673, 3377, 3081, 2785, 2113 and 8272 MiB: not linear in
depth, so not extrapolable from two groups. :func:`replay_steady_state` replays the run as the H100 measured
it -- full depth, the optimizer, two warm-up steps -- and reproduces ``max_memory_reserved`` of all 8 measured
rows within -0.73 % .. -0.14 % (``benchmarks/reserved_replay.py``), at 23-79 s of tracing per row on a shared
CPU. :func:`replay_deepened` builds the same sequence from the one- and two-group traces of those steps
(``allocator_deepen``); :func:`.allocator_whole_run.replay_whole_run`, what the default path runs for a traced
answer, from the one-step activation traces it has already run and the optimizer traced alone
(``allocator_compose``), 0.2-0.8 s. The step's trace arguments and the load's warm-up block before it:
:mod:`.replay_step_args`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fitcheck.core import ReplayedGap
from fitcheck.core.caching import AllocatorConf, CachingAllocator
from fitcheck.core.loading import allocator_conf
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches
from fitcheck.torch_adapters.replay_step_args import load_warmup, run_trace_kwargs


@dataclass(frozen=True)
class StepReplay:
    """What the replayed steps left in the allocator.

    Attributes:
        peak_allocated: ``max_memory_allocated`` over the replayed steps.
        peak_reserved: ``max_memory_reserved`` over the replayed steps.
        persistent: Bytes allocated before the first step (parameters, buffers, inputs; optimizer states are
            added by the first step and counted as persistent after it).
        transient: The steps' own bytes at the allocated peak (``peak_allocated - persistent``).
        gap_fraction: ``(peak_reserved - peak_allocated) / transient``.
        lengths: The sequence lengths replayed, in order.
        step_reserved: ``max_memory_reserved`` after each replayed trace (one per length), what
            ``benchmarks/gpu_truth_step.py`` records per step (``measured.per_step``).
        step_allocated: ``memory_allocated`` after each replayed trace: from the first step on (it creates the
            optimizer's states) the same at every step boundary where the traces pair their frees.
    """

    peak_allocated: int
    peak_reserved: int
    persistent: int
    transient: int
    gap_fraction: float
    lengths: tuple[int, ...]
    step_reserved: tuple[int, ...] = ()
    step_allocated: tuple[int, ...] = ()

    def measured(self, own_run: bool) -> ReplayedGap:
        """What the estimate takes from this replay (``core.estimate(replayed=)``): the gap fraction, and the
        replay's own peak reserved bytes where ``own_run`` (the replayed run is the answered run itself: this rank,
        this spec, every layer), below which the answer's reserved never falls (``core/allocator.py``
        ``phase_reserved``)."""
        return ReplayedGap(self.gap_fraction, self.peak_reserved if own_run else 0)


def replay_events(traces: Sequence[Sequence[tuple[int, int, str]]], conf: AllocatorConf | None = None,
                  lengths: Sequence[int] = (), persistent_after_first: bool = False,
                  release_before: int = -1) -> StepReplay:
    """Replay traced steps through the caching allocator.

    Args:
        traces: ``alloc_events`` of one trace per step length: the first is replayed whole (setup, warm-up,
            step); later ones only their steady-state step, with each of its accumulation passes (their parameters,
            inputs and warm-up step are the first trace's: :func:`_measured_step_start`).
        conf: Allocator settings.
        lengths: The sequence length of each trace (for the result).
        persistent_after_first: Count what the first trace leaves allocated as persistent (its optimizer states
            included, where its step is not a warm-up step).
        release_before: Before this trace, return the cached blocks (``empty_cache``: what a failed
            ``cudaMalloc`` does before its retry) and restart the peaks: the peaks are that trace's and the later
            ones'.

    Returns:
        Peaks and the allocator's gap over the transient bytes.
    """
    alloc = CachingAllocator(conf)
    handles = itertools.count(1)
    persistent = 0
    step_reserved: list[int] = []
    step_allocated: list[int] = []
    for k, events in enumerate(traces):
        if k == release_before:
            alloc.empty_cache()
            alloc.reset_peak_stats()
        live: dict[int, int] = {}
        measured = _measured_step_start(events) if k else 0
        for i, (serial, signed, tag) in enumerate(events):
            if k and (tag == "setup" or (tag.endswith("_warmup") and i < measured)):
                continue
            if k == 0 and tag != "setup" and not persistent:
                persistent = alloc.stats.allocated
            if signed > 0:
                h = next(handles)
                live[serial] = h
                alloc.malloc(h, signed)
            elif serial in live:
                alloc.free(live.pop(serial))
        if k == 0:
            persistent = max(persistent, _after_warmup(events, alloc))
            if persistent_after_first:
                persistent = max(persistent, alloc.stats.allocated)
        step_reserved.append(alloc.stats.peak_reserved)
        step_allocated.append(alloc.stats.allocated)
    s = alloc.stats
    transient = max(s.peak_allocated - persistent, 1)
    return StepReplay(s.peak_allocated, s.peak_reserved, persistent, transient,
                      (s.peak_reserved - s.peak_allocated) / transient, tuple(lengths), tuple(step_reserved),
                      tuple(step_allocated))


def _measured_step_start(events: Sequence[tuple[int, int, str]]) -> int:
    """Where a trace's measured step starts, after its last ``optimizer_warmup`` event (its accumulation passes but the
    last are named warm-up ones too: ``tracer.trace_step``, ``allocator_compose.whole_run``); else its end."""
    last = [i for i, (_, _, tag) in enumerate(events) if tag == "optimizer_warmup"]
    return last[-1] + 1 if last else len(events)


def _after_warmup(events: Sequence[tuple[int, int, str]], alloc: CachingAllocator) -> int:
    """Bytes still live from the setup and warm-up (parameters, optimizer states) after the whole first trace."""
    sizes: dict[int, int] = {}
    for serial, signed, tag in events:
        if tag == "setup" or tag.endswith("_warmup"):
            if signed > 0:
                sizes[serial] = signed
            else:
                sizes.pop(serial, None)
    return sum(sizes.values())


def replay_lengths(spec: TrainingSpec, seq_lengths: Sequence[int]) -> tuple[StepReplay, StepReplay]:
    """The steps of ``seq_lengths`` replayed in order, and the longest of them replayed alone (same traces).

    The second is what stays reserved once the allocator has released its cached segments: when a ``cudaMalloc``
    fails, ``CUDACachingAllocator.cpp`` frees every unsplit cached segment (``release_cached_blocks``) and retries,
    so near the GPU's capacity the blocks earlier, shorter steps left cached do not stop the longest step.

    Args:
        spec: The training spec (its model must carry config.json).
        seq_lengths: Padded lengths of successive steps.

    Returns:
        (the sequence's replay, the longest length's replay alone).
    """
    traces = _traces(spec, tuple(seq_lengths), replayed_micro_batches(spec.batch.grad_accum))
    conf = allocator_conf(spec)
    longest = max(range(len(traces)), key=lambda k: seq_lengths[k])
    return (replay_events(traces, conf, tuple(seq_lengths)),
            replay_events([traces[longest]], conf, (seq_lengths[longest],)))


def _traces(spec: TrainingSpec, lengths: tuple[int, ...], micro_batches: int = 1) -> list[Sequence[Any]]:
    """``alloc_events`` of the spec's step traced at two repeating layer groups, one trace per length
    (``micro_batches`` forward and backward passes per step: ``tracer.trace_step``'s ``grad_accum``)."""
    from fitcheck.torch_adapters.tracer import trace_step
    from fitcheck.torch_adapters.tracer_build import config_layers, layer_group

    config = spec.model.config
    depth = min(config_layers(config), 2 * layer_group(config))
    kwargs = run_trace_kwargs(spec)
    if micro_batches > 1:
        kwargs["grad_accum"] = micro_batches
    traces: list[Sequence[tuple[int, int, str]]] = []
    for length in lengths:
        kwargs["seq_len"] = length
        traces.append(trace_step(config, num_layers=depth, **kwargs).alloc_events)
    return traces


STEADY_STEPS = 3  # the steps benchmarks/gpu_truth_step.py runs on the GPU (peaks of steps 2-3; states exist)


def replay_steady_state(spec: TrainingSpec, steps: int = STEADY_STEPS) -> StepReplay:
    """The spec's run traced at its full depth with its optimizer and warm-up steps, replayed through the allocator.

    What ``benchmarks/gpu_truth_step.py`` runs on the GPU: ``steps`` steps, the optimizer's states allocated in the
    first (``torch.optim`` creates them lazily in ``step``), so later steps start from the blocks the first left
    cached. Unlike :func:`replay_step` nothing is extrapolated: every layer's allocations are replayed.

    Args:
        spec: The training spec (its model must carry config.json).
        steps: Steps traced (the last is the measured one; the others are warm-up).

    Returns:
        The replay's peaks over all steps (``max_memory_reserved`` never falls, so its peak is the last step's).
    """
    from fitcheck.torch_adapters.tracer import trace_step

    kwargs = {**run_trace_kwargs(spec), "steps": steps, "grad_accum": replayed_micro_batches(spec.batch.grad_accum)}
    events = trace_step(spec.model.config, **kwargs).alloc_events
    return replay_events([load_warmup(spec) + list(events)], allocator_conf(spec), (spec.batch.seq_len,))


def replay_deepened(spec: TrainingSpec, steps: int = STEADY_STEPS) -> StepReplay:
    """:func:`replay_steady_state` from the traces of one and two layer groups (``allocator_deepen.deepen``).

    Equal to the full-depth trace's replay where the two traces differ by repeated layer blocks (tested on tiny
    Llama bf16, checkpointed, fp32 + autocast, LoRA and QLoRA steps; at real width, Llama-3.2-1B's bf16 full,
    checkpointed, LoRA and QLoRA rows replay to the same peaks as their 16-layer traces); a stack the builder
    cannot deepen (a depth that is not a whole number of groups, ``DeepenError``) is traced at full depth
    instead.

    Args:
        spec: The training spec (its model must carry config.json).
        steps: Steps traced (the last is the measured one).

    Returns:
        The replay's peaks over all steps.
    """
    from fitcheck.torch_adapters.allocator_deepen import DeepenError, deepen_past_first
    from fitcheck.torch_adapters.tracer import trace_step
    from fitcheck.torch_adapters.tracer_build import config_layers, layer_group

    config = spec.model.config
    depth, group = config_layers(config), layer_group(config)
    kwargs = {**run_trace_kwargs(spec), "steps": steps}

    def traced(groups: int) -> tuple[Sequence[tuple[int, int, str]], Sequence[int]]:
        run = trace_step(config, num_layers=groups * group, **kwargs)
        return run.alloc_events, run.region_starts

    if depth > 2 * group and depth % group == 0:
        try:
            events = deepen_past_first(traced, depth // group)
            return replay_events([load_warmup(spec) + list(events)], allocator_conf(spec), (spec.batch.seq_len,))
        except DeepenError:
            pass
    return replay_steady_state(spec, steps)


def replay_step(spec: TrainingSpec, seq_lengths: Sequence[int] | None = None) -> StepReplay:
    """Trace the spec's step (two repeating layer groups) at each length and replay it through the allocator.

    Args:
        spec: The training spec (its model must carry config.json).
        seq_lengths: Padded lengths of successive steps (default: the spec's ``max_seq_length`` only).

    Returns:
        The replay's peaks and gap fraction.
    """
    lengths = tuple(seq_lengths or (spec.batch.seq_len,))
    return replay_events(_traces(spec, lengths), allocator_conf(spec), lengths)
