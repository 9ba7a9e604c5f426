"""The whole run -- every layer, the optimizer, three steps -- composed from the one-step activation traces an
answer has already run and the optimizer traced alone (``allocator_compose``), deepened to the full depth
(``allocator_deepen``), and replayed through the caching allocator (:func:`.allocator_replay.replay_events`).

:func:`whole_run_events` is the event sequence (the DeepSpeed / FSDP rewrites start from it),
:func:`replay_whole_run` its replay (what the default path runs for a traced answer, 0.2-0.8 s),
:func:`replay_whole_lengths` one such step per padded length (``--seq_lengths``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fitcheck.core.loading import allocator_conf
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches
from fitcheck.torch_adapters.allocator_replay import STEADY_STEPS, StepReplay, replay_events
from fitcheck.torch_adapters.replay_step_args import load_warmup, run_trace_kwargs


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
