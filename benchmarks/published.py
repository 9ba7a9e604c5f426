"""fitcheck's estimates against published GPU memory measurements.

Reads ``published_measurements.json`` (default: the copy in ``benchmarks/calibration/``, or ``--data PATH``), turns each
row into a :class:`fitcheck.spec.TrainingSpec` the way the row describes its run (``published_rows.py``),
estimates it, and compares LIKE WITH LIKE per the row's ``memory_metric``:

- ``max_memory_allocated`` / "peak memory allocated"  -> ``Report.peak_allocated_bytes``
- peak *active* bytes (torch ``active_bytes.all.peak``) -> ``peak_allocated_bytes`` (active >= allocated only
  by blocks freed but awaiting a stream sync; same number in a single-stream step)
- ``max_memory_reserved`` / "reserved"               -> ``Report.peak_reserved_bytes``
- nvidia-smi "used"                                  -> ``Report.device_used_bytes``
- torchtune "Peak Memory per GPU" that does not say which -> reserved, flagged ``?`` in the table

It prints one line per row (signed error = (estimate - measured) / measured), rows it cannot express with the
reason, OOM rows with the verdict, and the median and p90 absolute error by source group, HF-stack groups
(ms-swift, PEFT, LLaMA-Factory) first. Nothing here is tuned to these numbers.

``--path default`` estimates every row the way ``fitcheck estimate`` answers by default (the formula where it is
pinned, otherwise a fake-tensor trace, ``fitcheck.torch_adapters.PinnedPath``); each row then says whether it
was traced and whether it is pinned.

Run: ``python benchmarks/published.py [--data PATH] [--group NAME] [--path formula|default]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from published_rows import DEFAULT_DATA, GIB, HF_GROUPS, Plan, Skip, inventory_for, load_rows, plan_row


@dataclass
class Result:
    """One compared row."""

    plan: Plan
    estimate_bytes: int
    fits: bool
    params: int
    error: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_plan(plan: Plan, default_path: Any = None) -> Result:
    """Estimate one planned row and compare it with its measurement.

    Args:
        plan: The row.
        default_path: A ``fitcheck.torch_adapters.PinnedPath`` to estimate with (the CLI's default path: the
            formula where pinned, else a trace); None for the pure formulas.
    """
    from fitcheck.core import estimate

    spec = plan.build(inventory_for(plan.model))
    report = estimate(spec) if default_path is None else default_path(spec)
    value = {
        "allocated": report.peak_allocated_bytes,
        "reserved": report.peak_reserved_bytes,
        "used": report.device_used_bytes,
    }[plan.metric]
    err = None if plan.measured_bytes is None else (value - plan.measured_bytes) / plan.measured_bytes
    traced = any(c.name == "activations.traced" for c in report.components)
    return Result(plan, value, report.fits, spec.model.total_params, err,
                  {"phase": report.peak_phase.value, "traced": traced, "pinned": report.pinned})


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _group_order(group: str) -> tuple[int, str]:
    return (HF_GROUPS.index(group) if group in HF_GROUPS else len(HF_GROUPS), group)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison table, the skipped rows and the per-group error statistics."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--group", default=None, help="only rows of this source_group")
    parser.add_argument("--path", choices=("formula", "default"), default="formula",
                        help="formula: the pure formulas; default: the CLI's default path (PinnedPath auto: the "
                             "formula where pinned, else a fake-tensor trace when torch is installed)")
    args = parser.parse_args(argv)
    path = None
    if args.path == "default":
        from fitcheck.torch_adapters import PinnedPath

        path = PinnedPath("auto")
    rows = [r for r in load_rows(args.data) if args.group is None or r["source_group"] == args.group]
    plans = [plan_row(r) for r in rows]
    results: list[Result] = []
    skipped: list[Skip] = [p for p in plans if isinstance(p, Skip)]
    for p in plans:
        if isinstance(p, Plan):
            try:
                results.append(run_plan(p, path))
            except Exception as exc:  # a benchmark reports every row, even a failing one
                skipped.append(Skip(p.row_id, p.group, f"estimate failed: {type(exc).__name__}: {exc}"))
    results.sort(key=lambda r: (_group_order(r.plan.group), r.plan.row_id))
    print(f"{'row':<16}{'group':<31}{'metric':<11}{'measured':>10}{'estimate':>10}{'error':>9}  notes")
    for r in results:
        p = r.plan
        metric = p.metric + ("" if p.metric_sure else "?")
        if p.measured_bytes is None:
            verdict = "predicted OOM (ok)" if not r.fits else "predicted fit (WRONG)"
            print(
                f"{p.row_id:<16}{p.group[:30]:<31}{'OOM':<11}{'-':>10}{r.estimate_bytes / GIB:>10.2f}"
                f"{'':>9}  {verdict}; {', '.join(p.notes)}"
            )
            continue
        assert r.error is not None
        print(
            f"{p.row_id:<16}{p.group[:30]:<31}{metric:<11}{p.measured_bytes / GIB:>10.2f}"
            f"{r.estimate_bytes / GIB:>10.2f}{_pct(r.error):>9}  {r.extra['phase']}"
            f"{'; traced' if r.extra['traced'] else ''}{'' if r.extra['pinned'] else '; not pinned'}; "
            f"{', '.join(p.notes)}"
        )
    print(f"\nskipped ({len(skipped)}):")
    for s in sorted(skipped, key=lambda s: (_group_order(s.group), s.row_id)):
        print(f"  {s.row_id:<16}{s.group[:30]:<31}{s.reason}")
    print(f"\n{'group':<33}{'rows':>5}{'median |err|':>14}{'p90 |err|':>11}{'median err':>12}")
    groups = sorted({r.plan.group for r in results}, key=_group_order)
    all_errs: list[float] = []
    for g in groups:
        errs = [r.error for r in results if r.plan.group == g and r.error is not None]
        if not errs:
            continue
        all_errs.extend(errs)
        absd = [abs(e) for e in errs]
        print(
            f"{g:<33}{len(errs):>5}{100 * statistics.median(absd):>13.1f}%"
            f"{100 * _quantile(absd, 0.9):>10.1f}%{_pct(statistics.median(errs)):>12}"
        )
    if all_errs:
        absd = [abs(e) for e in all_errs]
        print(
            f"{'ALL':<33}{len(all_errs):>5}{100 * statistics.median(absd):>13.1f}%"
            f"{100 * _quantile(absd, 0.9):>10.1f}%{_pct(statistics.median(all_errs)):>12}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
