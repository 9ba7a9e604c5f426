"""The recorded rows of ``benchmarks/trl_replay.py`` (``benchmarks/data/trl_replay_cpu.json``): the real TRL trainer's
live-tensor peaks on CPU next to the whole-run replay's, checked by ``test_dpo_replay.py`` and ``test_kto_replay.py``;
and the one-step traces of a TRL spec those tests read the setup of.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "trl_replay_cpu.json"


def recorded_rows(key: str = "rows") -> dict[str, Any]:
    """The file's rows under ``key`` (``rows``: DPO and KTO; ``grpo_rows``) by case name."""
    return {r["case"]: r for r in json.loads(DATA.read_text()).get(key, [])}


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


def one_step_traces(specs: dict[str, Any], **override: Any) -> dict[str, Any]:
    """Each spec's run traced for one step without the optimizer (``run_trace_kwargs`` with ``override``)."""
    from fitcheck.torch_adapters import run_trace_kwargs
    from fitcheck.torch_adapters.tracer import trace_step

    traces = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, spec in specs.items():
            step = {**run_trace_kwargs(spec), "optimizer": None, "steps": 1, **override}
            traces[name] = trace_step(spec.model.config, **step)
    return traces


def setup_bytes(trace: Any) -> int:
    """The bytes a trace allocates (net) in its ``setup`` region: the model, its copy, the buffered batch."""
    return sum(n for _, n, tag in trace.alloc_events if tag == "setup")
