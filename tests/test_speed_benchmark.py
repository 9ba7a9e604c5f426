"""benchmarks/speed.py: the inputs it times, and the torch-free answer for known families."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import speed  # noqa: E402


def test_times_the_catalog_config_of_llama_3_70b() -> None:
    cfg = json.loads((speed.catalog_config_dir() / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 80 and cfg["hidden_size"] == 8192
    argv = speed.fitcheck_command()
    assert argv[1:4] == ["-m", "fitcheck.cli.main", "estimate"]
    assert "meta-llama/Meta-Llama-3-70B" in argv and "--json" in argv


@pytest.mark.slow
def test_accelerate_internals_the_benchmark_calls_still_exist() -> None:
    est = pytest.importorskip("accelerate.commands.estimate")
    from accelerate.utils import calculate_maximum_sizes, convert_bytes

    assert callable(calculate_maximum_sizes) and callable(convert_bytes)
    for name in ("create_ascii_table", "estimate_training_usage", "create_empty_model"):
        assert hasattr(est, name), name
    # the reason the benchmark builds the meta model itself: the command asks the Hub first
    assert "verify_on_hub" in inspect.getsource(est.create_empty_model)
    usage = est.estimate_training_usage(1000, "float32")
    assert usage["optimizer"] == 2000  # the "Training using Adam" column the benchmark prints


@pytest.mark.slow
def test_known_family_answers_without_importing_torch() -> None:
    mods = speed.modules_imported_by_fitcheck()
    assert mods["exit"] in (0, 1), mods  # answered (fits / does not fit), did not crash
    heavy = ("torch", "transformers", "accelerate", "peft", "rich", "yaml", "importlib.metadata")
    assert {m: mods[m] for m in heavy} == dict.fromkeys(heavy, False)
