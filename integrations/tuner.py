"""Find the largest micro-batch of a ``transformers.Trainer`` run without training the model.

:func:`tune_micro_batch` starts at fitcheck's predicted maximum and verifies it with trial steps
(:mod:`fitcheck.integrations.tuner_trial`: forward + backward + the optimizer's state at real shapes, on a real
batch at the worst-case length, by steps that cannot move a parameter, everything restored afterwards):

* the sizes tried keep the global batch exactly: micro-batch m with accumulation G / m, for the divisors m of
  the per-GPU batch G = ``per_device_train_batch_size`` × ``gradient_accumulation_steps`` (the number of
  processes does not change, so micro × accumulation × processes is kept);
* the prediction is the largest of those whose estimate fits — each estimated at its own accumulation, so the
  accumulation buffer (gradients held across micro-steps) is counted; trials with accumulation > 1 run two
  micro-steps, so they hold it too;
* TRL's GRPOTrainer keeps its generation batch too: only the sizes ``GRPOConfig`` accepts are tried
  (``generation_batch_size`` a multiple of micro × processes) and ``steps_per_generation`` follows the
  micro-batch; its trials generate and then train (:mod:`fitcheck.integrations.tuner_grpo`);
* the search (:func:`fitcheck.integrations.tuner_search.search_largest`) runs the prediction, then one size up
  (or down): 2 trials when the estimate is right, bisection when it is not;
* only a size whose trial ran is ever set: ``trainer.args`` (and the DeepSpeed batch keys, the Trainer's
  ``_train_batch_size``) change once, at the end, through :func:`set_trainer_micro_batch`; when nothing
  fits, :class:`TuningError` is raised and the arguments are left as they were.

HF's ``auto_find_batch_size`` (accelerate ``find_executable_batch_size``, accelerate/utils/memory.py) instead
trains from the configured batch and multiplies it by 0.9 after every OOM: it never goes up, does not rescale
gradient accumulation (the global batch silently shrinks), restarts training after each OOM, and transformers
refuses it under DeepSpeed ZeRO-3. ``benchmarks/tuner_vs_hf.py`` compares both on the same budgets.

Under DDP every rank runs the same trials and all-reduces each verdict (MIN), so all ranks set the same size.
DeepSpeed (ZeRO-1/2/3) shards the model inside ``Trainer.train``: each trial prepares a real engine the way
``train()`` does and tears it down (:mod:`fitcheck.integrations.tuner_engine`, where the design is argued), and
:func:`set_trainer_micro_batch` keeps DeepSpeed's three batch keys consistent with the size set. FSDP2 shards the
module in place, FSDP1 wraps it once: either way trials run on the Trainer's own preparation, kept sharded
(:mod:`fitcheck.integrations.tuner_fsdp`; FSDP2 run on an H100, benchmarks/data/tuner_fsdp_gpu_h100.json; both
checked on CPU gloo against an untuned run, tests/test_tuner_fsdp.py).

torch and transformers are imported lazily.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fitcheck.integrations.tuner_batch import TrainerBatch, set_trainer_micro_batch
from fitcheck.integrations.tuner_search import SearchResult, is_oom_error, search_largest

from fitcheck.errors import FitcheckError
from fitcheck.units import format_bytes

__all__ = [
    "TrainerBatch",
    "TuningError",
    "TuningResult",
    "TuningTrial",
    "set_trainer_micro_batch",
    "train_with_tuned_micro_batch",
    "tune_micro_batch",
]

_log = logging.getLogger("fitcheck")


@dataclass(frozen=True)
class TuningTrial:
    """One trial step.

    Attributes:
        micro_batch: The micro-batch tried.
        grad_accum: The accumulation that keeps the global batch at that micro-batch.
        fits: True when the trial ran (on every rank).
        peak_bytes: The measured peak (``torch.cuda.max_memory_allocated`` or the CPU live-tensor peak); None
            when the trial ran out of memory before it ended.
        error: The out-of-memory message when it did not fit.
    """

    micro_batch: int
    grad_accum: int
    fits: bool
    peak_bytes: int | None
    error: str = ""


@dataclass(frozen=True)
class TuningResult:
    """What :func:`tune_micro_batch` found and set.

    Attributes:
        micro_batch: The largest micro-batch whose trial ran (now ``per_device_train_batch_size``).
        grad_accum: Its accumulation (now ``gradient_accumulation_steps``).
        global_batch: micro × accumulation × processes (unchanged by tuning).
        predicted_micro_batch: fitcheck's predicted maximum among the sizes that keep the global batch.
        predicted_peak_bytes: The estimate's peak allocated bytes at the chosen size.
        seq_len: The worst-case sequence length the trials ran at.
        trials: Every trial, in order.
        peak_source: What ``peak_bytes`` measures.
    """

    micro_batch: int
    grad_accum: int
    global_batch: int
    predicted_micro_batch: int
    predicted_peak_bytes: int
    seq_len: int
    trials: tuple[TuningTrial, ...]
    peak_source: str = ""

    def table(self) -> str:
        """The trials as a small text table."""
        lines = [f"{'micro':>5} {'accum':>5} {'fits':>5} {'peak':>12}"]
        for t in self.trials:
            peak = f"{t.peak_bytes:,}" if t.peak_bytes is not None else "OOM"
            lines.append(f"{t.micro_batch:5d} {t.grad_accum:5d} {t.fits!s:>5} {peak:>12}")
        return "\n".join(lines)


class TuningError(FitcheckError):
    """No micro-batch that keeps the global batch ran, or the run cannot be tuned by trial steps.

    Attributes:
        trials: The trials run before giving up.
    """

    def __init__(self, message: str, trials: tuple[TuningTrial, ...] = ()) -> None:
        super().__init__(message)
        self.trials = trials


def divisors(n: int) -> list[int]:
    """The micro-batches that keep a per-GPU batch of ``n`` exactly (ascending)."""
    return [m for m in range(1, n + 1) if n % m == 0]


def _predicted_index(spec: Any, sizes: list[int], per_gpu: int) -> tuple[int, list[Any]]:
    """1-based index of the largest size whose estimate (at its own accumulation) fits; 1 when none does."""
    from fitcheck.advice import with_micro_batch
    from fitcheck.core import estimate

    reports = [estimate(with_micro_batch(spec, m, per_gpu // m)) for m in sizes]
    best = 1
    for i, report in enumerate(reports, start=1):
        if report.fits:
            best = i
    return best, reports


def _max_positions(model: Any) -> int | None:
    """``config.max_position_embeddings`` of the (unwrapped) model, when it has one."""
    from fitcheck.torch_adapters import unwrap_model

    value = getattr(getattr(unwrap_model(model), "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def tune_micro_batch(
    trainer: Any,
    *,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    device_type: str | None = None,
    max_seq_length: int | None = None,
) -> TuningResult:
    """Set the largest micro-batch that runs, keeping the global batch, without training the model.

    Call it after ``Trainer(...)`` and before ``trainer.train()``. Parameters, gradients, optimizer state, RNG
    and the dataloader are as before when it returns (or raises), so the following ``train()`` starts exactly
    where it would have without tuning.

    Args:
        trainer: A ``transformers.Trainer`` (or TRL trainer) with a ``train_dataset``, not yet trained.
        gpu: GPU name for the starting estimate (default: the device ``trainer.args.device`` names).
        gpu_memory: Memory per GPU for the starting estimate instead.
        device_type: ``cuda`` or ``cpu`` for the starting estimate.
        max_seq_length: Worst-case sequence length of the trials and the estimate (default: the arguments'
            ``max_length``/``max_seq_length``, else fitcheck's default 1024, capped at the model's
            ``max_position_embeddings``).

    Returns:
        The size set and every trial.

    Raises:
        TuningError: Nothing fits (even micro-batch 1).
    """
    from fitcheck.integrations.trainer_estimate import trainer_spec
    from fitcheck.integrations.tuner_engine import EngineTrialSession, is_deepspeed_trainer
    from fitcheck.integrations.tuner_fsdp import FsdpTrialSession, fsdp_version
    from fitcheck.integrations.tuner_grpo import (
        GRPOEngineTrialSession,
        GRPOFsdpTrialSession,
        GRPOTrialSession,
        is_grpo_trainer,
    )
    from fitcheck.integrations.tuner_trial import TrialSession, all_ranks_min, all_ranks_ok

    from fitcheck.core.trainers import grpo_batch_error

    args = trainer.args
    overrides = {"max_seq_length": max_seq_length} if max_seq_length is not None else {}
    spec, _ = trainer_spec(args, trainer.model, gpu=gpu, gpu_memory=gpu_memory, device_type=device_type,
                           overrides=overrides, source="tune_micro_batch", trainer=trainer)
    longest = _max_positions(trainer.model)
    if max_seq_length is None and longest is not None and spec.batch.seq_len > longest:
        # no length given and the default is longer than the model's positions: tile to what it can take
        spec, _ = trainer_spec(args, trainer.model, gpu=gpu, gpu_memory=gpu_memory, device_type=device_type,
                               overrides={"max_seq_length": longest}, source="tune_micro_batch", trainer=trainer)
    per_gpu = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    sizes = divisors(per_gpu)
    grpo = is_grpo_trainer(trainer)
    if grpo:
        sizes = [m for m in sizes if grpo_batch_error(spec, m) is None]  # GRPOConfig's rule (core/trainers)
    start, reports = _predicted_index(spec, sizes, per_gpu)
    start = all_ranks_min(start, getattr(args, "device", None))  # every rank starts where the tightest predicts
    trials: list[TuningTrial] = []
    peak_source = ""
    on_cpu = getattr(getattr(args, "device", None), "type", "cpu") == "cpu"
    cpu_budget = spec.hardware.gpu_memory_bytes if on_cpu and (gpu_memory is not None or gpu is not None) else None

    def step(index: int) -> None:
        nonlocal peak_source
        micro = sizes[index - 1]
        gas = per_gpu // micro
        peak: int | None = None
        error = ""
        try:
            measure = session.run(micro, gas)
            peak, peak_source = measure.peak_bytes, measure.peak_source
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if not error and cpu_budget is not None and peak is not None and peak > cpu_budget:
            # no allocator refuses anything on the CPU: the given budget is held against the measured peak
            error = (f"CPU: live-tensor peak {format_bytes(peak)} is over the budget {format_bytes(cpu_budget)} "
                     "(gpu_memory)")
        ok = all_ranks_ok(not error, getattr(args, "device", None))
        if ok or error:
            trials.append(TuningTrial(micro, gas, ok, peak if ok else None, error))
        else:
            trials.append(TuningTrial(micro, gas, False, peak, "out of memory on another rank"))
        if not ok:
            import torch

            raise torch.OutOfMemoryError(trials[-1].error)

    session_type: type[TrialSession] | type[EngineTrialSession] = (
        (GRPOEngineTrialSession if is_deepspeed_trainer(trainer) else GRPOFsdpTrialSession if fsdp_version(trainer)
         else GRPOTrialSession) if grpo
        else FsdpTrialSession if fsdp_version(trainer)
        else EngineTrialSession if is_deepspeed_trainer(trainer) else TrialSession)
    with session_type(trainer, spec.batch.seq_len) as session:
        found: SearchResult = search_largest(step, start, lower=1, upper=len(sizes))
    if found.size == 0:
        raise TuningError(
            f"tune_micro_batch: no micro-batch that keeps the global batch of {per_gpu} per GPU fits, not even "
            f"{sizes[0]} × {per_gpu // sizes[0]} at sequence length {spec.batch.seq_len} (tried "
            f"{', '.join(f'{t.micro_batch}×{t.grad_accum}' for t in trials)}); trainer.args are unchanged. "
            "See `fitcheck estimate` for changes that fit (LoRA, checkpointing, ZeRO, a shorter sequence)",
            tuple(trials),
        )
    micro = sizes[found.size - 1]
    set_trainer_micro_batch(trainer, micro)
    result = TuningResult(
        micro_batch=micro,
        grad_accum=per_gpu // micro,
        global_batch=per_gpu * int(getattr(args, "world_size", 1) or 1),
        predicted_micro_batch=sizes[start - 1],
        predicted_peak_bytes=reports[found.size - 1].peak_allocated_bytes,
        seq_len=spec.batch.seq_len,
        trials=tuple(trials),
        peak_source=peak_source,
    )
    _log.info("fitcheck: micro-batch %d x accumulation %d (predicted %d) after %d trials",
              result.micro_batch, result.grad_accum, result.predicted_micro_batch, len(trials))
    return result


def train_with_tuned_micro_batch(
    trainer: Any,
    *,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    device_type: str | None = None,
    max_seq_length: int | None = None,
    **train_kwargs: Any,
) -> Any:
    """:func:`tune_micro_batch`, then ``trainer.train(**train_kwargs)`` once, at the size found.

    Returns:
        What ``trainer.train`` returned.

    Raises:
        TuningError: Nothing fits (training is not started).
    """
    tune_micro_batch(trainer, gpu=gpu, gpu_memory=gpu_memory, device_type=device_type,
                     max_seq_length=max_seq_length)
    return trainer.train(**train_kwargs)
