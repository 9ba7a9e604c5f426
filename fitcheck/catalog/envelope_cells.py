"""The checked envelope's cells as data: ``envelope_cells.json`` beside this module, read once at import.

Each block of the file is one benchmark's result, written by that benchmark (``benchmarks/formula_vs_trace.py
--update`` rewrites its own block; the others were checked by the scripts their ``source`` names and are kept as
they are). A cell is a kind of run: (family, method, checkpointing, attention, precision). The rules that read
the cells (which spec is which cell, what a cell outside means) live in ``fitcheck.core.activations.envelope``;
this module only loads and writes the table. Data is read with :mod:`importlib.resources`, so it works from a
wheel. No torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

EnvelopeKey = tuple[str, str, bool, str, str]

ENVELOPE_CELLS_FILE = "envelope_cells.json"


@dataclass(frozen=True)
class CellBlock:
    """One benchmark's checked cells.

    Attributes:
        name: The block's key (``"formula_vs_trace"``, ``"moe_mla_vs_trace"``, ``"qlora_noprep"``,
            ``"int8_vs_trace"``).
        source: Which run checked the cells, when, and what stays outside.
        cells: The (family, method, checkpointing, attention, precision) kinds within tolerance at that run.
    """

    name: str
    source: str
    cells: frozenset[EnvelopeKey]


def _cell(raw: Any, where: str) -> EnvelopeKey:
    """One cell from its JSON list, checked for shape and types."""
    ok = (isinstance(raw, list) and len(raw) == 5 and isinstance(raw[2], bool)
          and all(isinstance(raw[i], str) for i in (0, 1, 3, 4)))
    if not ok:
        raise ValueError(f"{ENVELOPE_CELLS_FILE}: {where}: a cell is [family, method, checkpointing (bool), "
                         f"attention, precision], got {raw!r}")
    return (raw[0], raw[1], raw[2], raw[3], raw[4])


def parse_envelope_blocks(text: str) -> tuple[CellBlock, ...]:
    """The blocks of an ``envelope_cells.json`` text.

    Args:
        text: The file's JSON: ``{"blocks": [{"name", "source", "cells": [[...], ...]}, ...]}``.

    Returns:
        The blocks in file order.

    Raises:
        ValueError: If a block or cell is malformed, or two blocks share a name.
    """
    blocks: list[CellBlock] = []
    for raw in json.loads(text)["blocks"]:
        name = raw["name"]
        if any(b.name == name for b in blocks):
            raise ValueError(f"{ENVELOPE_CELLS_FILE}: block {name!r} appears twice")
        cells = frozenset(_cell(c, f"block {name!r}") for c in raw["cells"])
        blocks.append(CellBlock(name=name, source=raw["source"], cells=cells))
    return tuple(blocks)


def dump_envelope_blocks(blocks: tuple[CellBlock, ...]) -> str:
    """The JSON text of ``blocks``, one sorted cell per line (stable diffs when a benchmark rewrites it)."""
    parts = []
    for block in blocks:
        cells = ",\n".join(f"    {json.dumps(list(c))}" for c in sorted(block.cells))
        parts.append(f'  {{"name": {json.dumps(block.name)},\n   "source": {json.dumps(block.source)},\n'
                     f'   "cells": [\n{cells}\n   ]}}')
    return '{"blocks": [\n' + ",\n".join(parts) + "\n]}\n"


@lru_cache(maxsize=1)
def envelope_blocks() -> tuple[CellBlock, ...]:
    """Every block of the shipped ``envelope_cells.json``, loaded once."""
    text = resources.files("fitcheck.catalog").joinpath(ENVELOPE_CELLS_FILE).read_text(encoding="utf-8")
    return parse_envelope_blocks(text)


def envelope_cells(*names: str) -> frozenset[EnvelopeKey]:
    """The union of the named blocks' cells.

    Args:
        names: Block names; each must be in the file.

    Returns:
        Every cell of those blocks.

    Raises:
        KeyError: If a name is not a block of the file.
    """
    by_name = {b.name: b for b in envelope_blocks()}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"{ENVELOPE_CELLS_FILE} has no block {missing} (blocks: {sorted(by_name)})")
    return frozenset().union(*(by_name[n].cells for n in names))


ENVELOPE_RANGES_FILE = "envelope_ranges.json"
ENVELOPE_PROBE_MISSES_FILE = "envelope_probe_misses.json"


def _check_range_row(label: str, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict) or not isinstance(row.get("shapes"), list) or not isinstance(row.get("within"), bool):
        raise ValueError(f"{ENVELOPE_RANGES_FILE}: {label}: a row needs a 'shapes' list and a boolean 'within'")
    return row


class RangeRows(Mapping[str, dict[str, Any]]):
    """``envelope_ranges.json`` read row by row: label -> row, each row parsed (and checked) when first asked.

    An answer asks for one or two of its ~550 rows, and parsing the whole 0.7 MB file cost ~15 ms of CPU per fresh
    process (a twentieth of issue 20's 0.3 s for the formula answer). The file is written by
    ``benchmarks/envelope_ranges.py`` with ``json.dumps(indent=1, sort_keys=True)``: each top-level key starts a
    line with one space (a raw newline never occurs inside a JSON string, and nested keys are indented further),
    so the keys are found by that line start and a row is decoded from its offset. A text in any other layout is
    parsed whole, as before.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._rows: dict[str, dict[str, Any]] = {}
        self._at: dict[str, int] = {}
        pos = text.find('\n "')
        while pos >= 0:
            end = text.find('"', pos + 3) + 1
            label = text[pos + 3:end - 1]
            if "\\" in label or not text.startswith(": ", end):  # an escape in a label: read it all as JSON
                self._at = {}
                break
            self._at[label] = end + 2
            pos = text.find('\n "', end)
        if not self._at or not text.startswith('{\n "'):  # not the benchmark's layout: the whole file, checked
            whole: dict[str, Any] = json.loads(text)
            self._rows = {label: _check_range_row(label, row) for label, row in whole.items()}
            self._at = dict.fromkeys(self._rows, 0)

    def __getitem__(self, label: str) -> dict[str, Any]:
        row = self._rows.get(label)
        if row is None:
            at = self._at[label]  # KeyError for a label that is not a row
            row = self._rows[label] = _check_range_row(label, json.JSONDecoder().raw_decode(self._text, at)[0])
        return row

    def __contains__(self, label: object) -> bool:
        return label in self._at

    def __iter__(self) -> Iterator[str]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)


@lru_cache(maxsize=1)
def envelope_ranges() -> RangeRows:
    """The shipped ``envelope_ranges.json``: kind label (``family/method/ckpt|nockpt/attn/precision``) -> the
    shapes it was checked at (``[width, sequence, micro-batch]``), the worst error per phase, whether it was within
    tolerance at every shape and phase. Written by ``benchmarks/envelope_ranges.py``; loaded once, each row parsed
    when first read (:class:`RangeRows`).

    Raises:
        ValueError: If a row read has no ``shapes`` list or no boolean ``within``.
    """
    text = resources.files("fitcheck.catalog").joinpath(ENVELOPE_RANGES_FILE).read_text(encoding="utf-8")
    return RangeRows(text)


@lru_cache(maxsize=1)
def envelope_probe_misses() -> dict[str, list[dict[str, Any]]]:
    """The shipped ``envelope_probe_misses.json``: kind label -> the off-grid probes of it that were more than 2 % off
    a trace (``{"model", "seq", "batch", "errors": {phase: %}, "seed"}``), written by ``benchmarks/pinned_probes.py
    --record-misses`` and cleared by its ``--recheck``; loaded once. A kind listed here is not pinned, whatever its
    range row says (``core.activations.envelope.in_envelope``).

    Raises:
        ValueError: If an entry is not a non-empty list of probes.
    """
    path = resources.files("fitcheck.catalog").joinpath(ENVELOPE_PROBE_MISSES_FILE)
    if not path.is_file():
        return {}
    rows: dict[str, list[dict[str, Any]]] = json.loads(path.read_text(encoding="utf-8"))
    for label, probes in rows.items():
        if not isinstance(probes, list) or not probes or not all(isinstance(p, dict) for p in probes):
            raise ValueError(f"{ENVELOPE_PROBE_MISSES_FILE}: {label}: expected a non-empty list of probes")
    return rows
