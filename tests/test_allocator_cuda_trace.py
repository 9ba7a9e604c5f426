"""fitcheck's caching allocator against the real CUDA caching allocator, on a whole run's recorded event order.

The H200 (session 23, ``benchmarks/gpu_session.sh fsdplora4``) recorded every allocator event of a real Trainer run,
Llama-2-70B cut to 16 layers, QLoRA, FSDP1, 4 x 4096, on the fms runs' stack (transformers 4.48.1, peft 0.13.2,
accelerate 1.0.1), twice: loaded to the GPU (``... old trace``) and loaded as the fms runs load (``... old fsdpload
trace``). The same run was then capped after its load (``torch.cuda.set_per_process_memory_fraction``) at 27 GiB (it
ran out of memory) and at 30 GiB (it ran). A third trace is Mistral-7B LoRA FSDP1 4 x 4096 on transformers 5.23
(``fsdplora5``), whose capped runs ran out of memory at 24.0 and at 24.5 GiB: the replay runs out at 24.0 too, and
runs at 24.5 (least capacity 24.12 GiB): near the limit, release-and-retry makes the layout depend on when each
release happened, so the replay's least capacity is not a verdict (fitcheck's verdict uses the uncapped reserved,
which the replay matches). ``benchmarks/fsdp1_lora_trace.py`` replays the events through
``fitcheck.core.caching``; these tests hold the replay to the device's own counters and to the capped runs' outcome.
All expected values are read from ``benchmarks/data/`` (the device's JSON and the traces), none is written here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from benchmark_module import BENCHMARKS, load_benchmark

from fitcheck.core.caching import OutOfMemory

trace = load_benchmark("fsdp1_lora_trace")
DATA = BENCHMARKS / "data"
TRACES = ("llama70b_16L_QLoRA_fsdp1_b4_old_trace.trace.json.gz",
          "llama70b_16L_QLoRA_fsdp1_b4_old_fsdpload_trace.trace.json.gz",
          "mistral_LoRA_fsdp1v1_b4_trace.trace.json.gz")
CAPPED = ("llama70b-16L QLoRA fsdp1 b4 old cap27", "llama70b-16L QLoRA fsdp1 b4 old cap30",
          "mistral LoRA fsdp1v1 b4 cap24.0")


def _capped_rows() -> dict[str, Any]:
    import json

    rows = json.loads((DATA / "fsdp1_lora_gpu_nvidia_h200.json").read_text(encoding="utf-8"))["rows"]
    return {r["case"]: r for r in rows if r["case"] in CAPPED}


@pytest.mark.parametrize("name", TRACES)
def test_replay_matches_the_devices_counters(name: str) -> None:
    """Per phase (load, prepare, steps 1-3): allocated within 0.5 %, reserved within 1.5 % of the H200's own
    ``max_memory_allocated`` / ``max_memory_reserved`` (replay: +1.3 % at worst, the GPU-loaded run's steps)."""
    doc = trace.load(Path(DATA / name))
    got = trace.replay(doc)["phases"]
    assert list(got) == ["load", "prepare", "step1", "step2", "step3"]
    for phase, (allocated, reserved) in got.items():
        rec = doc["counters"][phase]
        assert allocated == pytest.approx(rec["max_allocated"], rel=0.005), phase
        assert reserved == pytest.approx(rec["max_reserved"], rel=0.015), phase


def test_replay_runs_out_of_memory_where_the_device_did() -> None:
    """The capped device runs: out of memory under the lower cap, ran under the higher, and the replay agrees; under
    the higher cap its steps reserve within 5 % of the device (release-and-retry gave the load's cache back)."""
    doc = trace.load(Path(DATA / TRACES[0]))
    at = int(doc["marks"]["load"])
    rows = _capped_rows()
    low, high = (rows[c] for c in CAPPED[:2])
    assert (low["status"], high["status"]) == ("oom", "ok")
    with pytest.raises(OutOfMemory):
        trace.replay(doc, _cap(low), at)
    got = trace.replay(doc, _cap(high), at)["phases"]
    for phase in ("step1", "step2", "step3"):
        assert got[phase][1] == pytest.approx(high["measured"][phase]["max_reserved"], rel=0.05), phase


def _cap(row: dict[str, Any]) -> int:
    """The allocator's ``allowed_memory_maximum`` of a capped case, as the harness recorded it."""
    return int(row["cap_bytes"])


def test_mistral_replay_runs_out_of_memory_at_the_lower_cap() -> None:
    """Mistral-7B LoRA FSDP1 capped at 24.0 GiB after its load ran out of memory on the H200; so does the replay."""
    doc = trace.load(Path(DATA / TRACES[2]))
    row = _capped_rows()[CAPPED[2]]
    assert row["status"] == "oom"
    with pytest.raises(OutOfMemory):
        trace.replay(doc, _cap(row), int(doc["marks"]["load"]))
