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
(``allocator_deepen``); :func:`replay_whole_run`, what the default path runs for a traced answer, from the
one-step activation traces it has already run and the optimizer traced alone (``allocator_compose``), 0.2-0.8 s.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fitcheck.core.caching import AllocatorConf, CachingAllocator
from fitcheck.core.loading import allocator_conf
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches
from fitcheck.torch_adapters.tracer_trl_plans import DpoPlan, GrpoPlan, KtoPlan


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


def replay_whole_lengths(spec: TrainingSpec, seq_lengths: Sequence[int],
                         optimizer_traces: dict[str, Any] | None = None) -> tuple[StepReplay, StepReplay]:
    """The run's steps at ``seq_lengths`` (one step per padded length, in order), every layer and the optimizer.

    What a dataloader that pads each batch to its longest row runs, and what ``benchmarks/gpu_truth_step.py``
    runs for a row with ``lengths``: the first step creates the optimizer's states, each later step starts from
    the blocks the earlier ones left cached. Each length's run is composed and deepened as in
    :func:`replay_whole_run`, with its accumulation passes (the first as one step, the others as a warm-up step and
    the measured one, of which only the measured one is replayed: :func:`replay_events`). Two layer groups do not
    carry to the full depth (the module docstring; on the H200's Llama-3.2-1B rows the two-group replay of these
    lengths was +5 % .. +20 % over ``max_memory_reserved``), so the whole depth is replayed.

    Args:
        spec: The training spec (a plain Trainer step: ``pinned_path.traceable``).
        seq_lengths: Padded lengths of successive steps.
        optimizer_traces: A cache of optimizer traces shared between calls.

    Returns:
        (the sequence's replay, the longest length's step after the earlier steps' cached blocks were returned
        (``release_cached_blocks``, what a failed ``cudaMalloc`` runs before its retry): its peaks alone). In
        both ``persistent`` is what the first step leaves allocated (parameters and optimizer states), so
        ``gap_fraction`` is over the bytes a step allocates and frees, as the estimate's transient components
        count them.

    Raises:
        ComposeError, DeepenError: The traces do not compose or deepen (the caller falls back).
    """
    cache = {} if optimizer_traces is None else optimizer_traces
    runs: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    traces = []
    micro = replayed_micro_batches(spec.batch.grad_accum)  # each step's passes, as replay_whole_run composes them
    for k, n in enumerate(seq_lengths):
        key = (n, 1 if k == 0 else 2)
        if key not in runs:
            runs[key] = _whole_run_events(spec, (), key[1], cache, seq_len=n, micro_batches=micro)
        traces.append(runs[key])
    conf = allocator_conf(spec)
    at = list(seq_lengths).index(max(seq_lengths))
    return (replay_events(traces, conf, tuple(seq_lengths), persistent_after_first=True),
            replay_events(traces[:at + 1], conf, tuple(seq_lengths[:at + 1]), persistent_after_first=True,
                          release_before=at))


def replay_whole_run(spec: TrainingSpec, step_runs: Sequence[Any] = (), steps: int = STEADY_STEPS,
                     optimizer_traces: dict[str, Any] | None = None) -> StepReplay:
    """:func:`replay_steady_state` from the one-step activation traces the answer has already run.

    The forward and backward of every step are those of the spec's step traced without an optimizer at the depths
    of ``tracer_depth.depth_plan`` (``PinnedPath``'s activation traces: ``step_runs``); only the optimizer's steps are
    traced here (``tracer_optimizer.trace_optimizer``: no forward, no backward). The steps are composed
    (``allocator_compose.whole_run``: ``gradient_accumulation_steps`` passes per step, the later ones adding into
    ``.grad``) at each depth, deepened to the full depth (``allocator_deepen.deepen``) and replayed. Equal to the
    full-depth three-step trace's replay on every H100 row of
    ``benchmarks/data/reserved_replay_nvidia_h100_80gb_hbm3.json`` (``benchmarks/reserved_replay.py --check``).

    Args:
        spec: The training spec (a plain Trainer step: ``pinned_path.traceable``).
        step_runs: ``tracer.trace_step(optimizer=None, steps=1)`` results at the depths of ``depth_plan``, or
            empty to trace them here.
        steps: Steps in the run (the last is the measured one).
        optimizer_traces: A cache of optimizer traces (they depend on the model, the depth, the adapters and
            the optimizer, not on the sequence, micro-batch or checkpointing), shared between calls.

    Returns:
        The replay's peaks over all steps.

    Raises:
        ComposeError, DeepenError: The traces do not compose or deepen (the caller falls back).
    """
    events = _whole_run_events(spec, step_runs, steps, optimizer_traces,
                               micro_batches=replayed_micro_batches(spec.batch.grad_accum))
    return replay_events([events], allocator_conf(spec), (spec.batch.seq_len,))


def whole_run_events(spec: TrainingSpec, step_runs: Sequence[Any] = (), steps: int = STEADY_STEPS,
                     optimizer_traces: dict[str, Any] | None = None, micro_batches: int = 1,
                     ) -> list[tuple[int, int, str]]:
    """The allocation events :func:`replay_whole_run` replays: the whole run at the full depth, composed from the
    one-step activation traces and the optimizer traced alone (``benchmarks/deepspeed_reserved_replay.py`` rewrites
    them into DeepSpeed's run).

    Args:
        spec: The training spec (a plain Trainer step: ``pinned_path.traceable``).
        step_runs: ``tracer.trace_step(optimizer=None, steps=1)`` results at the depths of ``depth_plan``, or
            empty to trace them here.
        steps: Steps in the run (the last is the measured one).
        optimizer_traces: A cache of optimizer traces, shared between calls.
        micro_batches: Forward and backward passes per step, the later ones adding into ``.grad``
            (``allocator_compose.whole_run``; the FSDP2 rewrite's gradient accumulation).

    Returns:
        ``(storage serial, +bytes allocated / -bytes freed, region allocated in)`` for every event of the run.

    Raises:
        ComposeError, DeepenError: The traces do not compose or deepen (the caller falls back).
    """
    return _whole_run_events(spec, step_runs, steps, optimizer_traces, micro_batches=micro_batches)


def _whole_run_events(spec: TrainingSpec, step_runs: Sequence[Any], steps: int,
                      optimizer_traces: dict[str, Any] | None, seq_len: int | None = None,
                      micro_batches: int = 1) -> list[tuple[int, int, str]]:
    """The events of :func:`replay_whole_run` (at ``seq_len`` when given, else the spec's length; ``micro_batches``
    forward and backward passes per optimizer step: ``allocator_compose.whole_run``)."""
    from fitcheck.torch_adapters.allocator_compose import whole_run
    from fitcheck.torch_adapters.allocator_deepen import DeepenError, deepen_past_first
    from fitcheck.torch_adapters.step_traces import one_step_traces
    from fitcheck.torch_adapters.tracer import trace_step
    from fitcheck.torch_adapters.tracer_build import config_layers, layer_group
    from fitcheck.torch_adapters.tracer_depth import depth_plan, residual_promoted
    from fitcheck.torch_adapters.tracer_optimizer import trace_optimizer

    config = spec.model.config
    kwargs = run_trace_kwargs(spec)
    if "trl_head" in kwargs:  # the answer's activation traces ran the plain head (count_logits=False): not this step
        step_runs = ()
    generating = None  # GRPO: the passes that generate run the log-prob pre-pass (tracer_grpo)
    if "trl_grpo" in kwargs:
        from fitcheck.torch_adapters.tracer_grpo import generating_passes

        generating = generating_passes(spec.batch.grad_accum, kwargs["trl_grpo"].steps_per_generation)
    if seq_len is not None:
        kwargs["seq_len"] = seq_len
    promoted = residual_promoted(kwargs)  # layer 0 reads another dtype: two and three groups, as BatchTraces
    plan = depth_plan(config, spec.freeze, promoted)
    if len(plan) == 2 and config_layers(config) % layer_group(config):
        raise DeepenError(f"{config_layers(config)} layers are not whole {layer_group(config)}-layer groups")
    cache = {} if optimizer_traces is None else optimizer_traces
    one_step = {**kwargs, "optimizer": None, "steps": 1}
    if len(step_runs) != len(plan):  # kept per path, or interpolated from two micro-batches (step_traces)
        step_runs = one_step_traces(cache, config, plan, one_step)
    runs = dict(zip(plan, step_runs, strict=True))  # BatchTraces' plan: the same depth_plan and residual_promoted

    def composed(depth: int) -> tuple[list[tuple[int, int, str]], tuple[int, ...]]:
        """The whole run at ``depth`` layers: its one-step trace (the caller's, else traced now) and the optimizer's."""
        run = runs.get(depth) or trace_step(config, num_layers=depth, **one_step)
        opt_kwargs = {k: v for k, v in kwargs.items() if k not in ("seq_len", "micro_batch", "checkpointing",
                                                                   "every_n_layers", "use_reentrant", "image_tokens",
                                                                   "cublas_workspaces")}
        key = repr((spec.model.model_id, spec.model.shape, depth, steps, sorted(opt_kwargs.items())))
        if key not in cache:
            cache[key] = trace_optimizer(config, num_layers=depth, steps=steps, **opt_kwargs)
        opt_events, opt_starts = cache[key]
        return whole_run(run.alloc_events, run.region_starts, opt_events, opt_starts, steps, micro_batches,
                         getattr(run, "accumulated_after", ()), generating)

    if len(plan) == 1:
        return load_warmup(spec) + list(composed(plan[0])[0])
    group = layer_group(config)
    deep = deepen_past_first(lambda groups: composed(groups * group), config_layers(config) // group, promoted)
    return load_warmup(spec) + list(deep)


def run_trace_kwargs(spec: TrainingSpec) -> dict[str, Any]:
    """The ``tracer.trace_step`` arguments of the step the whole run repeats: the plain Trainer's
    (``trace_arguments.trace_kwargs``), or TRL's SFTTrainer / DPOTrainer / KTOTrainer step (``tracer_trl`` /
    ``tracer_dpo`` / ``tracer_kto``: its model preparation and fused LM head, ``trl_head`` the outputs it patches the
    model with; DPO's reference and prompt, ``trl_dpo``; KTO's, its KL batch and desirable rows, ``trl_kto``), or
    GRPOTrainer's micro-step with its log-prob pre-pass (``trl_grpo``: ``tracer_grpo``), or RewardTrainer's
    sequence-classification step (the registry's ``classifier``: the seq-cls task, as
    ``trace_arguments.activation_trace_kwargs``) at the shape it runs (``core.trainers.step_spec``: DPO's and the reward
    trainer's chosen + rejected rows, GRPO's prompt + completion)."""
    from fitcheck.core.trainers import step_spec, trainer_row
    from fitcheck.torch_adapters.trace_arguments import trace_kwargs

    t = spec.trainer
    row = trainer_row(t.kind)
    if row.classifier:  # the reward trainer: the seq-cls model on chosen + rejected rows (as activation_trace_kwargs)
        return {**trace_kwargs(step_spec(spec)), "task": "seq-cls"}
    if row.replay_step is None or row.fused_head is None:  # the registry's column: SFT's, DPO's, KTO's, GRPO's
        return trace_kwargs(spec)
    kwargs = {**trace_kwargs(step_spec(spec)), "trl_head": row.fused_head}
    if row.replay_step == "tracer_grpo":
        plan = _grpo_plan(spec)
        return {**kwargs, "trl_grpo": plan} if plan else trace_kwargs(spec)
    if row.replay_step in ("tracer_dpo", "tracer_kto"):
        from fitcheck.spec import Strategy
        from fitcheck.torch_adapters.tracer_dpo import dpo_reference

        if spec.sharding.strategy in (Strategy.DEEPSPEED, Strategy.FSDP):
            # the reference copy is prepare_deepspeed's / prepare_fsdp's there, which no rewrite describes
            # (run_scope.not_replayed): the rewrites keep the plain step they composed before
            return trace_kwargs(spec)

        reference = dpo_reference(spec.lora is not None, t.precompute_ref_log_probs)
        # the copy is loaded like the policy (create_model_from_path: device_map "auto" on a GPU), so its
        # from_pretrained runs caching_allocator_warmup too: the block of load_warmup, at the same size
        warm = load_warmup(spec)
        block = warm[0][1] if warm else 0
        if row.replay_step == "tracer_dpo":
            kwargs["trl_dpo"] = DpoPlan(reference, t.prompt_length, t.rpo_alpha, block)
        else:
            from fitcheck.core.trainers import calculates_kl
            from fitcheck.torch_adapters.tracer_kto import desirable_rows

            rows = kwargs["micro_batch"]
            kwargs["trl_kto"] = KtoPlan(reference, t.prompt_length, calculates_kl(t.loss_type), block,
                                        desirable_rows(rows))
    return kwargs


def _grpo_plan(spec: TrainingSpec) -> GrpoPlan | None:
    """``trace_step``'s ``trl_grpo`` for a GRPO run (``tracer_grpo.prepare_grpo``'s plan); None under DeepSpeed/FSDP,
    as DPO's (the reference copy is ``prepare_deepspeed``'s / ``prepare_fsdp``'s there: the plain step is kept)."""
    from fitcheck.core.trainers import grpo_steps_per_generation, has_reference_copy
    from fitcheck.spec import Strategy
    from fitcheck.torch_adapters.tracer_dpo import ADAPTERS_OFF, MODEL_REF
    from fitcheck.torch_adapters.tracer_grpo import NO_REF, old_policy_pass

    if spec.sharding.strategy in (Strategy.DEEPSPEED, Strategy.FSDP):
        return None
    t = spec.trainer
    accum = spec.batch.grad_accum
    chunks = grpo_steps_per_generation(spec)
    warm = load_warmup(spec)  # the copy's from_pretrained runs caching_allocator_warmup too (as DPO's)
    # GRPOTrainer.__init__'s reference block: none with beta 0, else the registry's rule (a copy, or adapters off)
    reference = NO_REF if t.beta == 0.0 else (MODEL_REF if has_reference_copy(spec) else ADAPTERS_OFF)
    return GrpoPlan(reference, t.prompt_length, t.beta, chunks, old_policy_pass(accum, chunks),
                    warm[0][1] if warm else 0, accum)


def load_warmup(spec: TrainingSpec) -> list[tuple[int, int, str]]:
    """``caching_allocator_warmup``'s block, allocated and freed before the parameters, as ``from_pretrained`` runs
    it (``core.loading.load_events``: transformers 5.23 ``modeling_utils.py``): the parameters are then carved out
    of one segment (best fit, split) instead of each taking a segment of its own rounded to 2 MiB. Without it the
    replay of Phi-2's step (bf16, 128 attention weights of 12.5 MiB in 14 MiB segments) started 190 MiB above the
    5304 MiB the H200 measured after loading, and Qwen2.5-0.5B's 36 MiB above (``gpu_truth_nvidia_h200.json``,
    ``load_end_reserved``).

    None where the load phase is not one device's ``from_pretrained`` (``loads_on_one_device``: FSDP, DeepSpeed,
    tp/cp/sp), under ``max_split_size_mb``, where the block stays cached beside the step's segments and the load
    phase adds it (``LoadPhase.oversize_cached``, ``run_reserved``), and for a base quantized on load, whose
    16-bit copies are materialised and freed inside the block (``core.loading.load_events``), which the trace's
    setup (the packed weights only) does not describe: on the H100's Llama-3.2-1B QLoRA row
    (``gpu_truth_nvidia_h100_80gb_hbm3.json``) the block alone moved reserved from -0.55 % to -1.46 %, the load's
    own events replayed first to -1.35 %.

    Args:
        spec: The training spec.

    Returns:
        ``(serial, +bytes / -bytes, "setup")`` events to put before the trace's own.
    """
    from fitcheck.core.loading import load_events, loads_on_one_device

    if not loads_on_one_device(spec) or allocator_conf(spec).max_split_size is not None or spec.quant is not None:
        return []
    warm = next((e.nbytes for e in load_events(spec, spec.hardware.gpu_memory_bytes)
                 if e.kind == "alloc" and e.what == "caching_allocator_warmup"), 0)
    return [(-1, warm, "setup"), (-1, -warm, "setup")] if warm else []


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
