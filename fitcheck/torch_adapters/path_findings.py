"""The findings the default path (``pinned_path.PinnedPath``) adds to a report: a trace that could not run, the
published allocator gap kept beside traced activations, the two-group gap where the whole run could not be
replayed, and what the replays ``--reserved_replay`` and ``--seq_lengths`` ask for gave.
"""

from __future__ import annotations

from typing import Any

from fitcheck.findings import Finding, Severity
from fitcheck.report import Report
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.run_scope import accumulation_not_traced, replayed_run, traceable, untraced_parts

__all__ = ["PATH_FINDINGS", "accumulation_unpinned", "generation_trace_failed", "lengths_replayed",
           "not_pinned_with_torch", "path_findings_lost", "published_gap", "trace_failed", "two_groups",
           "whole_run_replayed"]


def trace_failed(reason: str) -> Finding:
    """INFO: the trace could not run (``reason``); the formulas answered."""
    return Finding("trace-failed", Severity.INFO, f"tracing this run was not possible ({reason})",
                   "the number is from the formulas; see the not-pinned warning")


def generation_trace_failed(reason: str) -> Finding:
    """INFO: ``model.generate`` could not be traced (``reason``); the generation phase is the formula's."""
    return Finding("generation-trace-failed", Severity.INFO,
                   f"tracing model.generate was not possible ({reason}); the generation phase is the formula's",
                   "core/trainers/generation_phase.py")


def published_gap(why: str) -> Finding:
    """INFO: traced activations of a DeepSpeed / FSDP run keep the published allocator gap (``why``: the rewrite's
    reason, ``published_gap_reason``)."""
    return Finding("reserved-published-gap", Severity.INFO,
                   "activations are traced (as the 16-bit module DeepSpeed or FSDP mixed precision runs); "
                   "the default stream's caching-allocator gap is the published fraction (core/allocator.py): "
                   f"{why} (their side streams' pools are added: deepspeed-side-streams / fsdp-side-streams)",
                   "measure one step (FitcheckCallback, benchmarks/gpu_truth.py)")


def plain_run_gap(why: str) -> Finding:
    """INFO: traced activations of an FSDP run whose own run the rewrite does not describe (``why``:
    ``published_gap_reason``) keep the plain Trainer's whole-run gap: said, never silent."""
    return Finding("reserved-plain-run-gap", Severity.INFO,
                   "activations are traced (as the 16-bit module FSDP mixed precision runs); the caching-allocator "
                   f"gap is the plain Trainer's whole run replayed, not this run's own: {why}, so FSDP's flat "
                   "parameters, the cache its prepare leaves and its side streams' pools are not in the gap",
                   "measure one step (FitcheckCallback, benchmarks/gpu_truth.py)")


def gap_note(path: Any, spec: TrainingSpec, key: str) -> Finding | None:
    """What a traced answer says about its allocator gap where it is not its own run's replay (``PinnedPath``
    ``path``, the spec's trace ``key``): :func:`published_gap` where the published fraction answers (a run the plain
    replay does not describe, or a DeepSpeed / FSDP rewrite that could not run: ``path._whole_failed``), and
    :func:`plain_run_gap` where an FSDP run outside the rewrites keeps the plain Trainer's whole-run gap; None
    where the gap is the run's own replay."""
    from fitcheck.spec import Strategy
    from fitcheck.torch_adapters import deepspeed_run_events, fsdp2_run_events

    rewrite = fsdp2_run_events.rewrite_for(spec) if spec.sharding.strategy in (Strategy.DEEPSPEED,
                                                                              Strategy.FSDP) else None
    fsdp = spec.sharding.strategy is Strategy.FSDP and spec.sharding.fsdp is not None
    if replayed_run(spec) and rewrite is None and not fsdp:
        return None
    gap = path.gap_fraction(spec)
    if gap is not None and (rewrite is not None or not fsdp):
        return None
    why = (fsdp2_run_events if spec.sharding.fsdp else deepspeed_run_events).published_gap_reason(path, spec, key)
    return published_gap(why) if gap is None else plain_run_gap(why)


def two_groups(reason: str) -> Finding:
    """INFO: the whole run could not be replayed (``reason``); reserved uses the deepest traced step's gap (two
    layer groups, three where the bottom layer reads another dtype: ``tracer_depth.residual_promoted``)."""
    return Finding("reserved-two-groups", Severity.INFO,
                   f"the whole run could not be replayed through the caching allocator "
                   f"({reason}); reserved uses the gap of the deepest traced step (two layer groups; three "
                   "where the bottom layer reads another dtype than the layers above it), which does not scale "
                   "with depth (-12 % .. +13 % on the H100 rows of "
                   "benchmarks/data/reserved_replay_nvidia_h100_80gb_hbm3.json)",
                   "--reserved_replay replays the run traced at its full depth")


def not_pinned_with_torch(report: Report, mode: str) -> Report:
    """The formula's answer with its ``not-pinned`` hint saying what to do where torch is installed.

    The core writes the hint without knowing whether torch is installed ("install torch + transformers ... or pass
    --trace"). Here it is: the default path did not trace because the run is outside ``run_scope.traceable`` (a TRL
    trainer's step or a vision-language model: ``--trace`` traces them; a part the tracer does not describe:
    ``--trace`` refuses it) or because of ``--no_trace`` (``mode`` ``never``).
    """
    import dataclasses

    from fitcheck.spec import TrainerKind

    spec = report.spec
    parts = untraced_parts(spec)
    if parts:
        hint = (f"the tracer does not describe {', '.join(parts)} (the formulas model it); measure one step "
                "(FitcheckCallback, benchmarks/gpu_truth.py) if the margin is small")
    elif spec.trainer.kind is not TrainerKind.TRAINER:
        hint = (f"pass --trace: torch is installed, but the default path traces the plain Trainer's step only; "
                f"--trace traces the {spec.trainer.kind.value} trainer's policy step on fake tensors")
    elif not traceable(spec):
        hint = "pass --trace (the default path does not trace a vision-language step; --trace does)"
    elif spec.model.config:
        hint = "drop --no_trace (torch is installed: fitcheck then traces the real model on fake tensors)"
    else:  # no config.json to build the model from: the default path would not trace either
        return report
    findings = tuple(dataclasses.replace(f, hint=hint) if f.code == "not-pinned" else f for f in report.findings)
    return dataclasses.replace(report, findings=findings)


def accumulation_unpinned(report: Report) -> Report:
    """A traced answer whose run's later accumulation micro-steps the trace cannot show
    (``run_scope.accumulation_not_traced``): not pinned, with a WARNING saying so (its one pass was read as the
    micro-step); any other report as it is."""
    import dataclasses

    why = accumulation_not_traced(report.spec)
    if not why or not any(c.name == "activations.traced" for c in report.components):
        return report
    note = Finding("accumulation-not-traced", Severity.WARNING,
                   f"gradient accumulation ({report.spec.batch.grad_accum} micro-steps): the activations are the "
                   f"traced step's one pass (a first micro-step); the later ones add into the gradients the earlier "
                   f"ones left, and the trace does not show {why} (core/states/accumulation.py, "
                   "torch_adapters/run_scope.py); not pinned",
                   "measure one step (FitcheckCallback, benchmarks/gpu_truth.py) if the margin is small")
    kept = tuple(f for f in report.findings if f.code != note.code)
    return dataclasses.replace(report, pinned=False, findings=(*kept, note))


def _where_the_gap_does_not_apply(spec: TrainingSpec) -> str:
    """The caveat a replay finding adds where the allocator's gap does not enter the number."""
    from fitcheck.spec import DeviceType

    if spec.hardware.device_type is DeviceType.CPU:
        return "; on CPU there is no caching allocator, so it does not enter the number"
    return ""


# what PinnedPath._answer adds
PATH_FINDINGS = ("trace-failed", "generation-trace-failed", "reserved-published-gap", "reserved-plain-run-gap",
                 "reserved-two-groups", "accumulation-not-traced")


def path_findings_lost(before: Report, after: Report) -> tuple[Finding, ...]:
    """Findings the path added to ``before`` (trace-failed) that a re-estimate does not make."""
    have = {f.code for f in after.findings}  # the estimate's own findings (its verdict) are after's, not before's
    return tuple(f for f in before.findings if f.code not in have and f.code in PATH_FINDINGS)


def whole_run_replayed(spec: TrainingSpec, replay: Any, fast: Report) -> Finding:
    """INFO: what ``--reserved_replay`` replayed, and the reserved figure it replaced."""
    from fitcheck.torch_adapters.allocator_replay import STEADY_STEPS
    from fitcheck.units import format_bytes

    said = (f"the whole run was replayed through torch's caching allocator (every layer, the optimizer, "
            f"{STEADY_STEPS} steps; fitcheck/core/caching): reserved - allocated = "
            f"{format_bytes(replay.peak_reserved - replay.peak_allocated)}, {replay.gap_fraction:.0%} of the "
            f"step's own tensors (without the flag: reserved {format_bytes(fast.peak_reserved_bytes)})")
    said += _where_the_gap_does_not_apply(spec)
    return Finding("reserved-replayed", Severity.INFO, said,
                   "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to shrink a large gap")


def lengths_replayed(spec: TrainingSpec, replay: Any, alone: Any, released: Report | None) -> Finding:
    """INFO: what the replay over ``--seq_lengths`` gave, and where it does not enter the number."""
    from fitcheck.units import format_bytes

    lengths = ",".join(str(n) for n in replay.lengths)
    said = (f"the caching allocator replayed {len(replay.lengths)} steps padded to {lengths} tokens (this run's "
            f"steps traced, torch's allocator rules: fitcheck/core/caching): reserved - "
            f"allocated = {replay.gap_fraction:.0%} of the step's own tensors ({alone.gap_fraction:.0%} for the "
            f"longest step alone)")
    if released is not None:
        said += (f"; that is {format_bytes(released.device_used_bytes)}, above the GPU, so torch releases its "
                 "cached segments and retries (release_cached_blocks): the number uses the longest step's gap, "
                 "and nvidia-smi will show the GPU nearly full")
    else:
        said += ", applied to this estimate's step"
    said += _where_the_gap_does_not_apply(spec)
    if not replayed_run(spec):
        said += "; the replayed sequence is the plain Trainer step's (the tracer does not describe this run's " \
                "sharding or kernels), so take it as an approximation"
    return Finding("seq-lengths-replayed", Severity.INFO, said,
                   "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to shrink a large gap")
