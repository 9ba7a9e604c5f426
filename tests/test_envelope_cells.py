"""The checked envelope's cells live in data (fitcheck/catalog/envelope_cells.json), written by the benchmarks.

The core reads the cells through the catalog's loader and holds only the rules; ``benchmarks/formula_vs_trace.py
--update`` rewrites its own block and keeps the others. These tests hold the file to what its writer would write.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fitcheck.catalog import CellBlock, dump_envelope_blocks, envelope_blocks, envelope_cells, parse_envelope_blocks
from fitcheck.core.activations import CHECKED

ROOT = Path(__file__).resolve().parents[1]


def _grid_rule(cells: dict[str, float | str]) -> frozenset[tuple[str, str, bool, str, str]]:
    keys = set()
    for label, err in cells.items():
        family, method, ck, attn, precision, _ = label.split("/")
        if isinstance(err, float | int) and abs(err) <= 2:
            keys.add((family, method, ck == "ckpt", attn, precision))
    return frozenset(keys)


def test_the_grid_block_is_what_the_cells_file_gives() -> None:
    cells = json.loads((ROOT / "benchmarks" / "data" / "formula_vs_trace_cells.json").read_text())
    grid = {b.name: b for b in envelope_blocks()}["formula_vs_trace"]
    assert grid.cells == _grid_rule(cells)


def test_the_core_reads_every_block_and_nothing_else() -> None:
    from fitcheck.core.activations.envelope import CHECKED_INT8

    names = [b.name for b in envelope_blocks()]
    assert names == ["formula_vs_trace", "moe_mla_vs_trace", "qlora_noprep", "int8_vs_trace"]
    assert envelope_cells(*names[:3]) == CHECKED
    assert envelope_cells("int8_vs_trace") == CHECKED_INT8
    with pytest.raises(KeyError, match="no block"):
        envelope_cells("nope")


def test_dump_and_parse_round_trip_and_bad_cells_name_the_file() -> None:
    blocks = envelope_blocks()
    assert parse_envelope_blocks(dump_envelope_blocks(blocks)) == blocks
    bad = dump_envelope_blocks((CellBlock("x", "y", frozenset()),)).replace("[\n\n", '[\n["llama", "full"]\n')
    with pytest.raises(ValueError, match=r"envelope_cells\.json"):
        parse_envelope_blocks(bad)


def test_update_rewrites_only_its_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import formula_vs_trace

    shipped = ROOT / "fitcheck" / "catalog" / "envelope_cells.json"
    envelope, cells = tmp_path / "envelope_cells.json", tmp_path / "cells.json"
    envelope.write_text(shipped.read_text())
    cells.write_text((ROOT / "benchmarks" / "data" / "formula_vs_trace_cells.json").read_text())
    monkeypatch.setattr(formula_vs_trace, "ENVELOPE", envelope)
    monkeypatch.setattr(formula_vs_trace, "CELLS", cells)
    formula_vs_trace.update_envelope([])
    after = parse_envelope_blocks(envelope.read_text())
    assert [(b.name, b.cells) for b in after] == [(b.name, b.cells) for b in envelope_blocks()]
    assert after[1:] == envelope_blocks()[1:]
