"""Memory vs micro-batch and vs sequence length around a run: the series a plot draws.

The advice layer owns the estimating; renderers (``fitcheck.render.plot``) only draw what this returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fitcheck.advice.batch_search import max_micro_batch, with_micro_batch
from fitcheck.core import estimate
from fitcheck.report import Report
from fitcheck.spec import TrainingSpec

EstimateFn = Callable[[TrainingSpec], Report]

MAX_POINTS = 24


@dataclass(frozen=True)
class Curve:
    """Device used and peak allocated (bytes) at each x."""

    xs: tuple[int, ...]
    used_bytes: tuple[int, ...]
    allocated_bytes: tuple[int, ...]


@dataclass(frozen=True)
class MemorySeries:
    """What the plot of a run shows.

    Attributes:
        by_micro_batch: Memory vs ``per_device_train_batch_size`` at the run's sequence length.
        by_seq_len: Memory vs sequence length at the run's micro-batch.
        max_fit: The largest micro-batch that fits (0: none).
    """

    by_micro_batch: Curve
    by_seq_len: Curve
    max_fit: int


def micro_batch_points(current: int, max_fit: int) -> list[int]:
    """Micro-batches to draw: 1 up to past both the current one and the largest that fits."""
    top = max(8, 2 * current, max_fit + max(2, max_fit // 4))
    if top <= MAX_POINTS:
        return list(range(1, top + 1))
    pts = {1, current, max_fit, max_fit + 1}
    x = 1.0
    ratio = top ** (1.0 / (MAX_POINTS - 1))
    while x < top:
        pts.add(round(x))
        x *= ratio
    pts.add(top)
    return sorted(p for p in pts if p >= 1)


def seq_len_points(current: int) -> list[int]:
    """Sequence lengths to draw: powers of two from 256 past twice the current one, and the current one."""
    pts = {current}
    s = 256
    while s <= max(2 * current, 1024):
        pts.add(s)
        s *= 2
    return sorted(pts)


def _curve(est: EstimateFn, xs: Sequence[int], specs: Sequence[TrainingSpec]) -> Curve:
    reports = [est(s) for s in specs]
    return Curve(
        tuple(xs),
        tuple(r.device_used_bytes for r in reports),
        tuple(r.peak_allocated_bytes for r in reports),
    )


def memory_series(report: Report, *, estimate_fn: EstimateFn | None = None, max_fit: int | None = None) -> MemorySeries:
    """Estimate the run at neighbouring micro-batches and sequence lengths.

    Args:
        report: The estimate of the run.
        estimate_fn: The estimator for the curves (default :func:`fitcheck.core.estimate`).
        max_fit: The largest fitting micro-batch if already known (else searched with the same estimator).

    Returns:
        The two curves and the largest micro-batch that fits.
    """
    est = estimate if estimate_fn is None else estimate_fn
    spec = report.spec
    if max_fit is None:
        max_fit = max_micro_batch(spec, est)
    xs = micro_batch_points(spec.batch.micro_batch, max_fit)
    ss = seq_len_points(spec.batch.seq_len)
    return MemorySeries(
        by_micro_batch=_curve(est, xs, [with_micro_batch(spec, m) for m in xs]),
        by_seq_len=_curve(est, ss, [replace(spec, batch=replace(spec.batch, seq_len=s)) for s in ss]),
        max_fit=max_fit,
    )
