"""The report as a readable rich table (the default output of ``fitcheck estimate``)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from fitcheck.advice import Suggestion
from fitcheck.core import ComputeEstimate
from fitcheck.findings import Severity
from fitcheck.report import Location, Report
from fitcheck.spec import DeviceType
from fitcheck.units import format_bytes

# Host bytes below this are bookkeeping (e.g. torch AdamW's 4-byte CPU step counters): listed as components only.
_HOST_WORTH_SAYING = 1024**2
_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def _header(report: Report) -> Text:
    spec = report.spec
    s = spec.sharding
    lines = [
        f"{spec.model.model_id}: {report.total_params / 1e9:.3f}B params, "
        f"{report.trainable_params / 1e9:.4f}B trainable ({spec.model.counted_by} inventory)",
        f"micro-batch {spec.batch.micro_batch} x seq {spec.batch.seq_len}, grad accum {spec.batch.grad_accum}, "
        f"{s.num_processes} process(es) on {s.num_machines} machine(s), {s.strategy.value}",
        f"regime: {report.regime}",
    ]
    return Text("\n".join(lines))


def components_table(report: Report, width: int = 160) -> Table:
    """The components alive at the peak phase, plus those outside the allocator and on the host.

    Args:
        report: The estimate.
        width: Console width; the explanation column is cut to fit it (``--json`` has the full text).
    """
    cpu = report.spec.hardware.device_type is DeviceType.CPU
    device = "CPU" if cpu else "GPU"
    title = "memory of the CPU run" if cpu else "per-GPU memory"
    table = Table(title=f"{title} at the peak ({report.peak_phase.value})", show_lines=False)
    name_width = max((len(c.name) for c in report.components), default=10)
    table.add_column("component", no_wrap=True)
    table.add_column("where", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    # borders and padding of four columns take 13 characters; "GPU (other)" and "1023.99 MiB" are 11 each
    rest = max(20, width - name_width - 11 - 11 - 13)
    table.add_column("what / from (full sources: --json)", no_wrap=True, overflow="ellipsis", max_width=rest)
    rows = []
    for c in report.components:
        value = c.at(report.peak_phase) if c.location is Location.DEVICE else c.peak_bytes
        if value:
            rows.append((c.location is not Location.DEVICE, -value, c, value))
    for _, _, c, value in sorted(rows, key=lambda r: (r[0], r[1])):
        where = {Location.DEVICE: device, Location.DEVICE_OTHER: f"{device} (other)", Location.HOST: "host"}[
            c.location
        ]
        detail = f"{c.detail} | {c.source}" if c.detail else c.source
        table.add_row(c.name, where, format_bytes(value), detail)
    return table


def phases_table(report: Report) -> Table:
    """Allocated bytes per phase (the peak phase marked)."""
    table = Table(title="allocated per phase")
    totals = report.phase_totals(Location.DEVICE)
    for p in totals:  # the training phases, + generation / evaluation where a trainer has them
        table.add_column(p.value + (" *" if p is report.peak_phase else ""), justify="right")
    table.add_row(*(format_bytes(totals[p]) for p in totals))
    return table


def summary_text(report: Report) -> Text:
    """Peak allocated / reserved / used vs budget, and the verdict."""
    verdict = Text(
        "FITS" if report.fits else "DOES NOT FIT", style="bold green" if report.fits else "bold red"
    )
    out = Text()
    out.append(
        f"peak allocated {format_bytes(report.peak_allocated_bytes)} | reserved "
        f"{format_bytes(report.peak_reserved_bytes)} | device used {format_bytes(report.device_used_bytes)} "
        f"of {format_bytes(report.budget_bytes)}"
    )
    if report.host_bytes >= _HOST_WORTH_SAYING:
        out.append(f" | host {format_bytes(report.host_bytes)} per node")
    out.append("  ->  ")
    out.append(verdict)
    return out


def findings_text(report: Report, assumptions: Sequence[str] = ()) -> Text:
    """Findings, worst first, then the assumptions made."""
    out = Text()
    for f in report.findings:
        out.append(f"[{f.severity.value}] {f.code}: ", style=_STYLE[f.severity])
        out.append(f.message + "\n")
        if f.hint:
            out.append(f"    fix: {f.hint}\n", style="dim")
    for line in (*report.assumptions, *assumptions):
        out.append(f"assumed: {line}\n", style="dim")
    return out


def render_report(report: Report, *, extra: Sequence[RenderableType] = (), width: int = 160) -> Group:
    """Everything the table output shows, as one rich renderable."""
    return Group(
        _header(report),
        components_table(report, width),
        phases_table(report),
        summary_text(report),
        findings_text(report),
        *extra,
    )


def make_console(**kwargs: object) -> Console:
    """A console for reports: the terminal's width, or 160 columns when piped or captured (logs, CI)."""
    console = Console(**kwargs)  # type: ignore[arg-type]
    if not console.is_terminal:
        console = Console(width=160, **kwargs)  # type: ignore[arg-type]
    return console


def print_report(report: Report, console: Console, *, extra: Sequence[RenderableType] = ()) -> None:
    """Print the report to a console."""
    console.print(render_report(report, extra=extra, width=console.width))


def suggestions_table(suggestions: Sequence[Suggestion]) -> RenderableType:
    """The advisor's suggestions, best first, with the flags that describe each (nothing when there are none)."""
    if not suggestions:
        return Text("")
    table = Table(title="What to change", title_justify="left", show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("change")
    table.add_column("peak used", justify="right")
    table.add_column("fits", justify="center")
    table.add_column("time/token", justify="right")
    table.add_column("flags to append")
    for i, s in enumerate(suggestions, 1):
        host = f" [dim](host {format_bytes(s.host_bytes)})[/dim]" if s.host_bytes >= _HOST_WORTH_SAYING else ""
        table.add_row(
            str(i),
            s.title + host,
            format_bytes(s.device_used_bytes),
            "yes" if s.fits else "no",
            f"{s.relative_step_time:.2f}x",
            " ".join(s.argv),
        )
    return table


def compute_line(estimate: ComputeEstimate) -> str:
    """One human line: FLOPs per token, step time and throughput at the assumed MFU."""
    head = (
        f"compute: {estimate.flops_per_token / 1e9:.1f} GFLOP/token executed, "
        f"{estimate.flops_per_step / 1e12:.1f} TFLOP per optimizer step"
    )
    if estimate.step_seconds is None or estimate.tokens_per_second is None:
        return head + " (no time: " + "; ".join(n for n in estimate.notes if "peak" in n) + ")"
    return (
        f"{head}; {estimate.step_seconds:.2f} s/step, {estimate.tokens_per_second:,.0f} tokens/s "
        f"({estimate.tokens_per_second / estimate.num_gpus:,.0f}/GPU) at {estimate.mfu:.0%} MFU of "
        f"{estimate.peak_tflops:g} TFLOP/s"
    )
