"""The tuner's search: the largest size whose trial runs, starting at the predicted maximum (no torch needed).

1. run the predicted maximum p;
2. if it ran, run p + 1 once to confirm p is the largest (skipped when p is the upper bound or when
   ``verify_upward=False``); if it did not, run p − 1 once;
3. only when that correction shows the estimate was off by more than one, search: doubling upward from the
   largest size that ran, or halving downward from the smallest that failed, then bisection.

So the answer takes 2 trials when the estimate is exact or one too high, 3 when it is one too low, and
O(log) when it is further off. :func:`fitcheck.integrations.tuner.tune_micro_batch` runs it over the
indices of the micro-batches that keep the global batch; custom loops can call :func:`search_largest` with
their own ``step_fn``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

# The messages accelerate treats as out-of-memory (accelerate/utils/memory.py should_reduce_batch_size).
_OOM_MESSAGES = (
    " out of memory.",
    "CUDA out of memory",
    "MPS backend out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


@dataclass(frozen=True)
class SearchTrial:
    """One trial of the search.

    Attributes:
        size: The size tried.
        ok: True when the step ran.
        error: The out-of-memory message when it did not.
    """

    size: int
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class SearchResult:
    """The outcome of a search.

    Attributes:
        size: The largest size that ran (0 when even ``lower`` did not).
        trials: Number of trial steps run.
        history: The trials, in order.
        predicted: The predicted maximum the search started from.
    """

    size: int
    trials: int
    history: tuple[SearchTrial, ...]
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


def search_largest(
    step_fn: Callable[[int], object],
    predicted_max: int,
    *,
    lower: int = 1,
    upper: int | None = None,
    verify_upward: bool = True,
    max_trials: int = 32,
    clear_cache: Callable[[], None] = clear_device_cache,
) -> SearchResult:
    """Find the largest size that runs, starting from the predicted maximum (the tuner's internal search).

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
    history: list[SearchTrial] = []
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
        history.append(SearchTrial(m, ok, error))
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
    return SearchResult(size=best, trials=len(history), history=tuple(history), predicted=predicted_max)
