"""The one-step traces of the whole-run replays of one answer, shared, and interpolated across micro-batches.

A full answer replays several whole runs (``allocator_whole_run.replay_whole_run``): the headline, the largest
micro-batch's boundary (``advice.max_micro_batch``: the largest that fits and the next), and the advisor's
candidates (``verdict_replay.MAX_REPLAYS``). Each replay composes the one-step traces of its spec's step at the
depths of ``tracer_depth.depth_plan`` (``trace_step(optimizer=None, steps=1)``) with the optimizer traced alone.
Many of those steps are the same step:

- a candidate that changes only what the step's trace does not run (the optimizer, the sharding of states, their
  offload: not arguments of the step's trace) asks for the very same trace, which is kept;
- the plain Trainer's step at another micro-batch runs the same allocations with other sizes. At a fixed sequence
  length each storage that step allocates is either independent of the micro-batch or proportional to it
  (``trace_batch``, which interpolates the activation traces' live bytes the same way), so every allocation's size
  is affine in the micro-batch. Where two traced micro-batches of 2 or more allocated and freed the same storages
  (:func:`events_at`), the events at a third are theirs with each storage's size interpolated, when every such size
  is a positive whole number; otherwise that micro-batch is traced. A micro-batch of 1 runs other allocations
  (``trace_batch``) and is always traced. TRL's steps (``trl_*`` arguments) are kept but never interpolated: their
  fused LM head loops over token tiles of ``TOKEN_CHUNK_SIZE`` rows (``tracer_trl``), so a tile's rows are the
  step's tokens up to 4096, and the last tile's the tokens modulo 4096: not affine in the micro-batch, with the
  same events (the repeated tiles are skipped: ``tracer_trl.repeated_tiles_skipped``).

The traces live in the path's trace cache (``PinnedPath._optimizer_traces``, passed to the replays as
``optimizer_traces``) under :data:`KEY`, so they are shared exactly where the optimizer traces are, and dropped
with the path. ``tests/test_trace_batch.py`` checks the interpolated events against a third trace (the same eight
kinds of step as the activation traces' interpolation) and the sharing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from fitcheck.torch_adapters.trace_result import TraceResult

KEY = "one-step traces"  # the entry of a path's trace cache (a dict of str keys) that holds them


def _step_key(config: Mapping[str, Any], depth: int, kwargs: Mapping[str, Any]) -> str:
    """The step a trace runs, the micro-batch excepted: the config, the depth, every other argument."""
    rest = sorted((k, v) for k, v in kwargs.items() if k != "micro_batch")
    return repr((json.dumps(config, sort_keys=True, default=repr), depth, rest))


def events_at(first: TraceResult, b_first: int, second: TraceResult, b_second: int,
              micro_batch: int) -> TraceResult | None:
    """The replay's view of a one-step trace at ``micro_batch`` (its ``alloc_events``, ``region_starts`` and
    ``accumulated_after``: all that ``allocator_compose.whole_run`` reads) from traces of the same step at two other
    micro-batches, or None where they did not run the same allocations or a size would not be a positive whole
    number.

    The two traces must allocate the same storages (serial and region of each allocation, in order), free the same
    ones, and have the same region starts and accumulated gradients. Each storage's size is interpolated; the
    events come in ``first``'s order. The order of some frees is not fixed by the step: two traces of one
    micro-batch free some same-sized storages in other orders (Llama-3-8B QLoRA at 4 x 2048, one layer, traced
    twice), so ``first``'s order is one a trace at ``micro_batch`` could run too.

    Args:
        first: The trace at ``b_first`` sequences (the nearer one).
        b_first: Its micro-batch.
        second: The trace at ``b_second`` sequences (``!= b_first``).
        b_second: Its micro-batch.
        micro_batch: The micro-batch wanted.
    """
    if b_first == b_second or not first.alloc_events or len(first.alloc_events) != len(second.alloc_events):
        return None
    if first.region_starts != second.region_starts or first.accumulated_after != second.accumulated_after:
        return None
    allocated = [(serial, region) for serial, size, region in first.alloc_events if size > 0]
    if allocated != [(serial, region) for serial, size, region in second.alloc_events if size > 0]:
        return None
    sizes = {serial: size for serial, size, _ in first.alloc_events if size > 0}
    other = {serial: size for serial, size, _ in second.alloc_events if size > 0}
    freed = sorted(serial for serial, size, _ in first.alloc_events if size < 0)
    if freed != sorted(serial for serial, size, _ in second.alloc_events if size < 0) or not set(freed) <= set(sizes):
        return None
    t = Fraction(micro_batch - b_first, b_second - b_first)
    at: dict[int, int] = {}
    for serial, size in sizes.items():
        got = size + (other[serial] - size) * t
        if got.denominator != 1 or got <= 0:
            return None
        at[serial] = int(got)
    events = tuple((serial, at[serial] if size > 0 else -at[serial], region)
                   for serial, size, region in first.alloc_events)
    return TraceResult({}, first.num_layers, 0, alloc_events=events, region_starts=first.region_starts,
                       accumulated_after=first.accumulated_after)


def kept_trace(cache: dict[str, Any], config: Mapping[str, Any], depth: int, kwargs: Mapping[str, Any]) -> TraceResult:
    """``trace_step(config, num_layers=depth, **kwargs)``, traced once per path: the activation traces of a traced
    answer (``trace_batch.BatchTraces``) are kept where the replays look for the same step (a ``--seq_lengths``
    replay's step at the answer's own length was traced a second time)."""
    from fitcheck.torch_adapters.tracer import trace_step

    traced: dict[int, TraceResult] = cache.setdefault(KEY, {}).setdefault(_step_key(config, depth, kwargs), {})
    micro = int(kwargs["micro_batch"])
    if micro not in traced:
        traced[micro] = trace_step(config, num_layers=depth, **kwargs)
    return traced[micro]


def one_step_traces(cache: dict[str, Any], config: Mapping[str, Any], plan: Sequence[int],
                    kwargs: Mapping[str, Any]) -> list[TraceResult]:
    """The one-step traces of a step at each depth of ``plan``: kept, interpolated, or traced now.

    Args:
        cache: The path's trace cache (this module's traces under :data:`KEY`).
        config: config.json mapping of the model.
        plan: The depths (``tracer_depth.depth_plan``).
        kwargs: ``tracer.trace_step``'s arguments but ``num_layers`` (``optimizer=None, steps=1``), the
            micro-batch included.

    Returns:
        One trace per depth of ``plan`` (an interpolated one holds only what the replay reads).
    """
    from fitcheck.torch_adapters.tracer import trace_step

    store: dict[str, dict[int, TraceResult]] = cache.setdefault(KEY, {})
    micro = int(kwargs["micro_batch"])
    affine = micro >= 2 and not any(v for k, v in kwargs.items() if k.startswith("trl_"))  # () / None: not TRL
    out = []
    for depth in plan:
        traced = store.setdefault(_step_key(config, depth, kwargs), {})
        if micro not in traced:
            probes = sorted((b for b in traced if b >= 2), key=lambda b: (abs(b - micro), b))[:2]
            got = (events_at(traced[probes[0]], probes[0], traced[probes[1]], probes[1], micro)
                   if affine and len(probes) == 2 else None)
            if got is not None:
                out.append(got)
                continue
            traced[micro] = trace_step(config, num_layers=depth, **kwargs)
        out.append(traced[micro])
    return out
