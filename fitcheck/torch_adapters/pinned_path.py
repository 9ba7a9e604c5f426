"""One path for every number of a run: checked formula, or a fake-tensor trace; never a silent extrapolation.

``PinnedPath`` decides, per spec, where the activation components come from; ``following(headline)`` is the
``estimate_fn`` that ``max_micro_batch`` and the advisor get, so the largest micro-batch and each suggestion are
computed the way the headline number was (traced, or from the formulas):

- ``always`` (``--trace``): a fake-tensor trace of the real model (``tracer_depth.trace_components``);
- ``auto`` (default): the formulas inside the checked envelope (``fitcheck.core.activations.envelope``); outside it a
  trace when torch and transformers are installed, else the formulas with a ``not-pinned`` WARNING;
- ``never`` (``--no_trace``): the formulas, with the WARNING outside the envelope.

A trace that cannot run (an 8-bit base, remote code) falls back to the formulas with an INFO saying why; runs
the tracer does not describe (Liger, fused/TRL losses, activation offloading, DeepSpeed, FSDP's module cast,
tp/cp/sp layouts, GPTQ/AWQ/FP8 bases, vision-language models: ``--trace`` feeds Qwen2.5-VL images) are never
auto-traced.
Traces are cached per activation-relevant part of the spec, the micro-batch excepted: the optimizer, sharding,
offload of states and accumulation reuse them, and every micro-batch after the first two of a kind of step is
interpolated from their traces (``trace_batch``: sizes are affine in the micro-batch). A trace that cannot run
(any exception) never fails the answer outside ``--trace``: the formulas answer, with the reason as a finding.
A formula answer's published reserved gap is replaced by the whole run replayed (``verdict_replay``) for the
headline wherever the replay describes the run (the plain Trainer's, TRL's SFT/DPO/KTO/GRPO), and near the budget.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fitcheck.report import Component, Report
from fitcheck.spec import Strategy, TrainingSpec
from fitcheck.torch_adapters.path_findings import (
    accumulation_unpinned,
    gap_note,
    generation_trace_failed,
    lengths_replayed,
    not_pinned_with_torch,
    path_findings_lost,
    trace_failed,
    two_groups,
    whole_run_replayed,
)
from fitcheck.torch_adapters.run_scope import (
    accumulates_in_grad,
    gradients_resident,
    plain_replay_is_rank_run,
    plain_trainer_run,
    replayed_run,
    traceable,
    untraced_parts,
)
from fitcheck.torch_adapters.verdict_replay import NearBudget

if TYPE_CHECKING:
    from fitcheck.core import ReplayedGap

MODES = ("auto", "always", "never")
_FORMULAS_KEPT = 32  # formula answers a path keeps (PinnedPath._formula): a search asks ~2 log2(answer) specs


def torch_available() -> bool:
    """Whether torch and transformers can be imported (without importing them)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _cache_key(spec: TrainingSpec) -> str:
    """What the activations of a trace depend on, the micro-batch excepted (``trace_batch.BatchTraces`` answers
    every micro-batch of one key): the model, the sequence length, precision, attention, checkpointing,
    adapters, quantization, freeze, task. Not the optimizer, the sharding, offload of states or accumulation: an
    accumulating step's components come from the same traces (``BatchTraces.result(accumulating=)``), and the
    on-disk cache keeps them apart (``_trace``)."""
    from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs

    kwargs = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "micro_batch"}
    return repr((spec.model.model_id, spec.model.shape, sorted(kwargs.items())))


class PinnedPath:
    """Chooses formula or trace per spec, and estimates with it (an ``EstimateFn``)."""

    def __init__(self, mode: str = "auto", *, can_trace: bool | None = None, strict: bool | None = None,
                 seq_lengths: tuple[int, ...] = (), reserved_replay: bool = False, cache: Any = None) -> None:
        """Args:
        mode: ``auto``, ``always`` or ``never``.
        can_trace: Whether tracing is possible (default: torch and transformers importable).
        strict: Whether a trace that cannot run is an error (default: only for ``always``, the user's
            ``--trace``); otherwise the formulas answer with the reason.
        seq_lengths: ``--seq_lengths``: padded lengths of successive steps; when given, the allocator's gap is
            replayed over them (``allocator_replay.replay_step``) whichever path gives the activations.
        reserved_replay: ``--reserved_replay``: the first spec asked (the headline) gets the allocator's gap from
            its whole run replayed (every layer, the optimizer, warm-up steps) even where the default path does
            not replay it (a headline from the checked formulas, or a run the tracer does not describe as the
            plain Trainer step), not the published 11 %. Every traced spec gets the whole run's gap without it
            (``_traced_gap``).
        cache: A ``trace_cache.TraceCache`` that keeps traces and replays across processes (None: this one only).
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.strict = mode == "always" if strict is None else strict
        self.can_trace = torch_available() if can_trace is None else can_trace
        self._traces: dict[str, Any] = {}  # cache key -> trace_batch.BatchTraces
        self._failed: dict[str, str] = {}  # cache key -> why its trace could not run
        self._generate: Any = None  # tracer_generate.GenerationTraces: GRPO's generate traced
        self.traced_answers = 0
        self._gaps: dict[str, float] = {}  # cache key -> the traced step's allocator gap (allocator_replay)
        self.seq_lengths = seq_lengths
        self._length_gaps: dict[str, Any] = {}  # cache key -> allocator_replay.StepReplay over seq_lengths
        self._headline_replay: Any = None  # the first spec's replay: what following() paths reuse
        self.reserved_replay = reserved_replay
        self.whole_run_replay: Any = None  # --reserved_replay: the headline's allocator_replay.StepReplay
        self._whole: dict[str, Any] = {}  # cache key -> the whole run replayed (allocator_whole_run.replay_whole_run)
        self._whole_failed: dict[str, str] = {}  # cache key -> why the whole run could not be replayed
        self._optimizer_traces: dict[str, Any] = {}  # tracer_optimizer traces, shared by every replay
        self._replay_owner: dict[int, str] = {}  # id of a whole-run replay -> repr of the spec it replayed
        self.cache = cache
        self._formulas: list[tuple[TrainingSpec, Report]] = []  # the last _FORMULAS_KEPT formula answers
        self.near_budget = NearBudget.for_path(mode, self.can_trace)  # near the budget: replay (verdict_replay)

    def wants_trace(self, spec: TrainingSpec) -> bool:
        """Whether this spec's activations should come from a trace."""
        if self.mode == "always":
            return True
        if self.mode == "never" or not self.can_trace or not traceable(spec):
            return False
        # in auto mode __call__ first asks the formula: a trace runs when its answer is not pinned (outside the
        # envelope, or a "not modelled" note of its own)
        return bool(spec.model.config)

    def activations(self, spec: TrainingSpec) -> tuple[tuple[Component, ...] | None, str]:
        """(traced components or None for the formulas, why a wanted trace could not run or '')."""
        if not self.wants_trace(spec):
            return None, ""
        parts = untraced_parts(spec) if self.strict else ()
        if parts:  # the user's --trace of a run the tracer does not describe (traceable() keeps auto off them)
            from fitcheck.errors import ConfigError

            raise ConfigError(f"--trace: the tracer runs the plain Trainer step and does not describe "
                              f"{', '.join(parts)}; the formulas model this run: drop --trace")
        key = _cache_key(spec)
        if key in self._failed:
            return None, self._failed[key]
        try:
            return self._trace(key, spec), ""
        except Exception as exc:  # a trace that cannot run never breaks the answer: the formulas do
            if self.strict:
                raise
            self._failed[key] = _reason(exc)
            return None, self._failed[key]

    def gap_fraction(self, spec: TrainingSpec) -> float | None:
        """The fraction of :meth:`replayed_gap` (None: the published fraction)."""
        gap = self.replayed_gap(spec)
        return None if gap is None else gap.fraction

    def replayed_gap(self, spec: TrainingSpec) -> ReplayedGap | None:
        """What the traced run's replay gives the estimate (None: the published fraction of ``core/allocator.py``):
        not traced, or a run neither the replay describes (``run_scope.replayed_run``) nor rewritten into DeepSpeed's,
        FSDP2's or FSDP1's own (``fsdp2_run_events.rewrite_for``), where the traced step's replay would leave out its
        buffers, optimizer and side streams (FSDP1 on the H100 rows, before its rewrite: the two-group replay moved
        reserved from -5.0 % to -3.2 %, ``benchmarks/fsdp_gpu.py --rescore``). Its bytes where the replay is this
        run's own, whole: :meth:`_measured`."""
        rewrite = _rewrite_for(spec)
        if self.wants_trace(spec) and rewrite is not None and _gap_applies(spec, self.seq_lengths):
            replay = rewrite.whole_run(self, spec, _cache_key(spec))  # None: the published gap, with why
            return None if replay is None else self._measured(spec, replay, True)  # the rank's default stream
        key = _cache_key(spec)
        if not self.wants_trace(spec) or not replayed_run(spec) or key not in self._gaps:
            return None
        whole = self._whole.get(key)
        if whole is not None and whole.gap_fraction == self._gaps[key]:  # the whole run replayed, not two groups
            return self._measured(spec, whole, plain_replay_is_rank_run(spec))
        from fitcheck.core import ReplayedGap

        return ReplayedGap(self._gaps[key])

    def _measured(self, spec: TrainingSpec, replay: Any, own_run: bool) -> ReplayedGap:
        """``replay.measured``, its bytes for the spec it replayed only: a path replays once per kind of step
        (``_cache_key``: not per micro-batch, optimizer or sharding), built from the first asker's traces or keyed
        by its whole spec in the on-disk cache; later specs reuse the fraction."""
        owner = self._replay_owner.setdefault(id(replay), repr(spec))
        return replay.measured(own_run and owner == repr(spec))  # type: ignore[no-any-return]

    def _trace(self, key: str, spec: TrainingSpec) -> tuple[Component, ...]:
        import warnings

        from fitcheck.core.trainers import step_spec
        from fitcheck.errors import UnsupportedModelError
        from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs
        from fitcheck.torch_adapters.trace_batch import BatchTraces
        from fitcheck.torch_adapters.trace_cache import cached_gap, cached_trace
        from fitcheck.torch_adapters.trace_result import components_from_trace

        if not spec.model.config:
            raise UnsupportedModelError(f"{spec.model.model_id}: no config.json mapping to trace")
        micro = step_spec(spec).batch.micro_batch  # a TRL policy step runs its own rows (DPO: chosen + rejected)

        def traces() -> BatchTraces:  # built on a miss only: a cache hit imports no torch
            if key not in self._traces:
                self._traces[key] = BatchTraces(spec.model.config, activation_trace_kwargs(spec),
                                                shared=self._optimizer_traces)
            built: BatchTraces = self._traces[key]
            return built

        def gap() -> float:  # the first answer of a kind of step is traced (a fresh BatchTraces) or a cache hit
            deepest = result.alloc_events or traces().result(micro).alloc_events
            return self._traced_gap(key, spec, self._traces[key].traced.get(micro, ()), deepest)

        with warnings.catch_warnings():  # transformers' deprecation notices while building the model are noise
            warnings.simplefilter("ignore", FutureWarning)
            # a later micro-step of an accumulation window holds each new gradient beside its .grad
            # (trace_result.accumulating_step): its own entry in the on-disk cache, the traces kept shared
            accumulating = accumulates_in_grad(spec)
            # ZeRO-3: every gradient held from the start of backward (trace_result.resident_gradients_step)
            resident = gradients_resident(spec)
            view = " accumulating" if accumulating else " resident" if resident else ""
            result = cached_trace(self.cache, key + view, spec.model.config, micro,
                                  lambda: traces().result(micro, accumulating, resident))
            if key not in self._gaps:
                self._gaps[key] = cached_gap(self.cache, key, spec, self.seq_lengths, gap, self._whole,
                                             self._whole_failed)
        self.traced_answers += 1
        return (*components_from_trace(result), *self._generation(key, spec))

    def _generation(self, key: str, spec: TrainingSpec) -> tuple[Component, ...]:
        """GRPO's ``generate`` traced (``tracer_generate``); one that cannot run leaves the formula's phase, with
        the reason kept for a ``generation-trace-failed`` finding."""
        from fitcheck.torch_adapters.tracer_generate import GenerationTraces

        if self._generate is None:
            self._generate = GenerationTraces(self.cache)
        try:
            return self._generate.components(spec)  # type: ignore[no-any-return]
        except Exception as exc:
            self._failed["generation " + key] = _reason(exc)
            return ()

    def _traced_gap(self, key: str, spec: TrainingSpec, runs: Any, deepest: Any) -> float:
        """The allocator's gap of a traced step: its whole run replayed (every layer, the optimizer, three steps:
        ``allocator_whole_run.replay_whole_run``, from the activation traces ``runs`` just run), or where that cannot
        run (a run the tracer does not describe as the plain Trainer step, traces that do not compose or deepen)
        the deepest trace's step replayed alone (two layer groups: ``deepest``), with the reason kept. Where the gap
        does not enter the number (CPU, ``--seq_lengths``' own replay) the cheap one."""
        from fitcheck.core.loading import allocator_conf
        from fitcheck.torch_adapters.allocator_replay import replay_events, replay_step
        from fitcheck.torch_adapters.allocator_whole_run import replay_whole_run

        if _gap_applies(spec, self.seq_lengths) and replayed_run(spec):
            try:
                self._whole[key] = replay_whole_run(spec, runs, optimizer_traces=self._optimizer_traces)
                return float(self._whole[key].gap_fraction)
            except Exception as exc:  # the two-group gap answers, with the reason as a finding
                self._whole_failed[key] = _reason(exc)
            if not plain_trainer_run(spec):  # TRL's SFT step: ``deepest`` ran the plain LM head (count_logits)
                return replay_step(spec).gap_fraction
        return replay_events([deepest], allocator_conf(spec)).gap_fraction

    def _adapter_built(self, spec: TrainingSpec) -> TrainingSpec:
        """A non-LoRA PEFT adapter's tensors built from the real peft model (``peft_adapters``) where this path
        traces; elsewhere (``--no_trace``, no torch) the spec is left as it is and the core refuses it
        (``core/states/peft_adapter.py``). An adapter peft cannot build is refused with peft's reason: the
        formulas have no answer to fall back to."""
        if spec.peft is None or spec.peft.tensors or self.mode == "never" or not self.can_trace:
            return spec
        from fitcheck.errors import NotModelledError
        from fitcheck.torch_adapters.peft_adapters import with_adapter_inventory

        try:
            return with_adapter_inventory(spec)
        except Exception as exc:
            raise NotModelledError(f"{spec.peft.source}:peft_type: peft could not build the {spec.peft.peft_type} "
                                   f"adapter on this model ({_reason(exc)}); fix the adapter config") from None

    def following(self, headline: Report) -> PinnedPath:
        """The path for the numbers around a headline (largest micro-batch, suggestions): traced when the
        headline was traced, the formulas when it came from the formulas (its findings say whether those were
        checked), so the verdict and the largest micro-batch never disagree. Traces are shared."""
        traced = any(c.name == "activations.traced" for c in headline.components)
        other = PinnedPath("always" if traced else "never", can_trace=self.can_trace, strict=False)
        for shared in ("_traces", "_failed", "_generate", "_gaps", "_whole", "_whole_failed", "_replay_owner",
                       "_optimizer_traces", "_formulas", "cache", "seq_lengths", "_length_gaps", "_headline_replay",
                       "near_budget"):  # the caches and the policy, one object each
            setattr(other, shared, getattr(self, shared))
        self.near_budget.headline = False  # what follows a headline is never one (verdict_replay.NearBudget.answer)
        return other

    def _with_lengths(self, spec: TrainingSpec, comps: tuple[Component, ...] | None) -> Report:
        """The estimate with the allocator gap of the ``seq_lengths`` replay.

        Above the GPU's memory, torch's allocator releases its unsplit cached segments and retries
        (``release_cached_blocks``, CUDACachingAllocator.cpp) before it raises: where the longest step replayed
        alone fits, that is the answer, and a finding says nvidia-smi will show the GPU nearly full.
        """
        from fitcheck.core import estimate

        sequence, alone = self.length_replay(spec)
        report = estimate(spec, activations=comps, gap_fraction=sequence.gap_fraction)
        released = None
        if report.device_used_bytes > report.budget_bytes:
            retry = estimate(spec, activations=comps, gap_fraction=alone.gap_fraction)
            if retry.device_used_bytes <= retry.budget_bytes:
                released, report = report, retry
        note = lengths_replayed(spec, sequence, alone, released)
        return dataclasses.replace(report, findings=(*report.findings, note))

    def length_replay(self, spec: TrainingSpec) -> Any:
        """The allocator replay of ``seq_lengths`` for a spec: (the sequence, the longest alone).

        The first spec asked (the headline) is replayed: its run at each length (capped at the spec's
        ``max_seq_length``) run through the caching allocator in order (:meth:`_lengths_replayed`). Later specs
        (the largest micro-batch, the advisor's suggestions) reuse the headline's gap fraction rather than
        replaying N more steps each.

        Raises:
            ConfigError: The replay cannot run (torch missing, a model the tracer cannot build).
        """
        if self._headline_replay is not None:
            return self._length_gaps.get(_cache_key(spec), self._headline_replay)
        from fitcheck.torch_adapters.trace_cache import cached_lengths

        lengths = tuple(min(n, spec.batch.seq_len) for n in self.seq_lengths)
        replay = self._replay_asked(
            lambda: cached_lengths(self.cache, spec, lengths, lambda: self._lengths_replayed(spec, lengths)),
            "--seq_lengths replays the traced step through the caching allocator and needs torch and transformers: "
            "install them, or drop --seq_lengths",
            "--seq_lengths: the step of this model could not be traced for the allocator replay ({}); drop "
            "--seq_lengths to use the published 11 % gap")
        self._length_gaps[_cache_key(spec)] = self._headline_replay = replay
        return replay

    def _lengths_replayed(self, spec: TrainingSpec, lengths: tuple[int, ...]) -> Any:
        """The steps of ``lengths`` replayed at the full depth with the optimizer (``replay_whole_lengths``) where
        the run is the plain Trainer's and its traces compose and deepen, else each length's step at two layer
        groups (``replay_lengths``)."""
        from fitcheck.torch_adapters.allocator_compose import ComposeError
        from fitcheck.torch_adapters.allocator_deepen import DeepenError
        from fitcheck.torch_adapters.allocator_replay import replay_lengths
        from fitcheck.torch_adapters.allocator_whole_run import replay_whole_lengths

        if replayed_run(spec):
            try:
                return replay_whole_lengths(spec, lengths, optimizer_traces=self._optimizer_traces)
            except (ComposeError, DeepenError):
                pass
        return replay_lengths(spec, lengths)

    def _replay_asked(self, replay: Callable[[], Any], no_torch: str, failed: str) -> Any:
        """An allocator replay a flag asked for: torch missing (``no_torch``) or a trace that cannot run
        (``failed``, its ``{}`` the reason) is a ``ConfigError`` naming the flag, never a silent fallback."""
        import warnings

        from fitcheck.errors import ConfigError

        if not self.can_trace:
            raise ConfigError(no_torch)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                return replay()
        except Exception as exc:
            raise ConfigError(failed.format(_reason(exc))) from None

    def __call__(self, spec: TrainingSpec) -> Report:
        """Estimate a spec on this path (the ``estimate_fn`` of the batch search and the advisor)."""
        spec = self._adapter_built(spec)
        report = self._answer(spec)
        if self.reserved_replay and self.whole_run_replay is None:
            self.near_budget.headline = False  # the flag's replay answers the headline
            return self._with_whole_run_replay(spec, report)
        return self.near_budget.answer(spec, report, replayed_run, self.seq_lengths, self._optimizer_traces,
                                       self.cache)

    def _with_whole_run_replay(self, spec: TrainingSpec, report: Report) -> Report:
        """The headline with the allocator gap of its whole run replayed (``--reserved_replay``).

        A traced headline already has it (``_traced_gap``); the flag forces it where the default does not
        replay: a headline the checked formulas answer (its step is traced for the replay only), a run the tracer
        does not describe as the plain Trainer step (its plain step replayed, ``replay_deepened``). Two layer
        groups replayed do not scale to the full depth: on the H100 rows of
        ``benchmarks/data/reserved_replay_nvidia_h100_80gb_hbm3.json`` the two-group gap is -12 % .. +13 % off the
        measured ``max_memory_reserved`` and the whole run replayed -0.7 % .. -0.1 %. Raises ``ConfigError`` when
        the run cannot be traced (the flag asked for it).
        """
        from fitcheck.core import estimate

        self.whole_run_replay = replay = self._replay_asked(
            lambda: self._whole_run(spec),
            "--reserved_replay traces the whole run and needs torch and transformers: install them, or drop "
            "--reserved_replay",
            "--reserved_replay: this run could not be traced for the allocator ({}); drop --reserved_replay")
        traced = any(c.name == "activations.traced" for c in report.components)
        comps = self.activations(spec)[0] if traced else None
        rank_run = (traceable(spec) and _rewrite_for(spec) is not None) or plain_replay_is_rank_run(spec)
        again = estimate(spec, activations=comps, replayed=self._measured(spec, replay, rank_run))
        note = whole_run_replayed(spec, replay, report)
        again = dataclasses.replace(again, findings=(*again.findings, *path_findings_lost(report, again), note))
        return accumulation_unpinned(again)

    def _whole_run(self, spec: TrainingSpec) -> Any:
        """The spec's whole run replayed: the traced headline's, else the cache's, else replayed now."""
        from fitcheck.torch_adapters.trace_cache import cached_replay

        key = _cache_key(spec)
        rewrite = _rewrite_for(spec)
        if traceable(spec) and rewrite is not None:  # DeepSpeed's, FSDP2's or FSDP1's run, not the plain Trainer's
            return rewrite.whole_run(self, spec, key, required=True)
        if key in self._whole:
            return self._whole[key]
        return cached_replay(self.cache, "whole-run", spec, lambda: self._replay_whole_run(key, spec))

    def _replay_whole_run(self, key: str, spec: TrainingSpec) -> Any:
        """The whole run replayed now: composed from the traces this path ran, else deepened from its own."""
        from fitcheck.core.trainers import step_spec
        from fitcheck.torch_adapters.allocator_compose import ComposeError
        from fitcheck.torch_adapters.allocator_deepen import DeepenError
        from fitcheck.torch_adapters.allocator_replay import replay_deepened
        from fitcheck.torch_adapters.allocator_whole_run import replay_whole_run

        if replayed_run(spec):
            traces = self._traces.get(key)
            runs = traces.traced.get(step_spec(spec).batch.micro_batch, ()) if traces is not None else ()
            try:
                self._whole[key] = replay_whole_run(spec, runs, optimizer_traces=self._optimizer_traces)
                return self._whole[key]
            except (ComposeError, DeepenError):
                pass
        return replay_deepened(spec)

    def _formula(self, spec: TrainingSpec) -> Report:
        """``core.estimate(spec)``, kept for the last ``_FORMULAS_KEPT`` specs (the batch search and the advisor ask
        a spec again: 20 estimates of 10 specs in the Qwen3-8B QLoRA answer). The core is pure and reads neither
        field equality leaves out (model ``config``, ``provenance``); the kept report comes with the spec asked."""
        for seen, report in self._formulas:
            if seen == spec:
                return report if report.spec is spec else dataclasses.replace(report, spec=spec)
        from fitcheck.core import estimate

        report = estimate(spec)
        self._formulas.append((spec, report))
        del self._formulas[:-_FORMULAS_KEPT]
        return report

    def _answer(self, spec: TrainingSpec) -> Report:
        from fitcheck.core import estimate

        if self.mode == "auto" and self.wants_trace(spec):
            formula = self._formula(spec)  # inside the envelope with no "not modelled" note: the formula is pinned
            if formula.pinned and not self.seq_lengths:
                return formula
            if formula.pinned:  # the pinned formula's activations, the replayed lengths' gap
                return self._with_lengths(spec, None)
        comps, failed = self.activations(spec)
        if self.seq_lengths:
            report = self._with_lengths(spec, comps)
        elif comps is None:
            report = self._formula(spec)
            if self.can_trace and not report.pinned and not failed and (self.mode == "never" or not traceable(spec)):
                report = not_pinned_with_torch(report, self.mode)  # the hint names --trace, not an install
        else:
            report = estimate(spec, activations=comps, replayed=self.replayed_gap(spec) if comps else None)
        if comps and "generation " + _cache_key(spec) in self._failed:
            note = generation_trace_failed(self._failed["generation " + _cache_key(spec)])
            report = dataclasses.replace(report, findings=(*report.findings, note))
        if failed:
            report = dataclasses.replace(report, findings=(*report.findings, trace_failed(failed)))
        elif comps and _gap_applies(spec, self.seq_lengths) and (gap := gap_note(self, spec, _cache_key(spec))):
            report = dataclasses.replace(report, findings=(*report.findings, gap))
        elif comps and not self.seq_lengths and _cache_key(spec) in self._whole_failed:
            note = two_groups(self._whole_failed[_cache_key(spec)])
            report = dataclasses.replace(report, findings=(*report.findings, note))
        return accumulation_unpinned(report)


def _gap_applies(spec: TrainingSpec, seq_lengths: tuple[int, ...]) -> bool:
    """Whether the whole run's replayed gap enters the number: a CUDA device and no ``--seq_lengths`` (its own
    replay gives the gap: ``PinnedPath._with_lengths``). With expandable segments too: the replay maps pages onto
    one segment per pool and keeps its free holes (``core/caching``), as the H200 measured."""
    from fitcheck.spec import DeviceType

    return spec.hardware.device_type is not DeviceType.CPU and not seq_lengths


def _reason(exc: BaseException) -> str:
    """An exception as one short line for a message: its type and first line."""
    from fitcheck.errors import exception_line

    return exception_line(exc)


def _rewrite_for(spec: TrainingSpec) -> Any:
    """``fsdp2_run_events.rewrite_for``; None without importing the rewrites for a run that is neither DeepSpeed
    nor FSDP, the only runs they describe (``deepspeed_run_events.replayed``, ``fsdp2_run_plan.replays``)."""
    if spec.sharding.strategy not in (Strategy.DEEPSPEED, Strategy.FSDP):
        return None
    from fitcheck.torch_adapters import fsdp2_run_events

    return fsdp2_run_events.rewrite_for(spec)
