"""FSDP2's one-rank run as ``fitcheck.torch_adapters.fsdp2_run_events`` rewrites it, against REAL accelerate 1.15
``fsdp2_prepare_model`` / torch 2.13 ``fully_shard`` runs on CPU gloo ranks (``benchmarks/fsdp2_run_events_cpu.py
--write``, recorded in ``benchmarks/data/fsdp2_run_events_cpu.json``: no run is spawned here): the live bytes after
``prepare``, after each backward (and each micro-batch's) and after the first step, at world sizes 1 (no
all-gather: the per-parameter casts and unsharded parameters of ``wait_for_unshard``) and 2 (``foreach_all_gather``,
padded shards); a full fine-tune, peft LoRA, two micro-batches a step, and LoRA with two micro-batches. A wrong
sequence (the gradients not sharded, the optimizer states in the traced 16-bit dtype, the frozen base upcast, the
micro-batches reduced) is caught; a traced FSDP2 answer (LoRA with accumulation too) takes the replay instead of the
published gap, and a run the rewrite does not describe says which part it lacks.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_plan_of_accelerates_units() -> None:
    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp2_plan, not_replayed
    from fitcheck.torch_adapters.fsdp_params import Param

    spec = _spec(world=2)
    plan = fsdp2_plan(spec)
    assert [u.kind for u in plan.units] == ["embed", "layer", "layer", "tail"]
    assert plan.wrap_order == (1, 2, 0, 3)  # layers bottom-up, the embedding, the tail (fsdp2_prepare_model)
    assert (plan.world, plan.orig, plan.compute, plan.reduce, plan.traced) == (2, 4, 2, 2, 2)
    assert not plan.units[-1].reshard and plan.units[1].reshard
    assert Param(3 * 5, 3).shard(2) == 2 * 5 and Param(3 * 5, 3).local(2, 1) == 5  # dim 0 padded per rank
    assert not_replayed(spec) == ""
    tied = replace(spec, model=replace(spec.model, params=tuple(p for p in spec.model.params
                                                                if p.name != "lm_head.weight")))
    assert [u.kind for u in fsdp2_plan(tied).units] == ["layer", "layer", "tail"]  # the embedding in the tail


def test_what_is_not_replayed_is_said() -> None:
    from fitcheck.spec import FsdpSpec, ShardingSpec, Strategy
    from fitcheck.torch_adapters.fsdp2_run_plan import not_replayed

    spec = _spec(world=1)
    one = ShardingSpec(Strategy.FSDP, 1, 1, None, FsdpSpec(version=1, use_orig_params=False))
    assert "use_orig_params" in not_replayed(replace(spec, sharding=one))  # FSDP1: fsdp1_run_events
    assert not_replayed(replace(spec, batch=replace(spec.batch, grad_accum=2))) == ""  # no_sync: replayed
    assert "adamw_torch optimizer" in not_replayed(replace(spec, optimizer=replace(spec.optimizer,
                                                                                    name="adamw_torch")))


def test_one_shard_has_no_copy_in_pool() -> None:
    """torch 2.13 ``_fsdp_param_group.py``: at world size 1 ``unshard`` returns before ``foreach_all_gather`` and
    ``wait_for_unshard`` casts and unshards on the default stream (replayed there by ``fsdp2_run``)."""
    from fitcheck.core.loading import allocator_conf
    from fitcheck.core.states import fsdp_side_pools
    from fitcheck.report import Phase
    from fitcheck.spec import DeviceType

    def pools(world: int) -> Any:
        spec = _spec(world)
        spec = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))
        return fsdp_side_pools(spec, allocator_conf(spec))

    one, two = pools(1), pools(2)
    assert one.gather == 0 and one.reduce > 0 and one.live[Phase.FORWARD_END] == 0
    assert two.gather > 0 and two.live[Phase.FORWARD_END] > 0


def test_a_storage_never_freed_is_no_gradient() -> None:
    """A CUDA trace's first backward makes the backward thread's cuBLAS workspace (32 MiB, kept for the run), the
    size of a 4096 x 4096 bf16 weight's gradient: it is no unit's gradient (8B accumulating answer: the later pass
    had no counterpart for it, so the replay failed), nor a stray the rewrite frees."""
    from fitcheck.torch_adapters.fsdp_params import Param
    from fitcheck.torch_adapters.fsdp_plan_types import FsdpPlan, Unit
    from fitcheck.torch_adapters.fsdp_run_walk import unit_gradients

    plan = FsdpPlan(1, (Unit((Param(16, 4),), True, "layer"),), (0,), 4, 2, 2, 2, False)
    events = [(1, 32, "backward"), (2, 32, "backward"), (9, 8, "backward"), (9, -8, "backward"), (2, -32, "zero_grad")]
    owned, strays = unit_gradients(events, 0, 4, {1, 2}, plan, [0])
    assert [h for _, h in owned[0]] == [(2, 32, "backward")] and strays == []  # kept: the rewrite frees no stray


def test_layer_starts_follow_the_period() -> None:
    from fitcheck.torch_adapters.fsdp_run_walk import layer_starts

    block = [(0, 64, "forward"), (0, 128, "forward"), (0, -64, "forward"), (0, 32, "forward")]
    events = [(0, 8, "forward"), (0, 16, "forward")] + block * 3 + [(0, 512, "forward")]
    assert layer_starts(events, 0, len(events), 3) == [2, 6, 10, 14]


@pytest.fixture(scope="module")
def real_runs() -> dict[int, dict[str, int]]:
    """The REAL full fine-tune runs' live bytes as ``benchmarks/fsdp2_run_events_cpu.py --write`` recorded them
    (spawning them here took about 2 minutes of CI)."""
    return {world: _recorded("full")["rows"][str(world)] for world in (1, 2)}


@pytest.fixture(scope="module")
def plain() -> list[Any]:
    from fitcheck.torch_adapters import whole_run_events

    return whole_run_events(_spec(world=1))


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_sequence_matches_real_fully_shard(real_runs: dict[int, dict[str, int]], plain: list[Any],
                                           world: int) -> None:
    from fsdp2_run_events_cpu import compare, fitcheck_live

    mine, _ = fitcheck_live(world, plain)
    assert compare(real_runs[world], mine) == []


@pytest.mark.slow
def test_a_wrong_sequence_is_caught(real_runs: dict[int, dict[str, int]], plain: list[Any]) -> None:
    from fsdp2_run_events_cpu import compare

    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp2_plan

    def no_upcast(spec: Any) -> Any:  # shards, gradients and states in the 16-bit dtype the model was loaded in
        return replace(fsdp2_plan(spec), orig=2)

    def unsharded(spec: Any) -> Any:  # every rank holding whole parameters, gradients and states
        return replace(fsdp2_plan(spec), world=1)

    assert compare(real_runs[1], _live_with(no_upcast, 1, plain))
    assert compare(real_runs[2], _live_with(unsharded, 2, plain))


def _live_with(plan_fn: Any, world: int, plain: list[Any]) -> dict[str, int]:
    from fsdp2_run_events_cpu import spec_of

    from fitcheck.torch_adapters.deepspeed_run_events import live_bytes
    from fitcheck.torch_adapters.fsdp2_run_events import fsdp2_run

    before = sum(n for _, n, t in plain if t == "setup")
    return {k: v - before for k, v in live_bytes(fsdp2_run(plain, plan_fn(spec_of(world)))).items()}


@pytest.mark.slow
def test_a_traced_fsdp2_answer_takes_the_replay(tmp_path: Path) -> None:
    from rewrite_checks import fsdp_values, takes_the_replay

    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.torch_adapters import PinnedPath
    from fitcheck.torch_adapters.fsdp2_run_events import whole_run

    values = fsdp_values(tmp_path, 2)
    spec = spec_from_values(values, {})[0]
    path, _, replay = takes_the_replay(spec, whole_run)
    assert replay is not None and path.gap_fraction(spec) == replay.gap_fraction  # not the published fraction
    other = spec_from_values({**values, "optim": "adamw_torch"}, {})[0]
    note = {f.code: f.message for f in PinnedPath("always")(other).findings}.get("reserved-published-gap", "")
    assert "adamw_torch optimizer" in note


def _spec(world: int) -> Any:
    from fsdp2_run_events_cpu import spec_of

    return spec_of(world)


RECORDED = ROOT / "benchmarks" / "data" / "fsdp2_run_events_cpu.json"


def _recorded(variant: str) -> dict[str, Any]:
    import json

    return dict(json.loads(RECORDED.read_text(encoding="utf-8"))["variants"][variant])


@pytest.fixture(scope="module")
def variant_plains() -> dict[str, list[Any]]:
    return {}


def _variant_live(variant: str, world: int, plains: dict[str, list[Any]], plan: Any = None) -> dict[str, int]:
    from fsdp2_run_events_cpu import fitcheck_live

    rec = _recorded(variant)
    mine, plains[variant] = fitcheck_live(world, plains.get(variant), lora=rec["lora"], accum=rec["accum"], plan=plan)
    return mine


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["lora_accum2_accelerate", "lora_accelerate", "accum2"])
def test_replay_matches_the_recorded_run(variant: str, variant_plains: dict[str, list[Any]]) -> None:
    """peft LoRA r 8 on q/v over the frozen bf16 base (its shards in bf16, its units without gradients, the
    final norm in the root: accelerate's ``_find_final_norm`` finds none under peft) and two micro-batches a step
    (``no_sync``: every unit's unsharded bf16 gradients kept to the boundary, reduced there), at world sizes 1 and
    2: the same live bytes as the REAL runs (``benchmarks/data/fsdp2_run_events_cpu.json``) within 1 KiB at every
    point, those between micro-batches included."""
    from fsdp2_run_events_cpu import compare

    for world in (1, 2):
        theirs = _recorded(variant)["rows"][str(world)]
        assert compare(theirs, _variant_live(variant, world, variant_plains)) == [], world


@pytest.mark.slow
def test_a_wrong_lora_accumulation_is_caught(variant_plains: dict[str, list[Any]]) -> None:
    """Each part of the rewrite shows in the recorded bytes: the frozen base upcast like the adapters (its shards
    fp32), the adapters' unsharded gradients kept in their traced fp32, no ``no_sync`` (the first pass reduced)."""
    from fsdp2_run_events_cpu import compare

    from fitcheck.torch_adapters import fsdp2_run_events
    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp2_plan
    from fitcheck.torch_adapters.fsdp_params import Param

    def upcast_base(spec: Any) -> Any:
        plan = fsdp2_plan(spec)
        return replace(plan, units=tuple(replace(u, params=tuple(Param(q.numel, q.dim0, q.frozen, 0, q.traced)
                                                                 for q in u.params)) for u in plan.units))

    def unaccumulated(spec: Any) -> Any:  # every pass reduced: the plain run composed with one pass a step
        return replace(fsdp2_plan(spec), accum=1)

    # the Trainer's FSDP2 units (accelerate's transformer_based_wrap: the `_accelerate` recording)
    rows = _recorded("lora_accum2_accelerate")["rows"]
    assert compare(rows["2"], _variant_live("lora_accum2_accelerate", 2, variant_plains, upcast_base))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp2_run_events, "_in_param_dtype", lambda owned, plan: {})
        assert compare(rows["1"], _variant_live("lora_accum2_accelerate", 1, variant_plains))
    plains: dict[str, list[Any]] = {}
    assert any(p.startswith("live after backward1.0") or "backward1:" in p
               for p in compare(rows["1"], _variant_live("lora_accum2_accelerate", 1, plains, unaccumulated)))


@pytest.mark.slow
def test_a_traced_fsdp2_lora_accumulating_answer_takes_the_replay(tmp_path: Path) -> None:
    from rewrite_checks import fsdp_values, takes_the_replay

    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.torch_adapters.fsdp2_run_events import whole_run

    values = {**fsdp_values(tmp_path, 2), "use_peft": True, "lora_r": 8, "lora_target_modules": ["q_proj", "v_proj"],
              "lora_dropout": 0.0, "gradient_accumulation_steps": 2}
    spec = spec_from_values(values, {})[0]
    path, _, replay = takes_the_replay(spec, whole_run)
    assert replay is not None and path.gap_fraction(spec) == replay.gap_fraction


@pytest.mark.parametrize("world", [1, 2])
def test_formula_keeps_the_unsharded_gradients_in_param_dtype(world: int) -> None:
    """Under ``no_sync`` FSDP2 keeps every unsharded ``.grad`` in ``param_dtype`` (bf16), not in the fp32 of the
    upcast shards: the formula's gradients between micro-batches are the recorded runs' growth after the first
    micro-batch (main counted them in fp32: twice that)."""
    from fsdp2_run_events_cpu import spec_of

    from fitcheck.core import estimate
    from fitcheck.report import Phase

    grads = next(c for c in estimate(spec_of(world, accum=2)).components if c.name == "gradients")
    rec = _recorded("accum2")["rows"][str(world)]
    assert abs(grads.by_phase[Phase.FORWARD_END] - (rec["backward1.0"] - rec["initialize"])) <= 64


def test_lora_plan_and_what_stays_unreplayed() -> None:
    from fsdp2_run_events_cpu import spec_of

    from fitcheck.spec import LoraSpec
    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp2_plan, not_replayed

    spec = spec_of(2, lora=True, accum=2)
    # the Trainer's FSDP2 run never calls update_fsdp_plugin_peft (core/states/fsdp2_units.py): accelerate's own
    # transformer_based_wrap units
    plan = fsdp2_plan(spec)
    assert not_replayed(spec) == "" and plan.accum == 2
    assert [u.kind for u in plan.units] == ["root", "embed", "layer", "layer", "tail"]  # the final norm in the root
    layer = plan.units[2].params
    adapters = [q for q in layer if not q.frozen]
    assert [q.numel for q in adapters] == [8 * 128, 128 * 8, 8 * 128, 64 * 8]  # q: A, B; v: A, B
    assert all(plan.orig_of(q) == 4 and plan.traced_of(q) == 4 for q in adapters)
    assert all(plan.orig_of(q) == 2 for u in plan.units for q in u.params if q.frozen)  # the base not upcast
    dora = replace(spec, lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj"), use_dora=True))
    assert "DoRA" in not_replayed(dora)
    assert "quantized" in not_replayed(replace(spec, quant=_nf4()))


def _nf4() -> Any:
    from fitcheck.spec import QuantSpec

    return QuantSpec(quant_type="nf4")
