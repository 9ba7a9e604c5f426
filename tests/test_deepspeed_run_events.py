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

More than one process: rank 0 of a real 2-process gloo run (ZeRO-2 with ``overlap_comm``, two micro-batches a
step) against the rewrite of rank 0's partitions and of the accumulation window; the benchmark also runs 3
processes (padding to 2 x 3), LoRA, ZeRO-1, and accumulation on one process under ZeRO-2 and ZeRO-3.
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
    assert not_replayed(replace(one, sharding=ShardingSpec(Strategy.DEEPSPEED, 4, 1, ds))) == ""
    three = DeepSpeedSpec(stage=3)
    assert not_replayed(replace(one, sharding=ShardingSpec(Strategy.DEEPSPEED, 4, 1, three))) == ""
    assert not_replayed(replace(one, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, three))) == ""
    off = replace(one, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, replace(
        ds, offload_optimizer=OffloadDevice.CPU)))
    assert "offloaded" in not_replayed(off)
    assert not_replayed(replace(one, batch=replace(one.batch, grad_accum=4))) == ""
    zero1 = replace(one, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, DeepSpeedSpec(stage=1)))
    assert "gradient accumulation" in not_replayed(replace(zero1, batch=replace(one.batch, grad_accum=4)))
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


def test_two_processes_with_accumulation_match_rank_0() -> None:
    from deepspeed_run_events_cpu import compare, real

    run = (2, True, False, 2, 2)  # ZeRO-2, overlap_comm, full model, 2 processes, 2 micro-batches a step
    (theirs,) = real(run)
    assert theirs["live"]["backward1.0"] == theirs["live"]["backward1"]  # the window's first partition, kept
    assert compare(run, theirs) == []
    # one process's arithmetic (the whole group in every partition) against rank 0 of two
    assert any("live after initialize" in d for d in compare((2, True, False, 1, 2), theirs))


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_each_rank_partition_is_deepspeeds(world: int) -> None:
    import torch
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from fitcheck.torch_adapters.deepspeed_run_plan import DeepSpeedPlan, aligned

    # the tiny Llama's two groups in the Trainer's order (embedding, two layers' linears, head; the norms)
    layer = (16384, 8192, 8192, 16384, 32768, 32768, 32768)
    groups = ((131072, *layer, *layer, 131072), (128,) * 5)
    plan = DeepSpeedPlan(2, groups, frozenset(), 2, 20_000, False, True, 10**9, world)
    for i, group in enumerate(groups):
        size = plan.partition(i)
        assert size * world == aligned(sum(group), world) and aligned(sum(group), world) % (2 * world) == 0
        tensors = [torch.empty(n, device="meta") for n in group]
        for rank in range(world):
            inside, _, first = DeepSpeedZeroOptimizer.get_partition_info(None, tensors, size, rank)
            mine = plan.in_partition(i, rank)
            assert [n for n, _ in mine] == [t.numel() for t in inside]
            # the parts in the partition: what _get_flat_partition_unpadded narrows (first_offset, then capped)
            end = max(0, min(size, sum(group) - rank * size))
            assert sum(part for _, part in mine) == end and (not mine or mine[0][1] == mine[0][0] - first
                                                               or len(mine) == 1)
    # the rank rewritten is the one whose grads_in_partition is the largest
    spec_rank = max(range(world), key=lambda r: (plan.held(r), -r))
    assert plan.held(spec_rank) == max(
        sum(t.numel() for i, g in enumerate(groups) for t in DeepSpeedZeroOptimizer.get_partition_info(
            None, [torch.empty(n, device="meta") for n in g], plan.partition(i), r)[0]) for r in range(world))


def test_a_traced_multi_process_accumulating_answer_takes_the_replay(tmp_path: Path) -> None:
    import json

    from deepspeed_run_events_cpu import CONFIG

    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.torch_adapters import PinnedPath

    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "torch_dtype": "bfloat16"}), encoding="utf-8")
    values = {"model_name_or_path": str(tmp_path), "max_seq_length": 32, "per_device_train_batch_size": 2,
              "gpu": "H100", "dtype": "bfloat16", "bf16": True, "zero_stage": 2, "num_processes": 4,
              "gradient_accumulation_steps": 2}
    spec = spec_from_values(values, {})[0]
    assert (spec.data_parallel_size, spec.batch.grad_accum) == (4, 2)
    assert "reserved-published-gap" not in {f.code for f in PinnedPath("always")(spec).findings}
    # ZeRO-3 on four processes is replayed too (deepspeed_run_zero3); its offload keeps the published gap, and says why
    other = spec_from_values({**values, "zero_stage": 3}, {})[0]
    assert "reserved-published-gap" not in {f.code for f in PinnedPath("always")(other).findings}
    off = spec_from_values({**values, "zero_stage": 3, "offload_optimizer": "cpu"}, {})[0]
    note = {f.code: f.message for f in PinnedPath("always")(off).findings}.get("reserved-published-gap", "")
    assert "offloaded" in note
