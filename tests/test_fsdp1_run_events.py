"""FSDP1's one-rank run as ``fitcheck.torch_adapters.fsdp1_run_events`` rewrites it, against a REAL accelerate 1.15
``Accelerator.prepare`` -> torch 2.13 ``FullyShardedDataParallel`` run on CPU gloo ranks
(``benchmarks/fsdp2_run_events_cpu.py --version 1``): the live bytes after ``prepare``, after each backward and
after the first step, at world sizes 1 (``NO_SHARD``: the upcast's 16-bit flat kept by the original parameters'
views until the first forward, fp32 flat gradients kept past ``zero_grad``) and 2 (padded shards). The real runs'
bytes are committed (``benchmarks/data/fsdp1_run_events_cpu.json``; spawning them takes about 2 minutes here, so the
spawning check is a ``HEAVY`` one). A wrong sequence is caught; the ``NO_SHARD`` ``_mp_shard`` pool holds every
forward block; a traced FSDP1 answer takes the replay instead of the published gap.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RECORDED = ROOT / "benchmarks" / "data" / "fsdp1_run_events_cpu.json"


def _spec(world: int) -> Any:
    from fsdp2_run_events_cpu import spec_of

    return spec_of(world, version=1)


def test_plan_of_accelerates_fsdp1_units() -> None:
    from fitcheck.torch_adapters.fsdp2_run_plan import flat_layout, fsdp1_plan, not_replayed

    spec = _spec(world=2)
    plan = fsdp1_plan(spec)
    assert [u.kind for u in plan.units] == ["root", "layer", "layer"]
    assert plan.wrap_order == (1, 2, 0)  # _auto_wrap: the layers, then the root's own handle
    assert (plan.world, plan.load, plan.orig, plan.compute, plan.align) == (2, 2, 4, 2, 8)
    assert plan.layout(0)[0] == 2 * 1024 * 128 + 128  # embedding, final norm, untied head
    # flatten_tensors: each tensor at a multiple of _aligned_numel, the total padded to the world size
    assert flat_layout([3, 5], 8, 2) == (14, [0, 8])
    assert flat_layout([3, 5], 0, 2) == (8, [0, 3])
    assert not_replayed(spec) == ""


def test_in_shard_follows_the_flat_layout() -> None:
    from fitcheck.torch_adapters.fsdp2_run_plan import Fsdp1Plan, Param, Unit

    unit = Unit((Param(3, 3), Param(5, 5)), True, "layer")
    plan = Fsdp1Plan(2, (unit,), (0,), 4, 2, 2, 2, False, load=2, align=8)
    assert plan.shard(0) == 7
    assert plan.in_shard(0, 0) == [3, 0] and plan.in_shard(0, 1) == [0, 5]


def test_what_is_not_replayed_is_said_for_fsdp1() -> None:
    from fitcheck.spec import FsdpSpec
    from fitcheck.torch_adapters.fsdp2_run_plan import not_replayed

    def with_fsdp(world: int, **kw: Any) -> Any:
        spec = _spec(world)
        return replace(spec, sharding=replace(spec.sharding, fsdp=FsdpSpec(version=1, **kw)))

    assert "use_orig_params=False" in not_replayed(with_fsdp(1, use_orig_params=False))
    assert "SHARD_GRAD_OP" in not_replayed(with_fsdp(2, sharding_strategy="SHARD_GRAD_OP"))
    assert not_replayed(with_fsdp(1, sharding_strategy="SHARD_GRAD_OP")) == ""  # one process: NO_SHARD anyway
    assert "cpu_ram_efficient_loading" in not_replayed(with_fsdp(2, cpu_ram_efficient_loading=True))


def test_no_shard_pool_holds_every_forward_block(tmp_path: Path) -> None:
    """torch 2.13 ``_flat_param.py``: ``NO_SHARD`` frees each ``_mp_shard`` under ``record_stream`` at its
    post-forward and nothing synchronises the CPU before the loss check after backward: the pre-unshard stream's
    pool holds the root, every layer and the root's pre-backward re-gather (``core/states/fsdp_streams.py``; the
    H100 FSDP1 row of ``benchmarks/data/fsdp_gpu_nvidia_h100_80gb_hbm3.json``)."""
    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core.loading import allocator_conf
    from fitcheck.core.states import fsdp_side_pools

    fsdp = tmp_path / "fsdp.json"
    fsdp.write_text(json.dumps({"fsdp_version": 1, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}),
                    encoding="utf-8")
    spec = spec_from_values({"model_name_or_path": "meta-llama/Llama-3.2-1B", "max_seq_length": 1024,
                             "per_device_train_batch_size": 4, "gpu": "H100", "dtype": "bfloat16", "bf16": True,
                             "fsdp": "full_shard auto_wrap", "fsdp_config": str(fsdp), "num_processes": 1}, {})[0]
    pools = fsdp_side_pools(spec, allocator_conf(spec))
    outside = sum(p.numel for p in spec.model.params if not p.per_layer)
    layers = sum(p.numel for p in spec.model.params if p.per_layer)
    assert pools is not None and pools.gather >= 2 * (2 * outside + layers)  # two bf16 roots, every bf16 layer


@pytest.fixture(scope="module")
def plain() -> list[Any]:
    from fitcheck.torch_adapters import whole_run_events

    return whole_run_events(_spec(world=1))


@pytest.mark.parametrize("world", [1, 2])
def test_sequence_matches_the_recorded_real_fsdp1_run(plain: list[Any], world: int) -> None:
    from fsdp2_run_events_cpu import compare, fitcheck_live

    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))["rows"][str(world)]
    mine, _ = fitcheck_live(world, plain, version=1)
    assert compare(recorded, mine) == []


def test_a_wrong_sequence_is_caught(plain: list[Any]) -> None:
    from fsdp2_run_events_cpu import compare, fitcheck_live

    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan

    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))["rows"]

    def no_upcast(spec: Any) -> Any:  # flat parameters, gradients and states in the 16-bit dtype loaded
        return replace(fsdp1_plan(spec), orig=2)

    def unsharded(spec: Any) -> Any:  # every rank holding whole flat parameters, gradients and states
        return replace(fsdp1_plan(spec), world=1)

    assert compare(recorded["1"], fitcheck_live(1, plain, 1, no_upcast)[0])
    assert compare(recorded["2"], fitcheck_live(2, plain, 1, unsharded)[0])


@pytest.mark.slow
def test_sequence_matches_a_real_fsdp1_run() -> None:
    """Spawns the real runs (``HEAVY``: about 2 minutes on a 2-core machine); the recorded bytes are theirs."""
    from fsdp2_run_events_cpu import real

    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))["rows"]
    assert {str(w): real(w, 1) for w in (1, 2)} == recorded


@pytest.mark.slow
def test_a_traced_fsdp1_answer_takes_the_replay(tmp_path: Path) -> None:
    from rewrite_checks import fsdp_values, takes_the_replay

    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.torch_adapters import PinnedPath
    from fitcheck.torch_adapters.fsdp1_run_events import whole_run

    values = fsdp_values(tmp_path, 1)
    spec = spec_from_values(values, {})[0]
    assert spec.sharding.fsdp is not None and spec.sharding.fsdp.version == 1
    path, _, replay = takes_the_replay(spec, whole_run)
    assert replay is not None and path.gap_fraction(spec) == replay.gap_fraction
    other = spec_from_values({**values, "gradient_accumulation_steps": 2}, {})[0]
    note = {f.code: f.message for f in PinnedPath("always")(other).findings}.get("reserved-published-gap", "")
    assert "FSDP1" in note and "gradient accumulation" in note
