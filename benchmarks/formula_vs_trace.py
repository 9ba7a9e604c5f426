"""Formula vs fake-tensor trace at real widths: worst |formula − trace| per family and method.

For every catalog family (one real model each, ``fitcheck.torch_adapters.differential.FAMILY_MODELS``) ×
full / LoRA / QLoRA / 8-bit / DoRA / partial freeze × checkpointing on/off × SDPA/eager × bf16 / fp32+autocast,
with the (short/long sequence, micro-batch 1/4) pair rotating over the cells, the same CPU spec is estimated
with the pure formulas and with traced activations (``differential.compare``). Prints one line per cell with
``-v``, then the worst signed error per family × method, and the cells that could not be traced.

Run: ``PYTHONPATH=. python benchmarks/formula_vs_trace.py [-v] [--json FILE] [--update] [family ...] [method ...]``

``--update`` merges this run's cells into ``benchmarks/data/formula_vs_trace_cells.json`` (label -> signed error
in %, or the refusal) and rewrites the ``formula_vs_trace`` block of ``fitcheck/catalog/envelope_cells.json`` (the
data ``fitcheck.core.activations.envelope.CHECKED`` reads) from that whole file: the block is exactly the cells
within 2 % at their last run, never edited by hand.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import date
from pathlib import Path

from fitcheck.catalog import ENVELOPE_CELLS_FILE, CellBlock, EnvelopeKey, dump_envelope_blocks, parse_envelope_blocks
from fitcheck.core.activations import TOLERANCE
from fitcheck.torch_adapters import FAMILY_MODELS, METHODS, Outcome, compare, grid, model_config


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
ENVELOPE = Path(__file__).parents[1] / "fitcheck" / "catalog" / ENVELOPE_CELLS_FILE


def update_envelope(results: list[Outcome]) -> None:
    """Merge the run into the cells file and regenerate this grid's block of the envelope data from all cells.

    The other blocks of ``fitcheck/catalog/envelope_cells.json`` (cells checked by other benchmarks:
    ``moe_mla_vs_trace.py``, ``int8_vs_trace.py``, the QLoRA-without-preparation run) are kept as they are.
    """
    cells: dict[str, float | str] = json.loads(CELLS.read_text()) if CELLS.exists() else {}
    for o in results:
        cells[o.cell.label] = o.refused or round(o.error * 100, 2)
    CELLS.write_text(json.dumps(cells, indent=0))
    keys: set[EnvelopeKey] = set()
    for label, err in cells.items():
        family, method, ck, attn, precision, _ = label.split("/")
        if isinstance(err, float | int) and abs(err) <= TOLERANCE * 100:
            keys.add((family, method, ck == "ckpt", attn, precision))
    within = sum(1 for e in cells.values() if isinstance(e, float | int) and abs(e) <= TOLERANCE * 100)
    blocks = parse_envelope_blocks(ENVELOPE.read_text(encoding="utf-8"))
    source = (f"benchmarks/formula_vs_trace.py --update, {date.today()}: {within} of {len(cells)} cells within 2 % "
              "of the trace (the table is in benchmarks/README.md). Refused by the tracer, hence never here: 8-bit "
              "bases, LoRA on Mixtral's fused experts with dropout (peft ParamWrapper).")
    grid_block = CellBlock(name="formula_vs_trace", source=source, cells=frozenset(keys))
    blocks = tuple(grid_block if b.name == grid_block.name else b for b in blocks)
    ENVELOPE.write_text(dump_envelope_blocks(blocks), encoding="utf-8")
    print(f"\nenvelope: {len(keys)} kinds of run from {within} of {len(cells)} cells within 2 % ({CELLS.name})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
