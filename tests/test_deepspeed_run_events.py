"""DeepSpeed's one-process run as ``fitcheck.torch_adapters.deepspeed_run_events`` rewrites it, against REAL
DeepSpeed 0.19.8 engines on CPU (one gloo process, a tiny Llama in bf16, the Trainer's two groups in a fused torch
AdamW, two steps: ``benchmarks/deepspeed_run_events_cpu.py``, which runs all eight configurations).

Two engines run in one process of their own: ZeRO-2 with ``overlap_comm`` on a LoRA model (two ipg buckets, the
gradient partition on the reduction stream, peft's fp32 adapters cast at initialize, frozen weights left as loaded)
and ZeRO-3 (the flat buffers, sub-group conversion, resident gradient buffer); the benchmark also runs ZeRO-1 (its
gradients kept until ``reduce_gradients``) and the full ZeRO-2 model (a gradient larger than the bucket). The
rewritten sequence must leave the live bytes the engines leave after ``initialize``, after each backward and after
the first step, and make the same large allocations in ``initialize`` and in the optimizer steps; a wrong sequence
(another stage's, or one without ``initialize_optimizer_states``' zeroed gradient) must not.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")
pytest.importorskip("peft")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

RUNS = ((2, True, True), (3, False, False))


@pytest.fixture(scope="module")
def engines() -> dict[tuple[int, bool, bool], dict[str, Any]]:
    from deepspeed_run_events_cpu import real

    return dict(zip(RUNS, real(*RUNS), strict=True))


@pytest.mark.parametrize("run", RUNS, ids=["zero2-overlap-lora", "zero3"])
def test_sequence_matches_the_real_engine(engines: dict[tuple[int, bool, bool], dict[str, Any]],
                                          run: tuple[int, bool, bool]) -> None:
    from deepspeed_run_events_cpu import compare

    assert compare(run, engines[run]) == []


def test_a_wrong_sequence_is_caught(engines: dict[tuple[int, bool, bool], dict[str, Any]],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from deepspeed_run_events_cpu import compare

    from fitcheck.torch_adapters import deepspeed_run_events as m

    # ZeRO-3's sequence against the ZeRO-2 engine; one ipg bucket (overlap_comm off) where the engine makes two
    assert compare((3, True, True), engines[(2, True, True)])
    assert any("ipg buckets" in d for d in compare((2, False, True), engines[(2, True, True)]))
    # without initialize_optimizer_states' zeroed fp32 gradients (what the first experiment replayed)
    initialize = m._initialize

    def without_zeros(w: Any, plan: Any, owned: Any, size: Any) -> None:
        initialize(w, plan, owned, size)
        del w.out[-2 * len(plan.groups):]  # ZeRO-1/2: their allocations and frees end initialize

    monkeypatch.setattr(m, "_initialize", without_zeros)
    assert any("large allocations in setup" in d for d in compare((2, True, True), engines[(2, True, True)]))


def test_what_is_not_replayed_is_said() -> None:
    from dataclasses import replace

    from cpu_truth import Row, spec_for
    from deepspeed_run_events_cpu import CONFIG

    from fitcheck.spec import DeepSpeedSpec, OffloadDevice, ShardingSpec, Strategy
    from fitcheck.torch_adapters.deepspeed_run_plan import not_replayed

    spec = spec_for(Row("tiny", CONFIG, seq=32, batch=2, dtype="bfloat16", mp="bf16", optim="adamw_torch_fused"))
    ds = DeepSpeedSpec(stage=2)
    one = replace(spec, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, ds))
    assert not_replayed(one) == ""
    assert "more than one process" in not_replayed(replace(one, sharding=ShardingSpec(Strategy.DEEPSPEED, 4, 1, ds)))
    off = replace(one, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, replace(
        ds, offload_optimizer=OffloadDevice.CPU)))
    assert "offloaded" in not_replayed(off)
    assert "gradient accumulation" in not_replayed(replace(one, batch=replace(one.batch, grad_accum=4)))
    assert "optimizer" in not_replayed(replace(one, optimizer=replace(one.optimizer, name="adamw_torch")))


def test_a_traced_deepspeed_answer_takes_the_replay(tmp_path: Path) -> None:
    import json

    from deepspeed_run_events_cpu import CONFIG
    from rewrite_checks import takes_the_replay

    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import PinnedPath
    from fitcheck.torch_adapters.deepspeed_run_events import whole_run

    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "torch_dtype": "bfloat16"}), encoding="utf-8")
    values = {"model_name_or_path": str(tmp_path), "max_seq_length": 32, "per_device_train_batch_size": 2,
              "gpu": "H100", "dtype": "bfloat16", "bf16": True, "zero_stage": 2}
    spec = spec_from_values(values, {})[0]
    _, report, _ = takes_the_replay(spec, whole_run)
    traced = tuple(c for c in report.components if c.name.endswith(".traced"))
    assert report.peak_reserved_bytes != estimate(spec, activations=traced).peak_reserved_bytes
    # a run the rewrite does not describe keeps the published gap and says which part
    other = spec_from_values({**values, "optim": "adamw_torch"}, {})[0]
    note = {f.code: f.message for f in PinnedPath("always")(other).findings}.get("reserved-published-gap", "")
    assert "adamw_torch optimizer" in note
