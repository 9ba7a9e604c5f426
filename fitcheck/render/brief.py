"""``--brief``: the verdict, the peak, the headroom and the best fix in at most :data:`MAX_LINES` plain lines.

The full report is 50-80 lines at 160 columns; a person deciding whether to launch needs four facts. Nothing is
estimated here: the report and the advisor's suggestions come in.
"""

from __future__ import annotations

from collections.abc import Sequence

from fitcheck.advice import Suggestion
from fitcheck.report import Report, phase_phrase
from fitcheck.spec import DeviceType
from fitcheck.units import format_bytes

MAX_LINES = 8
_WIDTH = 160


def _cut(line: str) -> str:
    return line if len(line) <= _WIDTH else line[: _WIDTH - 3] + "..."


def brief_lines(report: Report, suggestions: Sequence[Suggestion], max_micro_batch: object = None,
                band_low: object = None) -> list[str]:
    """The brief report: at most :data:`MAX_LINES` lines of at most 160 characters.

    Args:
        report: The estimate.
        suggestions: The advisor's suggestions, best first.
        max_micro_batch: The largest micro-batch that fits at this length (None: not known).
        band_low: The largest that fits if reserved is as far above the published gap as measured, where that gap
            decides it unreplayed (``torch_adapters.band_low_micro_batch``; None: it does not).
    """
    spec = report.spec
    cpu = spec.hardware.device_type is DeviceType.CPU
    where = spec.hardware.gpu_name or ("RAM (CPU run)" if cpu else "the GPU")
    verdict = "REFUSED" if report.refused else "FITS" if report.fits and not report.errors else (
        "FITS, WITH ERRORS" if report.fits else "DOES NOT FIT")
    lines = [
        f"{verdict}: {spec.model.model_id}, micro-batch {spec.batch.micro_batch} x seq {spec.batch.seq_len}: "
        f"{format_bytes(report.device_used_bytes)} of {format_bytes(report.budget_bytes)} on {where}",
        f"peak: {format_bytes(report.peak_allocated_bytes)} allocated {phase_phrase(report.peak_phase)}; "
        + (f"headroom {format_bytes(report.headroom_bytes)}" if report.headroom_bytes >= 0
           else f"short by {format_bytes(-report.headroom_bytes)}"),
    ]
    errors = [f for f in (*report.refused, *report.errors) if f.code != "does-not-fit"]
    for finding in list(dict.fromkeys(errors))[:2]:
        lines.append(f"[error] {finding.code}: {finding.message}")
        if finding.hint:
            lines.append(f"  fix: {finding.hint}")
    if report.refused:
        return [_cut(line) for line in lines[:MAX_LINES]]
    warned = [f.code for f in report.findings if f.severity.value == "warning"]
    if warned:
        lines.append(f"warnings: {', '.join(dict.fromkeys(warned))} (the full report, without --brief, says more)")
    if isinstance(max_micro_batch, int) and max_micro_batch > 0:
        caveat = f" ({band_low or 'none'} if reserved is as high as measured)" if isinstance(band_low, int) else ""
        lines.append(f"largest micro-batch that fits at this length: {max_micro_batch}{caveat}")
    fitting = [s for s in suggestions if s.fits]
    if not (report.fits and not report.errors) and fitting:
        best = fitting[0]
        lines.append(f"best fix: {best.title} ({format_bytes(best.device_used_bytes)}, "
                     f"{best.relative_step_time:.2f}x time/token)")
        lines.append("  append: " + " ".join(best.argv))
    elif not report.fits:
        lines.append("best fix: none of the suggestions fits; see the full report (without --brief)")
    return [_cut(line) for line in lines[:MAX_LINES]]
