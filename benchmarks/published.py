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
- "resident": ``memory_allocated()`` right after ``optimizer.step()`` (peft's MetaMathQA results log it) -> the
  model states and allocator-counted overheads at the optimizer-step phase; not a peak, summarised on its own line
- "reserved: 99th percentile" of per-step ``memory_reserved()`` samples (peft's MetaMathQA) -> ``peak_reserved_bytes``
  as ``reserved-p99``: a lower bound of the steps' peak, summarised on its own line

It prints one line per row (signed error = (estimate - measured) / measured), rows it cannot express with the
reason (a run's several figures skipped for one reason are one line), OOM rows with the verdict, the median and
p90 absolute error by source group, and the same by stack: each row's ``stack`` says whether the run used the
Hugging Face stack (transformers' modelling code with peft / TRL / the Trainer: ``"hf"``) or another framework
(``"other"``: torchtune, litgpt, torchtitan, torchao, and ms-swift, whose Qwen-v1 models are remote code), with
the false "fits" (OOM rows predicted to fit) per stack. Nothing here is tuned to these numbers.

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

from fitcheck.report import Category, Location, Phase

STACKS = (("hf", "Hugging Face stack"), ("other", "other frameworks"))
PEAK_METRICS = ("allocated", "reserved", "used")
LABEL = 43  # width of the summary's first column (the longest source group fits)


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
        "resident": _resident_after_step(report),
        "reserved-p99": report.peak_reserved_bytes,
    }[plan.metric]
    err = None if plan.measured_bytes is None else (value - plan.measured_bytes) / plan.measured_bytes
    traced = any(c.name == "activations.traced" for c in report.components)
    notes: list[str] = []
    if plan.stated_trainable is not None and plan.stated_trainable != report.trainable_params:
        notes.append(f"trainable {plan.stated_trainable:,} (source) vs {report.trainable_params:,} (fitcheck)")
    return Result(plan, value, report.fits, spec.model.total_params, err,
                  {"phase": report.peak_phase.value, "traced": traced, "pinned": report.pinned, "notes": notes})


_STATES = (Category.WEIGHTS, Category.ADAPTERS, Category.QUANT_META, Category.GRADIENTS, Category.OPTIMIZER,
           Category.MASTER, Category.OVERHEAD)


def _resident_after_step(report: Any) -> int:
    """What ``torch.cuda.memory_allocated()`` holds right after ``optimizer.step()``: the device components of the
    model states (weights, adapters, quantization metadata, gradients, optimizer states, master weights) and the
    allocator-counted overheads (cuBLAS workspace) at the optimizer-step phase, without the step's temporaries."""
    return sum(c.at(Phase.OPTIMIZER_STEP) for c in report.components
               if c.location is Location.DEVICE and c.category in _STATES)


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


def _print_skipped(skipped: Sequence[Skip]) -> None:
    """Every row not compared, with its reason; a run's several figures (``<id>@<suffix>``) skipped for one reason
    are one line."""
    lines: dict[tuple[str, str, str], list[str]] = {}
    for s in skipped:
        base, _, suffix = s.row_id.partition("@")
        lines.setdefault((base, s.group, s.reason), []).append(suffix or "max")
    print(f"\nskipped ({len(lines)} runs, {len(skipped)} rows):")
    width = max([16] + [len(base) + 2 for base, _, _ in lines])
    for (base, group, reason), figures in sorted(lines.items(), key=lambda kv: (_group_order(kv[0][1]), kv[0][0])):
        more = f" [{len(figures)} figures]" if len(figures) > 1 else ""
        print(f"  {base:<{width}}{group[:30]:<31}{reason}{more}")


def _stats_line(label: str, errs: Sequence[float], false_fits: int | None = None) -> str:
    absd = [abs(e) for e in errs]
    line = (f"{label:<{LABEL}}{len(errs):>5}{100 * statistics.median(absd):>13.1f}%"
            f"{100 * _quantile(absd, 0.9):>10.1f}%{_pct(statistics.median(errs)):>12}")
    above = sum(e > 0 for e in errs)
    line += f"{f'{above}/{len(errs) - above}':>11}"
    return line + ("" if false_fits is None else f"{false_fits:>12}")


def _print_summary(results: Sequence[Result], path: str) -> None:
    """Median / p90 |error| and the signed median by source group, then by stack (``row["stack"]``) with the
    false "fits" (OOM rows predicted to fit), then ALL."""
    peak = [r for r in results if r.plan.metric in PEAK_METRICS]
    head = f"{'group':<{LABEL}}{'rows':>5}{'median |err|':>14}{'p90 |err|':>11}{'median err':>12}{'over/under':>11}"
    print(head)
    for g in sorted({r.plan.group for r in peak}, key=_group_order):
        errs = [r.error for r in peak if r.plan.group == g and r.error is not None]
        if errs:
            print(_stats_line(g, errs))
    print(f"\n{head.replace('group', 'stack', 1)}{'false fits':>12}   (path {path})")
    for key, label in STACKS:
        rows = [r for r in peak if r.plan.stack == key]
        errs = [r.error for r in rows if r.error is not None]
        wrong = sum(1 for r in rows if r.plan.measured_bytes is None and r.fits)
        ooms = sum(1 for r in rows if r.plan.measured_bytes is None)
        if errs:
            print(_stats_line(label, errs, wrong) + f" of {ooms} OOM rows")
        elif ooms:
            print(f"{label:<{LABEL}}{0:>5}{'':>48}{wrong:>12} of {ooms} OOM rows")
    errs = [r.error for r in peak if r.error is not None]
    if errs:
        wrong = sum(1 for r in peak if r.plan.measured_bytes is None and r.fits)
        ooms = sum(1 for r in peak if r.plan.measured_bytes is None)
        print(_stats_line("ALL", errs, wrong) + f" of {ooms} OOM rows")


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison table, the skipped rows and the per-group error statistics."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--group", default=None, help="only rows of this source_group")
    parser.add_argument("--path", choices=("formula", "default"), default="formula",
                        help="formula: the pure formulas; default: the CLI's default path (PinnedPath auto: the "
                             "formula where pinned, else a fake-tensor trace when torch is installed)")
    args = parser.parse_args(argv)
    path: Any = None  # PinnedPath for the default path: one per row
    if args.path == "default":
        from fitcheck.torch_adapters import PinnedPath

        path = PinnedPath
    rows = [r for r in load_rows(args.data) if args.group is None or r["source_group"] == args.group]
    plans = [plan_row(r) for r in rows]
    results: list[Result] = []
    skipped: list[Skip] = [p for p in plans if isinstance(p, Skip)]
    for p in plans:
        if isinstance(p, Plan):
            try:
                # a fresh path per row: each row is the headline of its own `fitcheck estimate` (the headline's
                # whole run is replayed: verdict_replay.NearBudget), as the CLI answers it
                results.append(run_plan(p, None if path is None else PinnedPath("auto")))
            except Exception as exc:  # a benchmark reports every row, even a failing one
                skipped.append(Skip(p.row_id, p.group, f"estimate failed: {type(exc).__name__}: {exc}", p.stack))
    results.sort(key=lambda r: (_group_order(r.plan.group), r.plan.row_id))
    width = max([16] + [len(r.plan.row_id) + 2 for r in results])
    print(f"{'row':<{width}}{'group':<31}{'metric':<13}{'measured':>10}{'estimate':>10}{'error':>9}  notes")
    for r in results:
        p = r.plan
        metric = p.metric + ("" if p.metric_sure else "?")
        notes = ", ".join([*p.notes, *r.extra["notes"]])
        if p.measured_bytes is None:
            verdict = "predicted OOM (ok)" if not r.fits else "predicted fit (WRONG)"
            print(
                f"{p.row_id:<{width}}{p.group[:30]:<31}{'OOM':<13}{'-':>10}{r.estimate_bytes / GIB:>10.2f}"
                f"{'':>9}  {verdict}; {notes}"
            )
            continue
        assert r.error is not None
        print(
            f"{p.row_id:<{width}}{p.group[:30]:<31}{metric:<13}{p.measured_bytes / GIB:>10.2f}"
            f"{r.estimate_bytes / GIB:>10.2f}{_pct(r.error):>9}  {r.extra['phase']}"
            f"{'; traced' if r.extra['traced'] else ''}{'' if r.extra['pinned'] else '; not pinned'}; {notes}"
        )
    _print_skipped(skipped)
    print(f"\npeak rows (metric allocated / reserved / used; path {args.path}):")
    _print_summary(results, args.path)
    for metric, what in (
        ("reserved-p99", "99th percentile of the per-step reserved (metric reserved-p99; a lower bound of the "
                         "steps' peak, compared with peak_reserved; not in the lines above)"),
        ("resident", "allocated right after the optimizer step (metric resident; not a peak, not in the lines above)"),
    ):
        errs = [r.error for r in results if r.plan.metric == metric and r.error is not None]
        if errs:
            absd = [abs(e) for e in errs]
            print(f"\n{what}: {len(errs)} rows, median |err| {100 * statistics.median(absd):.1f}%, "
                  f"median err {_pct(statistics.median(errs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
