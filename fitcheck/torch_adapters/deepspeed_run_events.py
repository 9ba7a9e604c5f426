"""DeepSpeed's whole run, rank 0's, replayed through the caching allocator (issue 19: DeepSpeed reserved).

The default path composes the plain Trainer's whole run from the traced step (``allocator_whole_run.whole_run_events``:
parameters, three steps of forward, backward and torch's optimizer). Under DeepSpeed the run is different around
that step: ``deepspeed.initialize`` flattens and partitions the trainable parameters and makes the fp32 master,
backward hands every gradient to the engine, and the engine's optimizer steps a flat fp32 partition.
:func:`deepspeed_run` rewrites the plain run into DeepSpeed 0.19.8's, each piece read from its source:

* ``initialize``, ZeRO-1/2 (``runtime/zero/stage_1_and_2.py`` ``DeepSpeedZeroOptimizer.__init__``), per parameter
  group of the Trainer (decay, no decay; trainable parameters only, ``is_optimized_parameter``): ``empty_cache()``,
  the flat 16-bit copy (``flatten_dense_tensors_aligned``, padded to ``nccl_start_alignment_factor`` 2 x world
  size), the parameters re-pointed into it (``_update_model_bit16_weights``: their loaded storages are freed), the
  partition's ``.detach().clone().to(fp32)`` (the 16-bit clone freed once converted); then
  ``initialize_optimizer_states``: a zeroed fp32 gradient per group, all dropped at its end (``group.grad = None``).
* ``initialize``, ZeRO-3 (``runtime/zero/stage3.py``): the parameters' partitions moved into one flat buffer through
  the host with ``empty_cache()`` in between (``_create_fp16_partitions_with_defragmentation`` ->
  ``zero/utils.py`` ``defragment``); per sub-group (``_create_fp16_sub_groups``: parameters until
  ``sub_group_size``) ``converted = fp16.to(fp32)`` and ``converted.clone()`` (``_create_fp32_partitions``: the
  previous ``converted`` is freed when the name is bound again, the last at the function's end);
  ``initialize_optimizer_states``' zeroed fp32 gradient of the largest sub-group, dropped at its end; the ipg bucket
  (``contiguous_gradients``) and ``grad_partitions_flat_buffer`` (``_setup_for_real_optimizer``).
* backward, ZeRO-2 (and ZeRO-1 with ``overlap_comm``: ``process_gradients``): at the first gradient
  ``setup_buckets`` makes the ipg bucket (two with ``overlap_comm``), every gradient is copied into it and its own
  storage dropped (``reduce_independent_p_g_buckets_and_remove_grads``; one larger than the bucket is kept until
  the next gradient reduces it), ``copy_grads_in_partition`` makes ``grads_in_partition`` (on
  ``reduction_stream`` with ``overlap_comm``: its pool is ``core/states/deepspeed_streams.py``'s, not the default
  stream's), the epilogue drops the buckets (``_release_ipg_buffers``). ZeRO-1 without ``overlap_comm``: the
  gradients stay as autograd made them until the end of backward, where ``reduce_gradients`` copies them, in
  parameter order, into the bucket and ``grads_in_partition``. ZeRO-3: every gradient is copied into the
  resident ``grad_partitions_flat_buffer`` and dropped (``partition_grads``; the concatenated bucket is the
  reduce-and-partition stream's pool).
* the optimizer step, per group (ZeRO-1/2 ``step``) or sub-group (ZeRO-3 ``_prepare_fp32_grad_for_sub_group``):
  the 16-bit gradients flattened, ``.to(fp32)``, the flat copy dropped, Adam's two fp32 states made at the first
  step, the fp32 gradient dropped; ZeRO-1/2's ``grads_in_partition`` goes with the last group's gradients. The
  torch optimizer's own per-parameter events of the plain run are dropped.

More than one process (ZeRO-1/2; ZeRO-3's partitions and parameter gathers: :mod:`.deepspeed_run_zero3`, checked
against real 2- and 3-process engines, ``benchmarks/deepspeed_zero3_cpu.py``): one rank's, the one whose
``grads_in_partition`` is the largest (:attr:`.DeepSpeedPlan.rank`: the per-GPU peak is the largest rank's). Every
rank holds the whole flat 16-bit group; the fp32 master, ``initialize_optimizer_states``' zeroed gradient, the flat
gradient and Adam's states of the step are one partition (:meth:`.DeepSpeedPlan.partition`); ``grads_in_partition``
holds the parameters that overlap the rank's partition, whole (``copy_grads_in_partition``), and the step's fp64
norms their parts inside it (:meth:`.DeepSpeedPlan.in_partition`). Gradient accumulation (ZeRO-2, ZeRO-3): a
micro-batch is a plain pass (``_clear_param_grad_only`` leaves every ``.grad`` None, so autograd hands each gradient
over afresh); ZeRO-2 keeps the window's first ``grads_in_partition`` and drops the later ones
(``deepspeed_run_backward.Backward.accumulate``), ZeRO-3 adds into its resident buffer in place (``stage3.py``
``partition_grads``, ``micro_step_id`` > 0); the engine steps at the boundary.

Checked: the H200 Trainer rows (Llama-3.2-1B bf16 4 x 1024, ZeRO-2 and ZeRO-3, one process:
``benchmarks/deepspeed_reserved_replay.py``) and, live bytes after ``initialize``, backward and the step, real
DeepSpeed engines on CPU: one process, and ranks 0 and 1 of 2 and 3 gloo processes
(``tests/test_deepspeed_run_events.py``, ``benchmarks/deepspeed_run_events_cpu.py``). What is not replayed
(:func:`not_replayed`) keeps the published gap of ``core/allocator.py``, and the estimate's INFO says which part.
The plan of a run and what is not replayed: :mod:`.deepspeed_run_plan`.

Pure Python: no torch import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fitcheck.core.caching import AllocatorConf, CachingAllocator
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters import deepspeed_run_zero3 as zero3
from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches
from fitcheck.torch_adapters.deepspeed_run_backward import EMPTY_CACHE as EMPTY_CACHE
from fitcheck.torch_adapters.deepspeed_run_backward import RESET_PEAKS as RESET_PEAKS
from fitcheck.torch_adapters.deepspeed_run_backward import SIDE as SIDE
from fitcheck.torch_adapters.deepspeed_run_backward import Backward as _Backward
from fitcheck.torch_adapters.deepspeed_run_backward import Event as Event
from fitcheck.torch_adapters.deepspeed_run_backward import EventWriter as EventWriter
from fitcheck.torch_adapters.deepspeed_run_plan import (
    FP32,
    DeepSpeedPlan,
    DeepSpeedReplayError,
    aligned,
    deepspeed_plan,
    not_replayed,
    sub_groups,
)

FP64 = 8  # zero/utils.py get_norm_dtype: fp64 where the accelerator has it (CUDA)
MARK = -2  # a (MARK, 0, region) event: a point of the run that allocates nothing (an FSDP1 optimizer step)


def _trainable_storages(setup: Sequence[Event], plan: DeepSpeedPlan) -> list[list[tuple[int, bool]]]:
    """The setup storages of each group's trainable tensors, matched by size (the latest first: peft adds its
    adapters after the base model is built), each with whether it is fp32 (an adapter peft keeps in fp32,
    which the engine casts: ``engine.py`` ``_cast_module_mixed_precision``, ``p.data = p.data.to(param_dtype)``).

    Raises:
        DeepSpeedReplayError: A trainable tensor has no storage of its size.
    """
    free = [(s, n) for s, n, _ in reversed(setup) if n > 0]
    used: set[int] = set()
    out: list[list[tuple[int, bool]]] = []
    for i, group in enumerate(plan.groups):
        found = []
        for k, numel in enumerate(group):
            nbytes = numel * (FP32 if (i, k) in plan.adapters else plan.elem)
            hit = next((s for s, n in free if n == nbytes and s not in used), None)
            if hit is None:
                raise DeepSpeedReplayError(f"no traced parameter storage of {nbytes} bytes")
            used.add(hit)
            found.append((hit, nbytes != numel * plan.elem))
        out.append(found)
    return out


def _cast(w: EventWriter, plan: DeepSpeedPlan, matched: list[list[tuple[int, bool]]], size: dict[int, int],
          ) -> list[list[int]]:
    """``_cast_module_mixed_precision`` of the fp32 trainables (before the ZeRO optimizer is built): a 16-bit
    copy each, the fp32 storage freed. Returns each group's storages after it."""
    out: list[list[int]] = []
    for storages in matched:
        now = []
        for s, fp32 in storages:
            if fp32:
                n = size[s] // FP32 * plan.elem
                new = w.new(n, "setup")
                w.free(s, size[s], "setup")
                size[new] = n
                s = new
            now.append(s)
        out.append(now)
    return out


def _initialize(w: EventWriter, plan: DeepSpeedPlan, owned: list[list[int]], size: dict[int, int]) -> None:
    """``deepspeed.initialize``'s tensors (module docstring)."""
    t, e = "setup", plan.elem
    if plan.stage < 3:
        for i, (group, storages) in enumerate(zip(plan.groups, owned, strict=True)):
            w.out.append((-1, 0, EMPTY_CACHE))
            w.new(e * aligned(sum(group), plan.world), t)  # bit16_groups_flat: the whole group on every rank
            for s in storages:
                w.free(s, size[s], t)
            part = plan.partition(i)  # this rank's partition of it
            clone = w.new(e * part, t)
            w.new(FP32 * part, t)  # single_partition_of_fp32_groups
            w.free(clone, e * part, t)
        zeros = [(w.new(FP32 * plan.partition(i), t), FP32 * plan.partition(i)) for i in range(len(plan.groups))]
        for s, n in zeros:  # initialize_optimizer_states: group.grad = None
            w.free(s, n, t)
        return
    for storages in owned:
        for s in storages:
            w.free(s, size[s], t)
    w.out.append((-1, 0, EMPTY_CACHE))
    w.new(e * plan.numel, t)  # lp_param_buffer (defragment)
    subs = [n for g in plan.groups for n in sub_groups(g, plan.sub_group_size)]
    zero3.optimizer_buffers(w, plan, subs, plan.numel, t)


def _optimizer_step(w: EventWriter, plan: DeepSpeedPlan, tag: str, first: bool,
                    partition: tuple[int, int] | None) -> None:
    """The engine's step on the flat partitions (module docstring); ``partition`` is ZeRO-1/2's
    ``grads_in_partition`` (serial, bytes), freed with the last group's gradients."""
    e = plan.elem
    # ZeRO-1/2 scaled_global_norm -> get_grad_norm_direct, ZeRO-3 get_grad_norm_direct: each gradient (partition)
    # .to(get_norm_dtype()), fp64 on CUDA, and its norm
    # (ZeRO-1/2: the part of each in this rank's partition, ``averaged_gradients``)
    # (ZeRO-3: each parameter's partition, ceil(numel / world))
    groups = [[plan.part3(n) for n in g] for g in plan.groups]
    pieces = ([[inside for _, inside in plan.in_partition(i)] for i in range(len(plan.groups))] if plan.stage < 3
              else groups)
    for group in pieces:
        for numel in group:
            w.free(w.new(FP64 * numel, tag), FP64 * numel, tag)
    sizes = ([plan.partition(i) for i in range(len(plan.groups))] if plan.stage < 3
             else [n for g in groups for n in sub_groups(g, plan.sub_group_size)])
    for k, n in enumerate(sizes):
        flat = w.new(e * n, tag)
        fp32 = w.new(FP32 * n, tag)
        w.free(flat, e * n, tag)
        if partition is not None and k == len(sizes) - 1:
            w.free(partition[0], partition[1], (SIDE if plan.overlap else "") + tag)
        if first:
            w.new(FP32 * n, tag)  # exp_avg
            w.new(FP32 * n, tag)  # exp_avg_sq
        w.free(fp32, FP32 * n, tag)


def deepspeed_run(events: Sequence[Event], plan: DeepSpeedPlan) -> list[Event]:
    """The plain Trainer's whole run (``allocator_whole_run.whole_run_events``) rewritten into DeepSpeed's.

    Args:
        events: The plain run's events.
        plan: The DeepSpeed run (:func:`deepspeed_plan`).

    Returns:
        DeepSpeed's events: ``(-1, 0, EMPTY_CACHE)`` marks ``empty_cache()``, a region starting with :data:`SIDE`
        an allocation on a side stream; the engine's step of each training step is tagged ``optimizer`` (the last
        step) or ``optimizer_warmup``.

    Raises:
        DeepSpeedReplayError: The events lack a trainable parameter's storage or a step.
    """
    n_setup = next((k for k, ev in enumerate(events) if ev[2] != "setup"), len(events))
    setup = list(events[:n_setup])
    size = {s: n for s, n, _ in events if n > 0}
    matched = _trainable_storages(setup, plan)
    ends, grads = step_ends(events, n_setup)
    w = EventWriter(max((s for s, _, _ in events), default=0) + 1)
    w.out += setup
    owned = _cast(w, plan, matched, size)
    inserts: dict[int, list[Event]] = {}
    persistent: list[tuple[int, int]] = []
    if zero3.multi(plan):
        zero3.initialize(w, plan, zero3.all_storages(setup, plan, matched, owned, size))
        inserts = zero3.gathers(plan, events, n_setup, ends)
    else:
        _initialize(w, plan, owned, size)
    fresh: dict[int, int] = {}
    state, kept, passes = _Backward(plan), None, 0
    for k in range(n_setup, len(events) + 1):
        for s, n, t in inserts.get(k, ()):  # ZeRO-3 on more than one process: the parameter gathers
            if n > 0:
                fresh[s] = w.new(n, t)
            else:
                w.free(fresh.pop(s), -n, t)
        if k in ends:  # a backward ends: the engine's step at the accumulation boundary
            passes += 1
            state.epilogue(w, events[k - 1][2])
            if plan.accum > 1:
                kept = state.accumulate(w, kept, events[k - 1][2], passes % plan.accum == 0)
            if passes % plan.accum == 0:
                tag = "optimizer" if ends[-1] == k else "optimizer_warmup"
                _optimizer_step(w, plan, tag, passes == plan.accum, state.partition)
                if zero3.multi(plan):
                    persistent = zero3.post_step(w, plan, tag, persistent)
            state = _Backward(plan)
        if k == len(events):
            break
        s, n, t = events[k]
        if t.startswith("optimizer"):
            continue  # the torch optimizer's own step: DeepSpeed's replaces it
        if s in grads and n > 0:
            state.gradient(w, s, n, t)
        else:
            w.out.append((s, n, t))
    return without_dead_frees(w.out)


def step_ends(events: Sequence[Event], start: int) -> tuple[list[int], set[int]]:
    """Where each step's backward ends (the index the engine's step goes before) and the gradients: what a
    step's backward allocated that is alive there. Regions are the allocation's (a free carries the region its
    storage was allocated in), so a step is told by its allocations: backward's, then the next forward's.

    Raises:
        DeepSpeedReplayError: No step.
    """
    lasts: list[int] = []
    last = -1
    for k in range(start, len(events)):
        s, n, t = events[k]
        if n > 0 and t.startswith("backward") and not t.startswith("backward_s"):
            last = k
        elif n > 0 and t.startswith("forward") and not t.startswith("forward_h") and last >= 0:
            lasts.append(last)
            last = -1
    if last >= 0:
        lasts.append(last)
    if not lasts:
        raise DeepSpeedReplayError("no backward in the traced run")
    ends: list[int] = []
    grads: set[int] = set()
    live: dict[int, str] = {}
    k = start
    for last in lasts:
        while k <= last:
            s, n, t = events[k]
            if n > 0:
                live[s] = t
            else:
                live.pop(s, None)
            k += 1
        step_grads = {x for x, t in live.items() if t.startswith("backward") and not t.startswith("backward_s")}
        # the activations backward frees after its last allocation belong to it; a gradient's free is zero_grad
        while k < len(events) and events[k][1] <= 0 and events[k][0] not in step_grads \
                and not events[k][2].startswith(("optimizer", "zero_grad")):
            live.pop(events[k][0], None)
            k += 1
        ends.append(k)
        grads |= step_grads
    return ends, grads


def without_dead_frees(events: Sequence[Event]) -> list[Event]:
    """The plain run's later frees of storages DeepSpeed freed already (the parameters, the gradients)."""
    alive: set[int] = set()
    out: list[Event] = []
    for s, n, t in events:
        if t in (EMPTY_CACHE, RESET_PEAKS) or s == MARK:
            out.append((s, n, t))
        elif n > 0 or s in alive:
            out.append((s, n, t))
            if n > 0:
                alive.add(s)
            else:
                alive.discard(s)
    return out


def replay_default_stream(events: Sequence[Event], conf: AllocatorConf | None, seq_len: int) -> Any:
    """A rewritten run's events (DeepSpeed's, FSDP2's) replayed through the caching allocator, the default stream
    only (the side streams' pools are ``core/states/deepspeed_streams.py``'s / ``fsdp_streams.py``'s).

    Args:
        events: :func:`deepspeed_run`'s events.
        conf: The allocator settings.
        seq_len: The sequence length (for the result).

    Returns:
        ``allocator_replay.StepReplay``: ``persistent`` is what is allocated when the last step starts (the
        parameters, DeepSpeed's flat buffers, master and optimizer states).
    """
    from fitcheck.torch_adapters.allocator_replay import StepReplay

    alloc = CachingAllocator(conf)
    handles: dict[int, int] = {}
    persistent = -1
    for k, (s, n, t) in enumerate(events, 1):
        if t == EMPTY_CACHE:
            alloc.empty_cache()
            continue
        if t == RESET_PEAKS:
            alloc.reset_peak_stats()
            continue
        if t.startswith(SIDE):
            continue
        if persistent < 0 and t == "forward":
            persistent = alloc.stats.allocated
        if n > 0:
            handles[s] = k
            alloc.malloc(k, n)
        elif s in handles:
            alloc.free(handles.pop(s))
    st = alloc.stats
    transient = max(st.peak_allocated - max(persistent, 0), 1)
    return StepReplay(st.peak_allocated, st.peak_reserved, max(persistent, 0), transient,
                      (st.peak_reserved - st.peak_allocated) / transient, (seq_len,))


def live_bytes(events: Sequence[Event]) -> dict[str, int]:
    """Bytes alive (every stream) at the points a real engine can be read: after ``initialize``, after the
    first step's backward, after the first step, after the last step's backward (the tests' check).

    Args:
        events: :func:`deepspeed_run`'s events.

    Returns:
        ``{"initialize", "backward1", "step1", "backward"}`` -> bytes.
    """
    out: dict[str, int] = {}
    live, steps, in_step = 0, 0, False
    for k, (_s, n, t) in enumerate(events):
        step = t.removeprefix(SIDE).startswith("optimizer")
        if k and events[k - 1][2] in ("setup", EMPTY_CACHE) and t not in ("setup", EMPTY_CACHE):
            out["initialize"] = live
        if step and not in_step:
            steps += 1
            out["backward1" if steps == 1 else "backward"] = live
        if in_step and not step and steps == 1:
            out["step1"] = live
        in_step = step
        live += n
    return out


def replayed(spec: TrainingSpec) -> bool:
    """Whether the whole run of a DeepSpeed spec is replayed as DeepSpeed's (:func:`deepspeed_run`): ZeRO that
    :func:`not_replayed` accepts (the caller checks that the run is traced: ``pinned_path.traceable``)."""
    from fitcheck.spec import Strategy

    return spec.sharding.strategy is Strategy.DEEPSPEED and not not_replayed(spec)


def _key(spec: TrainingSpec) -> str:
    """What DeepSpeed's replay depends on beyond the activation trace's key (``pinned_path._cache_key``)."""
    hw = spec.hardware
    return f"|deepspeed {deepspeed_plan(spec)!r} {hw.expandable_segments} {hw.cuda_alloc_conf!r}"


def whole_run(path: Any, spec: TrainingSpec, key: str, required: bool = False) -> Any:
    """A ``PinnedPath``'s DeepSpeed whole run replayed (:func:`rewritten_run` with :func:`deepspeed_run`).

    Args:
        path: The ``pinned_path.PinnedPath`` (its traces and caches).
        spec: A spec :func:`replayed` accepts.
        key: The spec's activation-trace key (``pinned_path._cache_key``).
        required: Raise when the replay cannot run (``--reserved_replay`` asked for it) rather than return None.

    Returns:
        ``allocator_replay.StepReplay`` of DeepSpeed's default stream, or None (the reason kept in the path's
        ``_whole_failed``).
    """
    return rewritten_run(path, spec, key, _key(spec), "deepspeed-run",
                         lambda events: deepspeed_run(events, deepspeed_plan(spec)), required,
                         replayed_micro_batches(spec.batch.grad_accum))


def rewritten_run(path: Any, spec: TrainingSpec, key: str, extra: str, kind: str,
                  rewrite: Callable[[list[Event]], list[Event]], required: bool = False, passes: int = 1,
                  micro_batches: int = 1) -> Any:
    """A ``PinnedPath``'s plain whole run rewritten (DeepSpeed's, FSDP2's) and replayed, default stream only
    (:func:`replay_default_stream`), cached with its whole-run replays (the micro-batch excepted as theirs are),
    from the activation traces it has run for the spec (traced here when it has none).

    Args:
        path: The ``pinned_path.PinnedPath`` (its traces and caches).
        spec: The spec.
        key: The spec's activation-trace key (``pinned_path._cache_key``).
        extra: What the rewrite depends on beyond it (the replay is kept under ``key + extra``).
        kind: The on-disk cache's kind (``trace_cache.cached_replay``).
        rewrite: The plain run's events (``allocator_whole_run.whole_run_events``) -> the rewritten run's.
        required: Raise when the replay cannot run rather than return None.
        passes: Plain passes per step of the rewritten run (DeepSpeed's gradient accumulation: a micro-batch of
            the engine's is a plain step's pass, every ``.grad`` None again at its start).
        micro_batches: Passes per step of the plain run, the later ones adding into ``.grad`` (FSDP2's gradient
            accumulation: ``allocator_compose.whole_run``).

    Returns:
        ``allocator_replay.StepReplay``, or None (the reason kept in the path's ``_whole_failed`` under
        ``key + extra``).
    """
    from fitcheck.core.loading import allocator_conf
    from fitcheck.core.trainers import step_spec
    from fitcheck.torch_adapters.allocator_replay import STEADY_STEPS
    from fitcheck.torch_adapters.allocator_whole_run import whole_run_events
    from fitcheck.torch_adapters.trace_cache import cached_replay

    dkey = key + extra
    if dkey in path._whole:
        return path._whole[dkey]
    if dkey in path._whole_failed and not required:
        return None
    traces = path._traces.get(key)
    runs: Any = ()
    if traces is not None and traces.traced:
        runs = traces.traced.get(step_spec(spec).batch.micro_batch) or next(iter(traces.traced.values()))

    def compute() -> Any:
        events = whole_run_events(spec, runs, STEADY_STEPS * passes, optimizer_traces=path._optimizer_traces,
                                  micro_batches=micro_batches)
        return replay_default_stream(rewrite(events), allocator_conf(spec), spec.batch.seq_len)

    try:  # the on-disk trace cache keeps it for the next process (trace_cache.cached_replay)
        path._whole[dkey] = cached_replay(getattr(path, "cache", None), kind, spec, compute)
    except Exception as exc:  # the published gap answers, with the reason in the INFO
        if required:
            raise
        from fitcheck.errors import exception_line

        path._whole_failed[dkey] = exception_line(exc)
        return None
    return path._whole[dkey]


def published_gap_reason(path: Any, spec: TrainingSpec, key: str) -> str:
    """Why a traced DeepSpeed (or FSDP) answer keeps the published gap, for the ``reserved-published-gap`` INFO
    (``key``: the spec's ``pinned_path._cache_key``)."""
    from fitcheck.spec import Strategy

    if spec.sharding.strategy is not Strategy.DEEPSPEED:
        return "the whole-run replay composes the plain Trainer's run, not FSDP's module cast"
    missing = not_replayed(spec)
    if missing:
        return f"DeepSpeed's run is replayed except where it has {missing}, as this run does"
    failed = path._whole_failed.get(key + _key(spec))
    return f"DeepSpeed's run could not be replayed ({failed})" if failed else "DeepSpeed's run was not replayed"
