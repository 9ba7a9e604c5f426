"""Pictures of an estimate: where the run stops fitting, and what fills the memory (matplotlib, optional).

One figure, three panels (the curves come from :func:`fitcheck.advice.memory_series`):

1. device memory used (what must fit) and peak allocated vs micro-batch at the run's sequence length, with
   the GPU's capacity line and the run's own micro-batch marked;
2. the same vs sequence length at the run's micro-batch;
3. the component stack alive at the peak phase of the run (largest first; small ones merged), next to the
   capacity.

matplotlib is imported lazily and without pyplot (an ``Agg`` canvas on a ``Figure``), so drawing never
touches a global backend. Missing matplotlib is a :class:`~fitcheck.errors.ConfigError` (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitcheck.advice import MAX_POINTS, EstimateFn, memory_series
from fitcheck.errors import ConfigError
from fitcheck.report import Location, Report
from fitcheck.units import GIB

_FORMATS = (".png", ".svg")


def _matplotlib() -> tuple[Any, Any, Any]:
    try:
        from matplotlib import colormaps
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(
            "fitcheck plot: matplotlib is not installed; install the extra with pip install 'fitcheck[plot]'"
        ) from None
    return Figure, FigureCanvasAgg, colormaps


def _stack(report: Report, keep: int = 9) -> list[tuple[str, float]]:
    """(name, GiB) of device components at the peak phase, largest first, the tail merged into "other"."""
    items: dict[str, int] = {}
    for c in report.components:
        if c.location is Location.HOST:
            continue
        b = c.at(report.peak_phase) if c.location is Location.DEVICE else c.peak_bytes
        if b > 0:
            items[c.name] = items.get(c.name, 0) + b
    reserved_gap = report.peak_reserved_bytes - report.peak_allocated_bytes
    if reserved_gap > 0:
        items["allocator reserve (reserved - allocated)"] = reserved_gap
    ordered = sorted(items.items(), key=lambda kv: kv[1], reverse=True)
    head = [(n, b / GIB) for n, b in ordered[:keep] if b >= 0.005 * GIB]
    tail = sum(b for _, b in ordered[keep:]) + sum(b for _, b in ordered[:keep] if b < 0.005 * GIB)
    if tail >= 0.01 * GIB:
        head.append(("other (small components)", tail / GIB))
    return head


def plot_report(
    report: Report, path: str | Path, *, estimate_fn: EstimateFn | None = None, max_fit: int | None = None
) -> Path:
    """Draw the figure for a report and save it as PNG or SVG (by the file's suffix).

    Args:
        report: The estimate of the run.
        path: Output file, ``.png`` or ``.svg``.
        estimate_fn: The estimator for the curves (default ``fitcheck.core.estimator``); the series come from
            :func:`fitcheck.advice.memory_series`.
        max_fit: The largest fitting micro-batch if already known (else searched).

    Returns:
        The path written.

    Raises:
        ConfigError: Unsupported suffix, or matplotlib missing.
    """
    out = Path(path)
    if out.suffix.lower() not in _FORMATS:
        raise ConfigError(f"--output {out}: write .png or .svg, e.g. --output memory.png")
    if not out.parent.is_dir():
        raise ConfigError(f"--output {out}: the folder {out.parent} does not exist; create it or write elsewhere")
    figure_cls, canvas_cls, colormaps = _matplotlib()
    series = memory_series(report, estimate_fn=estimate_fn, max_fit=max_fit)
    max_fit = series.max_fit
    spec = report.spec
    budget = report.budget_bytes / GIB
    micro = spec.batch.micro_batch
    seq = spec.batch.seq_len

    fig = figure_cls(figsize=(15, 5.2), layout="constrained")
    canvas_cls(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3, width_ratios=[1.15, 1.15, 0.9])
    gpu = spec.hardware.gpu_name or f"{budget:.0f} GiB GPU"
    fig.suptitle(
        f"{spec.model.model_id} on {gpu}: {'fits' if report.fits else 'does not fit'} "
        f"({report.device_used_bytes / GIB:.1f} of {budget:.1f} GiB at micro-batch {micro}, seq {seq})",
        fontsize=12,
    )

    _micro_batch_axis(ax1, series, budget, micro, seq, max_fit)
    _seq_len_axis(ax2, series, budget, micro, seq)
    _peak_stack_axis(ax3, report, budget, colormaps)

    try:
        fig.savefig(out, format=out.suffix.lower().lstrip("."), dpi=110)
    except OSError as exc:
        raise ConfigError(f"--output {out}: cannot write it ({exc.strerror or exc}); write elsewhere") from None
    return out


def _micro_batch_axis(ax1: Any, series: Any, budget: float, micro: int, seq: int, max_fit: int) -> None:
    """Device used and peak allocated against the micro-batch, with the run and the largest that fits."""
    xs = list(series.by_micro_batch.xs)
    used = [b / GIB for b in series.by_micro_batch.used_bytes]
    alloc = [b / GIB for b in series.by_micro_batch.allocated_bytes]
    ax1.plot(xs, used, "o-", color="tab:blue", ms=3, label="device used (must fit)")
    ax1.plot(xs, alloc, "--", color="tab:gray", lw=1, label="peak allocated")
    ax1.axhline(budget, color="tab:red", lw=1.5, label=f"GPU capacity {budget:.1f} GiB")
    ax1.axvline(micro, color="black", lw=0.8, ls=":", label=f"this run: {micro}")
    if max_fit >= 1:
        ax1.axvline(max_fit + 0.5, color="tab:green", lw=1, ls="-.", label=f"largest that fits: {max_fit}")
    else:
        ax1.text(
            0.5, 0.04, "micro-batch 1 does not fit", transform=ax1.transAxes, ha="center", color="tab:red"
        )
    ax1.set_ylim(bottom=0, top=max(budget, max(used)) * 1.08)
    ax1.set_xlabel(f"per_device_train_batch_size (seq {seq})")
    ax1.set_ylabel("GiB per GPU")
    ax1.set_title("memory vs micro-batch")
    if xs[-1] > 4 * xs[0] and len(xs) >= MAX_POINTS:
        ax1.set_xscale("log", base=2)
    ax1.legend(fontsize=8, loc="upper left")
    ax1.grid(alpha=0.3)


def _seq_len_axis(ax2: Any, series: Any, budget: float, micro: int, seq: int) -> None:
    """Device used and peak allocated against the sequence length."""
    ss = list(series.by_seq_len.xs)
    used_s = [b / GIB for b in series.by_seq_len.used_bytes]
    alloc_s = [b / GIB for b in series.by_seq_len.allocated_bytes]
    ax2.plot(ss, used_s, "o-", color="tab:blue", ms=3, label="device used (must fit)")
    ax2.plot(ss, alloc_s, "--", color="tab:gray", lw=1, label="peak allocated")
    ax2.axhline(budget, color="tab:red", lw=1.5, label="GPU capacity")
    ax2.axvline(seq, color="black", lw=0.8, ls=":", label=f"this run: {seq}")
    ax2.set_ylim(bottom=0, top=max(budget, max(used_s)) * 1.08)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel(f"max_seq_length (micro-batch {micro})")
    ax2.set_title("memory vs sequence length")
    ax2.legend(fontsize=8, loc="upper left")
    ax2.grid(alpha=0.3)


def _peak_stack_axis(ax3: Any, report: Report, budget: float, colormaps: Any) -> None:
    """What is alive at the peak, as one stacked bar."""
    stack = _stack(report)
    bottom = 0.0
    cmap = colormaps["tab20"]
    for i, (name, gib) in enumerate(stack):
        color = cmap(i % 20)
        ax3.bar(0, gib, bottom=bottom, color=color, width=0.8, label=f"{name}: {gib:.2f} GiB")
        bottom += gib
    ax3.axhline(budget, color="tab:red", lw=1.5, label=f"GPU capacity {budget:.1f} GiB")
    ax3.set_xlim(-0.5, 3.6)
    ax3.set_xticks([])
    ax3.set_ylim(0, max(budget, bottom) * 1.05)
    ax3.set_ylabel("GiB")
    ax3.set_title(f"what is alive at the peak ({report.peak_phase.value})")
    handles, labels = ax3.get_legend_handles_labels()
    ax3.legend(handles[::-1], labels[::-1], fontsize=7.5, loc="upper right", frameon=False)
