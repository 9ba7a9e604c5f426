"""Formula vs fake-tensor trace at real widths: worst |formula − trace| per family and method.

For every catalog family (one real model each, ``fitcheck.torch_adapters.differential.FAMILY_MODELS``) ×
full / LoRA / QLoRA / 8-bit / DoRA / partial freeze × checkpointing on/off × SDPA/eager × bf16 / fp32+autocast,
with the (short/long sequence, micro-batch 1/4) pair rotating over the cells, the same CPU spec is estimated
with the pure formulas and with traced activations (``differential.compare``). Prints one line per cell with
``-v``, then the worst signed error per family × method, and the cells that could not be traced.

Run: ``PYTHONPATH=. python benchmarks/formula_vs_trace.py [-v] [--json FILE] [--update] [family ...] [method ...]``

``--update`` merges this run's cells into ``benchmarks/data/formula_vs_trace_cells.json`` (label -> signed error
in %, or the refusal) and rewrites ``CHECKED`` in ``fitcheck/core/activations/envelope.py`` from that whole file:
the envelope is exactly the cells within 2 % at their last run, never edited by hand.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import date
from pathlib import Path

from fitcheck.core.activations.envelope import CHECKED, TOLERANCE
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
    if "--update" in argv:
        update_envelope(results)
    return 0 if worst <= 0.02 else 1


CELLS = Path(__file__).parent / "data" / "formula_vs_trace_cells.json"
ENVELOPE = Path(__file__).parents[1] / "fitcheck" / "core" / "activations" / "envelope.py"


def update_envelope(results: list[Outcome]) -> None:
    """Merge the run into the cells file and regenerate the envelope's CHECKED set from all cells."""
    cells: dict[str, float | str] = json.loads(CELLS.read_text()) if CELLS.exists() else {}
    for o in results:
        cells[o.cell.label] = o.refused or round(o.error * 100, 2)
    CELLS.write_text(json.dumps(cells, indent=0))
    keys = set()
    for label, err in cells.items():
        family, method, ck, attn, precision, _ = label.split("/")
        if isinstance(err, float | int) and abs(err) <= TOLERANCE * 100:
            keys.add((family, method, ck == "ckpt", attn, precision))
    within = sum(1 for e in cells.values() if isinstance(e, float | int) and abs(e) <= TOLERANCE * 100)
    body = "".join(f"    {k!r},\n" for k in sorted(keys))
    # families this grid has no cell for were checked by other benchmarks (moe_mla_vs_trace.py): kept as they are
    gridded = {label.split("/")[0] for label in cells}
    kept = sorted(k for k in CHECKED if k[0] not in gridded)
    if kept:
        body += "    # checked by benchmarks/moe_mla_vs_trace.py (families not in this grid), kept as they are\n"
        body += "".join(f"    {k!r},\n" for k in kept)
    src = ENVELOPE.read_text()
    head, rest = src.split("CHECKED: frozenset[EnvelopeKey] = frozenset({\n", 1)
    _, tail = rest.split("})\n", 1)
    head = re.sub(r"benchmarks/formula_vs_trace.py, [0-9-]+: \d+ of \d+ cells",
                  f"benchmarks/formula_vs_trace.py, {date.today()}: {within} of {len(cells)} cells", head)
    ENVELOPE.write_text(head + "CHECKED: frozenset[EnvelopeKey] = frozenset({\n" + body + "})\n" + tail)
    print(f"\nenvelope: {len(keys)} kinds of run from {within} of {len(cells)} cells within 2 % ({CELLS.name})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
