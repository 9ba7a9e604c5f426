"""Published measurements estimated for the library versions they were measured on (``--stack``), row by row.

For each HF-stack row whose source states (or dates) its environment, the row is estimated twice: for the
modelled stack (transformers 5.23, as ``published.py`` does) and for the row's own versions
(``fitcheck.spec.StackSpec``, what ``fitcheck estimate --stack ...`` passes), and both are compared with the
measurement like with like. Rows run by other stacks (torchtune, litgpt, torchtitan) use no transformers code
and are not listed.

Run: ``python benchmarks/published_stack.py [--data PATH]``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from published_rows import DEFAULT_DATA, GIB, Plan, inventory_for, load_rows, plan_row

from fitcheck.core import estimate
from fitcheck.readers import inventory_for_stack, parse_stack
from fitcheck.spec import StackSpec, TrainingSpec

# source_group -> (--stack text, where the versions come from)
STACKS: Mapping[str, tuple[str, str]] = {
    "ms-swift-benchmark": (
        "transformers=4.36,torch=2.1.1,bitsandbytes=0.41.3",
        "Benchmark.md states torch 2.1.1, flash_attn 2.3.4, bitsandbytes 0.41.3.post2 (Dec 2023); transformers is "
        "not stated: 4.36 (released 2023-12-11) is INFERRED from those pins. Qwen-v1 runs its own remote-code loss",
    ),
    "peft-MetaMathQA-benchmark": (
        "transformers=5.13.1",
        "the result JSONs state transformers 5.13.1",
    ),
}


def _value(spec: TrainingSpec, metric: str) -> tuple[int, str]:
    report = estimate(spec)
    value = {"allocated": report.peak_allocated_bytes, "reserved": report.peak_reserved_bytes,
             "used": report.device_used_bytes}[metric]
    return value, report.peak_phase.value


def _with_stack(spec: TrainingSpec, stack: StackSpec) -> TrainingSpec:
    return dataclasses.replace(spec, stack=stack, model=inventory_for_stack(spec.model, stack))


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line per row: measured, estimate for 5.23, estimate for the row's stack, and the errors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    print("| row | stack | metric | measured GiB | est. 5.23 GiB (err) | est. --stack GiB (err) | peak phase | moved |")
    print("|---|---|---|---|---|---|---|---|")
    for row in load_rows(args.data):
        group = str(row["source_group"])
        if group not in STACKS:
            continue
        plan = plan_row(row)
        if not isinstance(plan, Plan) or plan.measured_bytes is None:
            continue
        base = plan.build(inventory_for(plan.model))
        stack = parse_stack(STACKS[group][0])
        before, _ = _value(base, plan.metric)
        after, phase = _value(_with_stack(base, stack), plan.metric)
        measured = plan.measured_bytes
        e0, e1 = (before - measured) / measured, (after - measured) / measured
        moved = "toward" if abs(e1) < abs(e0) else ("same" if abs(e1) == abs(e0) else "away")
        print(f"| {plan.row_id} | {STACKS[group][0]} | {plan.metric} | {measured / GIB:.2f} | "
              f"{before / GIB:.2f} ({e0:+.1%}) | {after / GIB:.2f} ({e1:+.1%}) | {phase} | {moved} |")
    print()
    for group, (text, why) in STACKS.items():
        print(f"- {group}: --stack {text}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
