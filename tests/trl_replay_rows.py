"""The recorded rows of ``benchmarks/trl_replay.py`` (``benchmarks/data/trl_replay_cpu.json``): the real TRL trainer's
live-tensor peaks on CPU next to the whole-run replay's, checked by ``test_dpo_replay.py`` and ``test_kto_replay.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "trl_replay_cpu.json"


def recorded_rows() -> dict[str, Any]:
    """The file's rows by case name."""
    return {r["case"]: r for r in json.loads(DATA.read_text())["rows"]}


def check_replay_row(case: str) -> None:
    """The replay's allocated peak within 0.1 % of the real run's, over the three steps and in the last one; the
    plain Trainer's step replayed instead (what main composed before the trainer's own step) off by more than 10 %."""
    row = recorded_rows()[case]
    real, replay = row["real"], row["replay"]
    assert replay["peak"] == pytest.approx(real["peak"], rel=0.001)
    assert replay["last_step"] == pytest.approx(real["last_step"], rel=0.001)
    assert abs(row["plain_replay"]["peak"] / real["peak"] - 1) > 0.10


def check_precompute_row(case: str) -> None:
    """``precompute_ref_log_probs``: the pass before training, replayed in the setup, within 0.1 % of the real
    pass's live tensors."""
    row = recorded_rows()[case]
    assert row["replay"]["setup"] == pytest.approx(row["real"]["precompute"], rel=0.001)
