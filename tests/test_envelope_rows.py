"""``catalog.envelope_ranges`` reads ``envelope_ranges.json`` row by row (``RangeRows``): the same mapping as the
whole file parsed, for the shipped file and for any other JSON layout; a malformed row is refused when read."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from fitcheck.catalog import envelope_ranges
from fitcheck.catalog.envelope_cells import ENVELOPE_RANGES_FILE, RangeRows


def _shipped() -> str:
    return resources.files("fitcheck.catalog").joinpath(ENVELOPE_RANGES_FILE).read_text(encoding="utf-8")


def test_rows_read_one_by_one_equal_the_whole_file_parsed() -> None:
    whole = json.loads(_shipped())
    rows = envelope_ranges()
    assert list(rows) == list(whole) and len(rows) == len(whole) > 500
    assert all(rows[label] == whole[label] for label in whole)
    assert "no/such/kind" not in rows and rows.get("no/such/kind") is None
    with pytest.raises(KeyError):
        rows["no/such/kind"]


@pytest.mark.parametrize("layout", [{}, {"indent": 2}, {"separators": (",", ":")}, {"indent": 1}])
def test_any_json_layout_reads_the_same(layout: dict[str, object]) -> None:
    data = {"a/b": {"shapes": [[0, 512, 1]], "within": True}, 'q"uote\\d': {"shapes": [], "within": False,
                                                                           "note": "x\n \"y\": 1"}}
    rows = RangeRows(json.dumps(data, **layout))  # type: ignore[arg-type]
    assert dict(rows) == data


def test_a_malformed_row_is_refused_when_read() -> None:
    rows = RangeRows(json.dumps({"good": {"shapes": [], "within": True}, "bad": {"shapes": 3}}, indent=1))
    assert rows["good"]["within"] is True
    with pytest.raises(ValueError, match="bad: a row needs a 'shapes' list"):
        rows["bad"]
