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


def _recorded(variant: str) -> dict[str, Any]:
    """A recorded real FSDP1 run: ``lora``, ``accum`` and its ``rows`` per world size."""
    return dict(json.loads(RECORDED.read_text(encoding="utf-8"))["variants"][variant])


def test_plan_of_accelerates_fsdp1_units() -> None:
    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan, not_replayed
    from fitcheck.torch_adapters.fsdp_plan_types import flat_layout

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
    from fitcheck.torch_adapters.fsdp_params import Param
    from fitcheck.torch_adapters.fsdp_plan_types import Fsdp1Plan, Unit

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
    assert "frozen parameters sharing a unit" in not_replayed(with_fsdp(2, frozen_shares_units=True))


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

    recorded = _recorded("full")["rows"][str(world)]
    mine, _ = fitcheck_live(world, plain, version=1)
    assert compare(recorded, mine) == []


def test_a_wrong_sequence_is_caught(plain: list[Any]) -> None:
    from fsdp2_run_events_cpu import compare, fitcheck_live

    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan

    recorded = _recorded("full")["rows"]

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

    recorded = _recorded("full")["rows"]
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
    # with accumulation FSDP1 adds into each unit's flat gradient, which the traced step does not show: it says so
    # and is not pinned (run_scope.accumulation_not_traced; the one pass traced is shared)
    accum = path(spec_from_values({**values, "gradient_accumulation_steps": 2}, {})[0])
    assert not accum.pinned and "accumulation-not-traced" in {f.code for f in accum.findings}
    other = spec_from_values({**values, "optim": "adafactor"}, {})[0]
    note = {f.code: f.message for f in PinnedPath("always")(other).findings}.get("reserved-published-gap", "")
    assert "FSDP1" in note and "adafactor" in note


@pytest.fixture(scope="module")
def variant_plains() -> dict[str, list[Any]]:
    return {}


def _variant_live(variant: str, world: int, plains: dict[str, list[Any]], plan: Any = None) -> dict[str, int]:
    from fsdp2_run_events_cpu import fitcheck_live

    rec = _recorded(variant)
    mine, plains[variant] = fitcheck_live(world, plains.get(variant), 1, plan, lora=rec["lora"], accum=rec["accum"])
    return mine


def test_lora_plan_splits_the_adapters_and_accumulation_is_replayed() -> None:
    """The Trainer's FSDP1 units under peft: each LoRA A/B a flat parameter of its own (fp32, not upcast, the only
    ones with gradients and optimizer states), the layer's base and the root frozen in bf16."""
    from fsdp2_run_events_cpu import spec_of

    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan, not_replayed

    spec = spec_of(2, version=1, lora=True, accum=2)
    plan = fsdp1_plan(spec)
    assert not_replayed(spec) == "" and plan.accum == 2 and plan.split
    assert [len(plan.handles(u)) for u in range(len(plan.units))] == [1, 5, 5]
    assert [plan.handles(1)[k][0].numel for k in range(1, 5)] == [8 * 128, 128 * 8, 8 * 128, 64 * 8]
    assert [(plan.trainable(1, k), plan.flat_orig(1, k), plan.flat_load(1, k)) for k in (0, 1)] == [
        (False, 2, 2), (True, 4, 4)]
    assert not plan.trainable(0) and plan.flat_orig(0) == 2
    assert not fsdp1_plan(spec_of(2, version=1)).split


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["lora_accum2", "lora", "accum2"])
def test_replay_matches_the_recorded_run(variant: str, variant_plains: dict[str, list[Any]]) -> None:
    """peft LoRA r 8 on q/v over the frozen bf16 base (the Trainer's ``fsdp_auto_wrap_policy``: each adapter its
    own fp32 flat parameter) and two micro-batches a step (more processes: ``no_sync`` keeps every flat's unsharded
    bf16 ``.grad`` to the boundary; one process: no ``no_sync`` at all, every micro-batch reduced into the fp32
    gradient), at every recorded world size (1, 2; 3 for the accumulating ones): the same live bytes as the REAL
    runs (``benchmarks/data/fsdp1_run_events_cpu.json``) within 1 KiB at every point, those between micro-batches
    included."""
    from fsdp2_run_events_cpu import compare

    rows = _recorded(variant)["rows"]
    for world, theirs in rows.items():
        assert compare(theirs, _variant_live(variant, int(world), variant_plains)) == [], world


@pytest.mark.slow
def test_a_wrong_lora_or_accumulation_is_caught(variant_plains: dict[str, list[Any]]) -> None:
    """Each part shows in the recorded bytes: LoRA in one flat parameter per layer (the frozen base in the
    gradient and upcast), no accumulation (every pass its own optimizer step)."""
    from fsdp2_run_events_cpu import compare

    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan

    def unsplit(spec: Any) -> Any:
        return replace(fsdp1_plan(spec), split=False)

    def unaccumulated(spec: Any) -> Any:
        return replace(fsdp1_plan(spec), accum=1)

    lora = _recorded("lora")["rows"]
    assert compare(lora["1"], _variant_live("lora", 1, variant_plains, unsplit))
    assert compare(lora["2"], _variant_live("lora", 2, variant_plains, unsplit))
    accum = _recorded("accum2")["rows"]
    assert compare(accum["2"], _variant_live("accum2", 2, {}, unaccumulated))


@pytest.mark.parametrize("variant", ["accum2", "lora_accum2"])
def test_formula_keeps_the_unsharded_gradients_in_param_dtype(variant: str) -> None:
    """Under ``no_sync`` (more than one process) FSDP1 keeps each flat parameter's unsharded ``.grad`` in
    ``param_dtype`` (bf16), not in the fp32 of the upcast: the formula's gradients between micro-batches are the
    recorded runs' growth after the first micro-batch (main counted them in fp32: twice that). The full run's
    first forward also frees the 16-bit shards the upcast left (``initialize`` holds them: 2 bytes a parameter
    over the world size); LoRA's adapters were fp32 already."""
    from fsdp2_run_events_cpu import spec_of

    from fitcheck.core import estimate
    from fitcheck.report import Phase

    rec = _recorded(variant)
    numel = sum(p.numel for p in spec_of(1, version=1).model.params)
    for world, row in rec["rows"].items():
        if world == "1":
            continue
        spec = spec_of(int(world), version=1, lora=rec["lora"], accum=2)
        grads = next(c for c in estimate(spec).components if c.name == "gradients")
        upcast_left = 0 if rec["lora"] else numel * 2 // int(world)
        assert abs(grads.by_phase[Phase.FORWARD_END] - (row["backward1.0"] - row["initialize"] + upcast_left)) <= 256


def _qlora_spec(world: int, optim: str = "adamw_torch_fused") -> Any:
    """The tiny LoRA run over a bitsandbytes nf4 base stored in bf16 (FSDP-QLoRA's ``bnb_4bit_quant_storage``)."""
    from fsdp2_run_events_cpu import spec_of

    spec = spec_of(world, version=1, lora=True, qlora=True)
    return replace(spec, optimizer=replace(spec.optimizer, name=optim))


def test_fsdp1_qlora_replays_from_its_load() -> None:
    """FSDP1 over a 4-bit base: each layer's packed ``Params4bit`` (bf16 storage) flattened with its norms, the
    model on the GPU before ``prepare`` (transformers 5.23 ``update_device_map``): the load's events, the Trainer's
    ``empty_cache``, and each unit's flat made beside the loaded storages, which it frees; the live bytes after
    ``prepare``, backward and the step those of the REAL FSDP1 QLoRA runs on 1 and 2 gloo ranks (bitsandbytes' CPU
    backend; ``benchmarks/fsdp2_run_events_cpu.py --version 1 --variant qlora``). Before: ``no traced parameter
    storage of N bytes`` (the plan's weights were 16-bit) and the default path kept the plain run's gap without a
    word; a QLoRA run the rewrite does not describe says which gap it keeps."""
    from fsdp2_run_events_cpu import compare, fitcheck_live

    from fitcheck.core.loading import load_events
    from fitcheck.core.states import quantized_bytes
    from fitcheck.torch_adapters import fsdp1_run, live_bytes, whole_run_events
    from fitcheck.torch_adapters.deepspeed_run_events import EMPTY_CACHE, RESET_PEAKS
    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan, not_replayed
    from fitcheck.torch_adapters.path_findings import gap_note

    spec = _qlora_spec(1)
    plan = fsdp1_plan(spec)
    assert not_replayed(spec) == "" and plan.resident and plan.split
    q_proj = next(e for e in spec.model.params if e.name.endswith("q_proj.weight"))
    packed = plan.handles(1)[0][0]
    assert packed.frozen and packed.numel * packed.traced == quantized_bytes(q_proj.numel_each, spec.quant).data
    load = load_events(spec, spec.hardware.gpu_memory_bytes)
    plain = whole_run_events(spec)
    for world, theirs in _recorded("qlora")["rows"].items():
        assert compare(theirs, fitcheck_live(int(world), plain, 1, lora=True, qlora=True)[0]) == [], world
    events = fsdp1_run(plain, plan, load)
    tags = [t for _, _, t in events]
    assert tags.index(RESET_PEAKS) + 1 == tags.index(EMPTY_CACHE) < tags.index("forward")
    before = sum(n for _, n, _ in events[:tags.index(RESET_PEAKS)])
    padding = sum(plan.layout(u, k)[0] * plan.flat_load(u, k) - sum(q.numel * plan.traced_of(q) for q in h)
                  for u in range(len(plan.units)) for k, h in enumerate(plan.handles(u)))
    assert live_bytes(events)["initialize"] - before == padding  # every loaded weight freed by its flattening
    loaded = {e.handle: e.nbytes for e in load if e.kind == "alloc"}
    for e in load:
        if e.kind == "free":
            loaded.pop(e.handle)
    assert before >= sum(loaded.values())  # the load's resident bytes (and the adapters) before prepare

    class Path:  # the plain Trainer's gap where the rewrite does not describe the run
        def __init__(self) -> None:
            self._whole_failed: dict[str, str] = {}

        def gap_fraction(self, spec: Any) -> float:
            return 0.3

    other = _qlora_spec(1, optim="adamw_torch")
    note = gap_note(Path(), other, "k")
    assert note is not None and note.code == "reserved-plain-run-gap" and "adamw_torch" in note.message
    assert gap_note(Path(), spec, "k") is None
    # FSDP2 over the same resident base: accelerate 1.15 fsdp2_prepare_model's original_sd holds every loaded
    # storage until it returns, so every shard is made before any is freed (not replayed by default: its step is
    # not checked)
    from fitcheck.torch_adapters import fsdp2_plan, fsdp2_run

    spec2 = replace(spec, sharding=replace(spec.sharding, fsdp=replace(spec.sharding.fsdp, version=2)))
    assert fsdp2_plan(spec2).resident and "FSDP2's QLoRA step" in not_replayed(spec2)
    events2 = fsdp2_run(plain, fsdp2_plan(spec2), load)
    after = [t for _, _, t in events2].index(EMPTY_CACHE) + 1
    prepare = events2[after:after + next(k for k, ev in enumerate(events2[after:]) if ev[2] != "setup")]
    signs = [n > 0 for _, n, _ in prepare]
    assert signs == sorted(signs, reverse=True) and any(signs) and not all(signs)
    prepared = replace(spec, quant=replace(spec.quant, prepare_for_kbit_training=True))
    assert "k-bit preparation" in not_replayed(prepared)
