"""Verified micro-batch tuning: start at fitcheck's predicted maximum, correct once, bisect only if needed.

HF's ``auto_find_batch_size`` (accelerate ``find_executable_batch_size``, accelerate/utils/memory.py) starts
from the configured batch and multiplies it by 0.9 after every out-of-memory error: it never goes up, needs
many OOMs when the start is far off, does not rescale gradient accumulation (the global batch silently
shrinks), and transformers refuses it under DeepSpeed ZeRO-3 (trainer.py: "`auto_find_batch_size` isn't
supported yet with DeepSpeed Zero-3"). This tuner uses the estimate instead:

1. run the predicted maximum p;
2. if it ran, run p + 1 once to confirm p is the largest (skipped when p is the upper bound or when
   ``verify_upward=False``); if it did not, run p − 1 once;
3. only when that correction shows the estimate was off by more than one, search: doubling upward from the
   largest size that ran, or halving downward from the smallest that failed, then bisection.

So the answer takes 2 trial steps when the estimate is exact or one too high, 3 when it is one too low, and
O(log) when it is further off.

Two entry points:

* :func:`tune_micro_batch` for custom loops: give it ``step_fn(micro_batch)`` that runs one real training
  step (forward, backward, optimizer step) at that size; it catches ``torch.OutOfMemoryError`` and the
  ``RuntimeError("... out of memory.")`` forms and empties the CUDA cache between trials.
* :func:`set_trainer_micro_batch` / :func:`train_with_tuned_micro_batch` for the HF Trainer: they set
  ``per_device_train_batch_size``, rescale ``gradient_accumulation_steps`` so the global batch is kept, and
  keep DeepSpeed's three batch keys (``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
  ``train_batch_size``) consistent in ``args.hf_deepspeed_config.config`` — before the dataloader is built,
  under every ZeRO stage including 3.

torch and transformers are imported lazily.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The messages accelerate treats as out-of-memory (accelerate/utils/memory.py should_reduce_batch_size).
_OOM_MESSAGES = (
    " out of memory.",
    "CUDA out of memory",
    "MPS backend out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


@dataclass(frozen=True)
class Trial:
    """One trial step.

    Attributes:
        micro_batch: The size tried.
        ok: True when the step ran.
        error: The out-of-memory message when it did not.
    """

    micro_batch: int
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class TuneResult:
    """The outcome of tuning.

    Attributes:
        micro_batch: The largest size that ran (0 when even ``lower`` did not).
        trials: Number of trial steps run.
        history: The trials, in order.
        predicted: The predicted maximum the search started from.
    """

    micro_batch: int
    trials: int
    history: tuple[Trial, ...]
    predicted: int


def is_oom_error(exc: BaseException) -> bool:
    """True for torch's OutOfMemoryError and the RuntimeError forms accelerate recognises."""
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is present wherever a step can run
        pass
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


def clear_device_cache() -> None:
    """Collect garbage and return cached CUDA blocks, as accelerate does between its retries."""
    gc.collect()
    try:
        import torch
    except ImportError:  # pragma: no cover
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def tune_micro_batch(
    step_fn: Callable[[int], object],
    predicted_max: int,
    *,
    lower: int = 1,
    upper: int | None = None,
    verify_upward: bool = True,
    max_trials: int = 32,
    clear_cache: Callable[[], None] = clear_device_cache,
) -> TuneResult:
    """Find the largest micro-batch that runs, starting from the predicted maximum.

    Args:
        step_fn: Runs one real training step at the given micro-batch; raises an out-of-memory error when it
            does not fit. Other exceptions propagate.
        predicted_max: fitcheck's predicted maximum (``max_micro_batch``); clamped to [lower, upper].
        lower: Smallest micro-batch worth trying.
        upper: Largest micro-batch to consider (e.g. the global batch per GPU); None = unbounded.
        verify_upward: Try predicted + 1 after the predicted size runs, to confirm it is the largest.
        max_trials: Stop after this many trials (the largest size that ran so far is returned).
        clear_cache: Called between trials (default: gc + ``torch.cuda.empty_cache``).

    Returns:
        The largest size that ran, the number of trials and their history.
    """
    if lower < 1:
        raise ValueError(f"lower must be >= 1, got {lower}")
    if upper is not None and upper < lower:
        raise ValueError(f"upper ({upper}) must be >= lower ({lower})")
    start = max(lower, predicted_max)
    if upper is not None:
        start = min(start, upper)
    history: list[Trial] = []
    results: dict[int, bool] = {}

    def run(m: int) -> bool:
        if m in results:
            return results[m]
        error = ""
        try:
            step_fn(m)
            ok = True
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            ok, error = False, str(exc).splitlines()[0][:200]
            del exc
        clear_cache()
        results[m] = ok
        history.append(Trial(m, ok, error))
        return ok

    def budget_left() -> bool:
        return len(history) < max_trials

    best = 0  # largest size known to run
    worst: int | None = None  # smallest size known to fail
    if run(start):
        best = start
        if verify_upward and (upper is None or start < upper) and budget_left():
            if run(start + 1):
                best = start + 1
                step = 1  # low by one is the likeliest miss: try +1 before doubling
                while budget_left():  # the estimate was low: double the step upward
                    cand = best + step
                    if upper is not None:
                        cand = min(cand, upper)
                    if cand <= best:
                        break
                    if run(cand):
                        best, step = cand, step * 2
                    else:
                        worst = cand
                        break
            else:
                worst = start + 1
    else:
        worst = start
        if start > lower and budget_left():
            if run(start - 1):
                best = start - 1
            else:
                worst = start - 1
                cand = worst
                while best == 0 and cand > lower and budget_left():  # the estimate was high: halve downward
                    cand = max(lower, cand // 2)
                    if run(cand):
                        best = cand
                    else:
                        worst = cand
    while worst is not None and worst - best > 1 and best >= lower and budget_left():  # bisection
        mid = (best + worst) // 2
        if run(mid):
            best = mid
        else:
            worst = mid
    return TuneResult(micro_batch=best, trials=len(history), history=tuple(history), predicted=predicted_max)


@dataclass(frozen=True)
class TrainerBatch:
    """What :func:`set_trainer_micro_batch` set.

    Attributes:
        micro_batch: ``per_device_train_batch_size``.
        grad_accum: ``gradient_accumulation_steps``.
        train_batch_size: micro × accumulation × world size (DeepSpeed ``train_batch_size``).
        exact: True when the global batch before the change is kept exactly.
    """

    micro_batch: int
    grad_accum: int
    train_batch_size: int
    exact: bool


def _keep_global(per_gpu: int, micro: int) -> tuple[int, int]:
    """The rule of ``fitcheck.advice.batch_search.plan_global_batch`` on plain numbers."""
    m = min(micro, per_gpu)
    if per_gpu % m == 0:
        return m, per_gpu // m
    d = max(k for k in range(1, m) if per_gpu % k == 0)
    if 2 * d >= m:
        return d, per_gpu // d
    return m, per_gpu // m


def set_trainer_micro_batch(
    trainer_or_args: Any, micro_batch: int, *, keep_global_batch: bool = True
) -> TrainerBatch:
    """Set the micro-batch of a Trainer (or its TrainingArguments) before its dataloader is built.

    Sets ``args.per_device_train_batch_size``; with ``keep_global_batch`` rescales
    ``args.gradient_accumulation_steps`` (rule: ``fitcheck.advice.batch_search.plan_global_batch``); updates
    the Trainer's private ``_train_batch_size`` (copied from args in ``Trainer.__init__``; guarded by
    ``hasattr``); and writes DeepSpeed's ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``
    and ``train_batch_size`` into ``args.hf_deepspeed_config.config`` (the dict accelerate's DeepSpeed plugin
    shares, transformers/integrations/deepspeed.py ``propagate_args_to_deepspeed``), so DeepSpeed's check
    ``train_batch_size == micro × accumulation × world`` holds at every ZeRO stage.

    Args:
        trainer_or_args: A ``transformers.Trainer`` or ``TrainingArguments``.
        micro_batch: The micro-batch to use.
        keep_global_batch: Rescale gradient accumulation to keep micro × accumulation.

    Returns:
        What was set.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    args = getattr(trainer_or_args, "args", trainer_or_args)
    old_micro = int(args.per_device_train_batch_size)
    old_gas = int(args.gradient_accumulation_steps)
    per_gpu = old_micro * old_gas
    if keep_global_batch:
        micro, gas = _keep_global(per_gpu, micro_batch)
    else:
        micro, gas = micro_batch, old_gas
    world = int(getattr(args, "world_size", 1) or 1)
    args.per_device_train_batch_size = micro
    args.gradient_accumulation_steps = gas
    if trainer_or_args is not args and hasattr(trainer_or_args, "_train_batch_size"):
        n_gpu = max(1, int(getattr(args, "n_gpu", 1) or 1))  # DataParallel multiplies (training_args.py)
        trainer_or_args._train_batch_size = micro * n_gpu
    ds = getattr(args, "hf_deepspeed_config", None)
    config = getattr(ds, "config", None)
    if isinstance(config, dict):
        config["train_micro_batch_size_per_gpu"] = micro
        config["gradient_accumulation_steps"] = gas
        config["train_batch_size"] = micro * gas * world
    accelerator = getattr(trainer_or_args, "accelerator", None)
    state = getattr(getattr(accelerator, "gradient_state", None), "plugin_kwargs", None)
    if isinstance(state, dict) and "num_steps" in state:
        state["num_steps"] = gas  # accelerate GradientAccumulationPlugin, built in Trainer.__init__
    return TrainerBatch(micro, gas, micro * gas * world, micro * gas == per_gpu)


def train_with_tuned_micro_batch(
    trainer: Any,
    predicted_max: int,
    *,
    upper: int | None = None,
    **train_kwargs: Any,
) -> Any:
    """``trainer.train()`` at the predicted maximum micro-batch, stepping down once (then bisecting) on OOM.

    Each attempt is the real training run: the first size that runs trains to the end, so there is no
    upward verification here (use :func:`tune_micro_batch` with a one-step ``step_fn`` for that). Between
    attempts the wrapped model is released and the wrapping reset as transformers does for its own retries
    (trainer.py ``_update_auto_batch_size``), and the batch keys are set with :func:`set_trainer_micro_batch`,
    which also covers ZeRO-3.

    Args:
        trainer: A ``transformers.Trainer`` (not yet trained).
        predicted_max: fitcheck's predicted maximum micro-batch.
        upper: Largest micro-batch to consider (default: the global batch per GPU).
        **train_kwargs: Passed to ``trainer.train``.

    Returns:
        What ``trainer.train`` returned at the size that ran.
    """
    args = trainer.args
    per_gpu = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    out: dict[str, Any] = {}

    def attempt(micro: int) -> None:
        _reset_wrapping(trainer)
        set_trainer_micro_batch(trainer, micro)
        out["result"] = trainer.train(**train_kwargs)

    result = tune_micro_batch(attempt, predicted_max, upper=upper or per_gpu, verify_upward=False)
    if result.micro_batch == 0:
        raise RuntimeError(
            f"no micro-batch down to 1 ran (tried {[t.micro_batch for t in result.history]}); "
            "see fitcheck's suggestions (fitcheck estimate ...) for changes that fit"
        )
    return out["result"]


def _reset_wrapping(trainer: Any) -> None:
    """Release the wrapped model (DDP/DeepSpeed engine) from a failed attempt, as transformers does."""
    wrapped = getattr(trainer, "model_wrapped", None)
    model = getattr(trainer, "model", None)
    if wrapped is not None and wrapped is not model:
        try:
            from accelerate.utils import release_memory

            release_memory(wrapped)
        except ImportError:  # pragma: no cover
            pass
        trainer.model_wrapped = model
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "free_memory"):
        accelerator.free_memory()
    clear_device_cache()
