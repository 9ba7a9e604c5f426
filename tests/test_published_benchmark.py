"""benchmarks/published_rows.py + published.py: each published row becomes a spec or a skip with a reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import published as pub  # noqa: E402
import published_fields as pf  # noqa: E402
import published_rows as pr  # noqa: E402

ROWS = pr.load_rows()
PLANS = {str(r["id"]): pr.plan_row(r) for r in ROWS}


def test_every_row_is_planned_or_skipped_with_a_reason() -> None:
    assert len(PLANS) == len(ROWS) > 0
    for rid, p in PLANS.items():
        assert isinstance(p, pr.Plan | pr.Skip), rid
        if isinstance(p, pr.Skip):
            assert len(p.reason) > 10, rid
    planned = [p for p in PLANS.values() if isinstance(p, pr.Plan)]
    assert len(planned) >= 30
    # every HF-stack group with a stated tool is represented
    assert {"ms-swift-benchmark", "peft-MetaMathQA-benchmark"} <= {p.group for p in planned}


@pytest.mark.parametrize(
    ("rid", "metric"),
    [
        ("SWIFT-D1", "reserved"),
        ("MMQA-full-finetuning-lr_0.00001", "reserved"),
        ("MMQA-full-finetuning-lr_0.00001@p99", "reserved-p99"),
        ("MMQA-full-finetuning-lr_0.00001@states", "resident"),
        ("LIT-8", "allocated"),
        ("TT32-1", "allocated"),
    ],
)
def test_compares_like_with_like(rid: str, metric: str) -> None:
    p = PLANS[rid]
    assert isinstance(p, pr.Plan)
    assert p.metric == metric and p.metric_sure


@pytest.mark.parametrize(
    ("rid", "words"),
    [
        ("TITAN-8", "not modelled"),  # TP x FSDP + compile + float8
        ("SWIFT-2", "GPTQ"),
        ("TT2-4", "optimizer_in_bwd"),
        ("AO-1", "not stated"),
        ("LLF-1", "not stated"),
        ("TT31-1", "torch.compile"),  # the 2024-09 table's note: "torch compile enabled" for every row
        ("TT31-5", "torch.compile"),
        ("TT2-1", "torch.compile"),  # marked "**= Uses torch compile"
    ],
)
def test_unexpressible_rows_say_why(rid: str, words: str) -> None:
    p = PLANS[rid]
    assert isinstance(p, pr.Skip)
    assert words in p.reason


def test_mmqa_results_go_through_fitcheck_s_adapter_reader() -> None:
    """Every peft MetaMathQA result is a row: LoRA configs are read by fitcheck's reader, the other PEFT methods it
    estimates (``TRACED_PEFT_TYPES``) become the spec's adapter, the rest are skipped with the reader's refusal,
    experiments without a result say so."""
    mmqa = {rid: p for rid, p in PLANS.items() if rid.startswith("MMQA-")}
    assert len(mmqa) >= 63 * 3
    dora = mmqa["MMQA-lora-rank32-dora"]
    assert isinstance(dora, pr.Plan) and dora.stack == "hf" and dora.stated_trainable == 9_289_728
    spec = dora.build(pr.inventory_for(dora.model))
    assert spec.lora is not None and spec.lora.use_dora and spec.lora.target_modules == ("q_proj", "v_proj")
    ia3 = mmqa["MMQA-ia3-default"]
    assert isinstance(ia3, pr.Plan)
    ia3_spec = ia3.build(pr.inventory_for(ia3.model))
    assert ia3_spec.lora is None and ia3_spec.peft is not None and ia3_spec.peft.peft_type == "IA3"
    boft = mmqa["MMQA-boft-default"]
    assert isinstance(boft, pr.Skip) and "BOFT" in boft.reason and "reader refuses" in boft.reason
    kasa = mmqa["MMQA-lora-rank32-kasa"]
    assert isinstance(kasa, pr.Skip) and "no result" in kasa.reason


def test_every_row_names_its_stack() -> None:
    assert {str(r.get("stack")) for r in ROWS} == {"hf", "other"}
    assert {str(r["stack"]) for r in ROWS if r["source_group"] == "ms-swift-benchmark"} == {"other"}


def test_oom_rows_keep_no_measurement() -> None:
    for rid in ("LIT-12", "LIT-15", "LITCH-OOM-1"):
        p = PLANS[rid]
        assert isinstance(p, pr.Plan) and p.outcome == "OOM" and p.measured_bytes is None


def test_lora_targets_are_translated_to_transformers_names() -> None:
    assert pf.read_targets({"targets": "q_proj, v_proj, output_proj + MLP (w1,w2,w3)"}) == (
        "q_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    assert pf.read_targets(
        {"targets": "query, value (lora_query/lora_value True; key/projection/mlp/head False)"}
    ) == (
        "q_proj",
        "v_proj",
    )
    assert pf.read_targets({"targets": "ALL (all linear)"}) == ("all-linear",)
    assert "lm_head" in pf.read_targets({"targets": "q_proj, k_proj, v_proj, output_proj + MLP + final output"})


def test_hf_stack_groups_sort_first() -> None:
    groups = sorted({str(r["source_group"]) for r in ROWS}, key=pub._group_order)
    assert groups[: len(pr.HF_GROUPS)] == list(pr.HF_GROUPS)


def test_every_plan_builds_a_spec_and_qwen_v1_geometry_matches_its_stated_size() -> None:
    built = 0
    for p in PLANS.values():
        if isinstance(p, pr.Plan):
            spec = p.build(pr.inventory_for(p.model))
            assert spec.batch.micro_batch >= 1
            built += 1
    assert built >= 30
    swift = PLANS["SWIFT-D1"]
    assert isinstance(swift, pr.Plan)
    params = pr.inventory_for(swift.model).total_params
    assert params == pytest.approx(7_721_324_500, rel=1e-4)  # "7721.3245M" stated by ms-swift


def test_summary_splits_hf_stack_from_other_frameworks(capsys: pytest.CaptureFixture[str]) -> None:
    assert pub.main(["--path", "formula"]) == 0
    out = capsys.readouterr().out
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    for label in ("Hugging Face stack", "other frameworks", "ALL"):
        assert label in lines and "OOM rows" in lines[label], label
    assert "allocated right after the optimizer step" in out and "99th percentile of the per-step reserved" in out


def test_transformers_guide_rows_are_bert_large_classifiers_as_run_in_2022() -> None:
    vanilla, fp16_ada = PLANS["TFDOC-1"], PLANS["TFDOC-7"]
    assert isinstance(vanilla, pr.Plan) and isinstance(fp16_ada, pr.Plan)
    assert vanilla.stack == "hf" and vanilla.metric == "reserved" and not vanilla.metric_sure  # derived from used
    inv = pr.inventory_for(vanilla.model)
    assert inv.shape.task == "seq-cls" and inv.total_params == pytest.approx(335_143_938, rel=1e-6)
    spec = vanilla.build(inv)
    assert spec.activations.attn_implementation.value == "eager" and spec.precision.load_dtype.value == "float32"
    ada = fp16_ada.build(inv)
    assert ada.optimizer.name == "adafactor" and ada.precision.mixed_precision.value == "fp16"
    assert ada.batch.grad_accum == 4 and ada.activations.checkpointing


def test_litgpt_fsdp_rows_keep_frozen_weights_in_the_blocks_units_and_their_ooms_are_called() -> None:
    """litgpt's FSDPStrategy(auto_wrap_policy={Block}) puts the LoRA layers in the Block's flat parameter (Fabric's
    use_orig_params=True): the published OOMs LIT-19 (13B LoRA, 2 x A100-40GB) and LITCH-OOM-1 (7B full, 4 x A10G,
    4 micro-steps per litgpt args.py) are called; both were predicted to fit before."""
    from fitcheck.core import estimate

    for rid in ("LIT-17", "LIT-19", "LIT-20"):
        p = PLANS[rid]
        assert isinstance(p, pr.Plan)
        spec = p.build(pr.inventory_for(p.model))
        assert spec.sharding.fsdp is not None and spec.sharding.fsdp.frozen_shares_units
    for rid in ("LIT-19", "LITCH-OOM-1"):
        p = PLANS[rid]
        assert isinstance(p, pr.Plan) and p.measured_bytes is None
        assert not estimate(p.build(pr.inventory_for(p.model))).fits, rid
    oom = PLANS["LITCH-OOM-1"]
    assert isinstance(oom, pr.Plan)
    assert oom.build(pr.inventory_for(oom.model)).batch.grad_accum == 4


def test_an_inferred_note_is_not_read_as_the_optimizer() -> None:
    row = next(r for r in ROWS if r["id"] == "TT32-1")
    assert pf.read_optimizer({**row, "optimizer": "torch AdamW (inferred: 8-bit AdamW only added later in table)"}) \
        == "adamw_torch"


@pytest.mark.parametrize("rid", ["TT2-6", "TT32-0", "TTA-1", "TTQ-1"])
def test_rows_that_cannot_be_compared_say_why(rid: str) -> None:
    p = PLANS[rid]
    assert isinstance(p, pr.Skip)
    assert any(w in p.reason for w in ("cannot", "not stated", "model init"))


def test_ms_swift_rows_read_the_benchmark_s_length_handling() -> None:
    """ms-swift's Jan-2024 table deleted samples longer than max_length (variable lengths, unpublished): its
    reserved figures are not comparable, each citing the source lines and its Dec-2023 counterpart; the Dec-2023
    table cut them (truncation_left) and is compared, except where max_length is above the mean length."""
    jan = [rid for rid, r in ((str(r["id"]), r) for r in ROWS)
           if r["source_group"] == "ms-swift-benchmark" and not rid.startswith("SWIFT-D")]
    assert all("'delete'" in str(next(r for r in ROWS if r["id"] == rid)["seq_len_kind"]) for rid in jan)
    for rid in ("SWIFT-1", "SWIFT-4", "SWIFT-12", "SWIFT-9"):
        p = PLANS[rid]
        assert isinstance(p, pr.Skip) and "template.py lines 219-221" in p.reason and "SWIFT-D" in p.reason
    for rid in ("SWIFT-D1", "SWIFT-D3", "SWIFT-D11", "SWIFT-D7"):
        p = PLANS[rid]
        assert isinstance(p, pr.Plan) and p.metric == "reserved" and p.metric_sure
    for rid in ("SWIFT-D5", "SWIFT-D6", "SWIFT-D10"):
        p = PLANS[rid]
        assert isinstance(p, pr.Skip) and "Markov" in p.reason
    no_fa = PLANS["SWIFT-D16"]  # Qwen v1 without flash-attn runs SDPA under torch 2, not eager
    assert isinstance(no_fa, pr.Plan)
    assert no_fa.build(pr.inventory_for(no_fa.model)).activations.attn_implementation is pr.AttnImpl.SDPA


def test_an_ambiguous_unit_is_a_skip() -> None:
    row = next(r for r in ROWS if r["id"] == "TT31-8")  # "44.8 GB", memory_gib null
    p = pr.plan_row({**row, "compile": None})
    assert isinstance(p, pr.Skip) and "ambiguous unit" in p.reason


def test_litgpt_rows_read_quantization_and_dropout_as_their_configs_set_them() -> None:
    """config_hub qlora.yaml sets ``quantize: bnb.nf4`` (row: "bnb NF4 (no double quant)"), the 2023 tables name
    ``bnb.nf4`` / ``bnb.nf4-dq``; every litgpt LoRA config of the rows sets ``lora_dropout`` 0.05 (row ``lora.source``).
    Before, "no double quant" was read as double quantization and the dropout as 0."""
    expected = {"LITCH-2": False, "LITCH-4": False, "LITCH-6": False, "LIT-9": False, "LIT-10": True, "LIT-14": True}
    for rid, double in expected.items():
        p = PLANS[rid]
        assert isinstance(p, pr.Plan)
        spec = p.build(pr.inventory_for(p.model))
        assert spec.quant is not None and spec.quant.double_quant is double, rid
        assert spec.lora is not None and spec.lora.dropout == 0.05, rid
    for rid in ("LITCH-1", "LIT-8", "LIT-17"):
        p = PLANS[rid]
        assert isinstance(p, pr.Plan)
        lora = p.build(pr.inventory_for(p.model)).lora
        assert lora is not None and lora.dropout == 0.05, rid


def test_session20_hf_stack_reports_are_read_as_run() -> None:
    """fms-acceleration's A100 table (fms-hf-tuning: the Trainer via TRL 0.13's SFTTrainer, transformers 4.48):
    every run is expressed; each has its Trainer-measured allocated peak and its nvidia-smi figure (``@smi``);
    checkpointing is reentrant (transformers 4.48's default); FSDP-QLoRA stores the 4-bit blocks in bf16 and skips
    k-bit preparation (TRL 0.13 ``is_sharded_qlora``). Full fine-tuning and single-GPU LoRA are within 1 % of the
    measured allocated peak, and the 80 GB OOMs of QLoRA Llama-2-70B on one GPU are called."""
    from fitcheck.core import estimate
    from fitcheck.spec import Dtype

    rows = pr.load_rows(ROOT / "benchmarks" / "data" / "published_reports_session20.json")
    plans = {str(r["id"]): pr.plan_row(r) for r in rows}
    assert len(plans) >= 40 and all(isinstance(p, pr.Plan) for p in plans.values())
    smi = plans["FMS-qlora-mistral-2x2@smi"]
    assert isinstance(smi, pr.Plan) and smi.metric == "used" and smi.metric_sure
    fsdp_qlora = smi.build(pr.inventory_for(smi.model))
    assert fsdp_qlora.quant is not None and fsdp_qlora.quant.quant_storage is Dtype.BFLOAT16
    assert not fsdp_qlora.quant.prepare_for_kbit_training and fsdp_qlora.activations.use_reentrant
    for rid in ("FMS-full-mistral-1x4", "FMS-full-mistral-2x2", "FMS-lora-mistral-1x8"):
        p = plans[rid]
        assert isinstance(p, pr.Plan) and p.metric == "allocated" and p.measured_bytes is not None
        got = estimate(p.build(pr.inventory_for(p.model))).peak_allocated_bytes
        assert abs(got - p.measured_bytes) / p.measured_bytes < 0.01, rid
    for rid in ("FMS-qlora-llama70-1x4", "FMS-qlora-llama70-1x8"):
        p = plans[rid]
        assert isinstance(p, pr.Plan) and p.measured_bytes is None
        assert not estimate(p.build(pr.inventory_for(p.model))).fits, rid


def test_session20_deepspeed_rows_are_read_by_fitcheck_deepspeed_reader() -> None:
    """A DeepSpeed row's ``accelerate_config`` / ``deepspeed_config`` goes through the CLI's readers
    (``read_accelerate_config``, ``resolve_deepspeed``): stage, offload devices and ``zero3_init_flag`` as accelerate
    builds them; ``"auto"`` bucket sizes from the model's own hidden_size (transformers ``trainer_config_finalize``);
    a DeepSpeed value that disagrees with the row's TrainingArguments, or a parallelism the estimate would treat as
    plain data parallel, is the row's skip reason. The GPT-2 XL DDP OOM of the same blog is called."""
    import copy

    from fitcheck.core import estimate
    from fitcheck.spec import MixedPrecision, OffloadDevice, Strategy

    rows = pr.load_rows(ROOT / "benchmarks" / "data" / "published_deepspeed_session20.json")
    plans = {str(r["id"]): pr.plan_row(r) for r in rows}
    assert len(plans) >= 4 and all(isinstance(p, pr.Plan) for p in plans.values())
    off = plans["PEFTREADME-bloomz7b1-Z3OFF"]
    assert isinstance(off, pr.Plan) and off.metric == "allocated"
    spec = off.build(pr.inventory_for(off.model))
    ds = spec.sharding.deepspeed
    assert spec.sharding.strategy is Strategy.DEEPSPEED and spec.sharding.num_processes == 1 and ds is not None
    assert (ds.stage, ds.offload_optimizer, ds.offload_param, ds.zero3_init) == (
        3, OffloadDevice.CPU, OffloadDevice.CPU, True)
    assert spec.precision.mixed_precision is MixedPrecision.NO and spec.lora is not None
    qlora = plans["PEFTDOC-QLoRA-70B-Z3-2GPU"]
    assert isinstance(qlora, pr.Plan) and qlora.metric == "used" and not qlora.metric_sure

    oom = next(r for r in rows if r["id"] == "HFBLOG-gpt2xl-DDP-OOM")
    p = pr.plan_row(oom)
    assert isinstance(p, pr.Plan) and p.measured_bytes is None
    gpt2xl = pr.inventory_for(p.model)
    assert not estimate(p.build(gpt2xl)).fits
    # the same blog's ZeRO-3 offload config (hidden-size "auto" keys, fp16 "enabled": true) on that row
    z3 = {
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"},
                              "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto"},
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1,
    }
    row = {**copy.deepcopy(oom), "distributed": "DeepSpeed ZeRO-3", "deepspeed_config": z3,
           "precision": "fp32 weights, DeepSpeed fp16", "micro_batch_size": 16}
    p = pr.plan_row(row)
    assert isinstance(p, pr.Plan)
    ds = p.build(gpt2xl).sharding.deepspeed
    h = gpt2xl.shape.hidden_size
    assert ds is not None and (ds.reduce_bucket_size, ds.prefetch_bucket_size, ds.param_persistence_threshold) == (
        h * h, int(0.9 * h * h), 10 * h)
    refused = (
        ({"train_micro_batch_size_per_gpu": 4}, "mismatch"),
        ({"fp16": {"enabled": False}, "bf16": {"enabled": True}}, "mismatch"),
        ({"tensor_parallel": {"autotp_size": 2}}, "not modelled"),
        ({"zero_optimization": {"stage": "auto"}}, "not resolvable"),
    )
    for change, why in refused:
        skip = pr.plan_row({**row, "deepspeed_config": {**z3, **change}})
        assert isinstance(skip, pr.Skip) and why in skip.reason, (change, skip)


def test_reserved_is_the_largest_phase_not_only_the_allocated_peak() -> None:
    """A block freed stays cached, so the published gap applies at every phase of the step (``core/estimator.py``):
    a run whose allocated peak is the optimizer step after a logits-heavy backward reserves at least what its backward
    did, side stream pools included. The fms A100 row (Mistral-7B full fine-tune, FSDP1 on 2 GPUs, 4 x 4096,
    nvidia-smi 52.33 GiB): before session 22 only the peak phase entered reserved (used 37.88 GiB, -27.6 %; now
    42.29, -19.2 %)."""
    import json

    from fitcheck.core import allocator, estimate, step
    from fitcheck.core.loading import allocator_conf
    from fitcheck.core.states import fsdp_side_pools
    from fitcheck.report import PHASES, Location, Phase

    data = ROOT / "benchmarks" / "data" / "published_reports_session20.json"
    row = next(r for r in json.loads(data.read_text()) if r["id"] == "FMS-full-mistral-2x4")
    plan = pr.plan_row(row)
    assert isinstance(plan, pr.Plan)
    spec = plan.build(pr.inventory_for(plan.model))
    rep = estimate(spec)
    parts = [c for c in rep.components if not c.name.startswith(("load", "save"))]
    at = {p: allocator.reserved_bytes(spec, sum(c.at(p) for c in parts if c.location is Location.DEVICE),
                                      transient_bytes=step.transient_bytes_at(parts, p)) for p in PHASES}
    side = fsdp_side_pools(spec, allocator_conf(spec))  # FSDP1's unshard / post-backward stream pools
    assert side is not None
    with_side = {p: allocator.plus_side_pools(at[p], side.beyond_allocated(p)) for p in PHASES}
    assert rep.peak_phase is Phase.OPTIMIZER_STEP
    assert rep.peak_reserved_bytes == max(with_side.values()) > with_side[Phase.OPTIMIZER_STEP]


def test_a_replayed_gap_is_the_largest_phase_too_and_never_below_the_replays_own_bytes() -> None:
    """The default path answers TT2-5 (torchtune Llama-2-7B full fine-tune, pure bf16, FSDP1 on 4 x RTX 4090, 4 x 2048,
    reserved 22.44 GiB) with its whole run replayed (``verdict_replay``; gap 0.1517 of the transient bytes). Its
    allocated peak is the optimizer step since session 22, where FSDP1's side pools add 1.30 GiB beyond allocated
    against 3.19 GiB at the start of backward; the replayed gap was taken at the allocated peak alone: 17.96 GiB
    (-20.0 %). A block freed stays cached, so the step's reserved is the largest phase's whichever gap applies
    (``core/allocator.py`` ``phase_reserved``): 19.59 GiB (-12.7 %). And where the replayed run is the answered run
    itself (``ReplayedGap.reserved``), reserved is never below what the replay held."""
    from fitcheck.core import ReplayedGap, allocator, estimate, step
    from fitcheck.core.loading import allocator_conf
    from fitcheck.core.states import fsdp_side_pools
    from fitcheck.report import PHASES, Location, Phase

    plan = PLANS["TT2-5"]
    assert isinstance(plan, pr.Plan)
    spec = plan.build(pr.inventory_for(plan.model))
    gap = 0.1517
    rep = estimate(spec, gap_fraction=gap)
    assert rep == estimate(spec, replayed=ReplayedGap(gap))  # the fraction alone: a stand-in replay's
    parts = [c for c in rep.components if not c.name.startswith(("load", "save"))]
    side = fsdp_side_pools(spec, allocator_conf(spec))
    assert side is not None
    at = {p: allocator.plus_side_pools(
        allocator.reserved_bytes(spec, sum(c.at(p) for c in parts if c.location is Location.DEVICE),
                                 transient_bytes=step.transient_bytes_at(parts, p), gap_fraction=gap),
        side.beyond_allocated(p)) for p in PHASES}
    assert rep.peak_phase is Phase.OPTIMIZER_STEP
    assert rep.peak_reserved_bytes == max(at.values()) == at[Phase.BACKWARD_START] > at[Phase.OPTIMIZER_STEP]
    # the replay's own bytes (its default stream's: a replay of the rank's run, such as the FSDP1 rewrite's, leaves
    # the side streams' events to these pools) are a floor at every phase, the side pools beside them
    held = 17 * 2**30
    floored = estimate(spec, replayed=ReplayedGap(gap, held))
    steps = (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD, Phase.OPTIMIZER_STEP)
    assert floored.fits and floored.peak_reserved_bytes == max(
        allocator.plus_side_pools(max(held, at_own), side.beyond_allocated(p)) for p in steps
        for at_own in [allocator.reserved_bytes(spec, sum(c.at(p) for c in parts if c.location is Location.DEVICE),
                                                transient_bytes=step.transient_bytes_at(parts, p), gap_fraction=gap)])
    assert floored.peak_reserved_bytes > held + side.beyond_allocated(Phase.OPTIMIZER_STEP)
    assert estimate(spec, replayed=ReplayedGap(gap, 1)) == rep  # a floor below every phase changes nothing
    with pytest.raises(ValueError, match="not both"):
        estimate(spec, gap_fraction=gap, replayed=ReplayedGap(gap))
