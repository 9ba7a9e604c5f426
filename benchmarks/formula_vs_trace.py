"""Formula vs fake-tensor trace at real widths: worst |formula − trace| per family and method.

For every catalog family (one real model each, ``fitcheck.torch_adapters.differential.FAMILY_MODELS``) ×
full / LoRA / QLoRA / 8-bit / DoRA / partial freeze × checkpointing on/off × SDPA/eager × bf16 / fp32+autocast,
with the (short/long sequence, micro-batch 1/4) pair rotating over the cells, the same CPU spec is estimated
with the pure formulas and with traced activations (``differential.compare``). Prints one line per cell with
``-v``, then the worst signed error per family × method, and the cells that could not be traced.

Run: ``PYTHONPATH=. python benchmarks/formula_vs_trace.py [-v] [--json FILE] [family ...] [method ...]``
"""

from __future__ import annotations

import json
import sys
import time

from fitcheck.torch_adapters.differential import FAMILY_MODELS, METHODS, Outcome, compare, grid, model_config


def main(argv: list[str]) -> int:
    """Run the grid; print the tables; exit 1 when any traced cell is off by more than 2 %."""
    verbose = "-v" in argv
    out_file = argv[argv.index("--json") + 1] if "--json" in argv else None
    names = [a for a in argv if not a.startswith("-") and a != out_file]
    methods = tuple(m for m in METHODS if m in names) or METHODS
    families = tuple(f for f in FAMILY_MODELS if f in names) or tuple(FAMILY_MODELS)
    results: list[Outcome] = []
    start = time.perf_counter()
    for family in families:
        cfg = model_config(family)
        for cell in grid((family,), methods):
            o = compare(cell, cfg)
            results.append(o)
            if verbose:
                what = o.refused or f"{o.error * 100:+7.2f}%"
                print(f"{cell.label:48} {what}", flush=True)
    print(f"\nworst signed error (formula − trace) / trace per family × method, {len(results)} cells, "
          f"{time.perf_counter() - start:.0f} s; '-' = not traceable")
    print(f"{'family':8} " + " ".join(f"{m:>8}" for m in methods))
    worst = 0.0
    for family in families:
        row = []
        for method in methods:
            cells = [o for o in results if o.cell.family == family and o.cell.method == method and not o.refused]
            if not cells:
                row.append(f"{'-':>8}")
                continue
            w = max(cells, key=lambda o: abs(o.error))
            worst = max(worst, abs(w.error))
            row.append(f"{w.error * 100:+7.2f}%")
        print(f"{family:8} " + " ".join(row))
    refused = sorted({(o.cell.family, o.cell.method, o.refused) for o in results if o.refused})
    if refused:
        print("\nnot traceable:")
        for family, method, why in refused:
            print(f"  {family}/{method}: {why}")
    print(f"\nworst |error| over traced cells: {worst * 100:.2f}%")
    if out_file:
        rows = [{"cell": o.cell.label, "error": o.error, "refused": o.refused} for o in results]
        with open(out_file, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if worst <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
