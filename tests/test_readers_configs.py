"""Reader tests over the real-world corpus in tests/fixtures (origins in tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding
from fitcheck.readers.accelerate_config import default_config_path, read_accelerate_config
from fitcheck.readers.deepspeed import load_deepspeed_file, resolve_deepspeed
from fitcheck.readers.fsdp_config import fsdp_from_config, fsdp_option_string
from fitcheck.readers.merge import merge_sources
from fitcheck.readers.trainer_args import read_script_argv, read_training_args_file
from fitcheck.spec import MixedPrecision, OffloadDevice, Strategy

FIX = Path(__file__).parent / "fixtures"
DS = FIX / "deepspeed"
ACC = FIX / "accelerate"
TA = FIX / "training_args"
NO_ENV: dict[str, str] = {"HOME": "/nonexistent-home"}


def codes(findings: tuple[Finding, ...]) -> list[str]:
    return [f.code for f in findings]


# ---------------------------------------------------------------- DeepSpeed


def test_transformers_zero2_auto_resolved_from_run() -> None:
    raw = load_deepspeed_file(str(DS / "transformers_ds_config_zero2.json"))
    run = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": True}
    ds = resolve_deepspeed(raw, source="z2.json", run=run, run_provenance={}, world_size=8, hidden_size=4096)
    assert (ds.micro_batch, ds.grad_accum, ds.train_batch_size) == (4, 2, 64)
    assert ds.mixed_precision is MixedPrecision.BF16 and not ds.precision_from_file
    assert ds.spec.stage == 2 and ds.spec.offload_optimizer is OffloadDevice.CPU and ds.spec.pin_memory
    assert ds.spec.reduce_bucket_size == 200_000_000 and ds.spec.allgather_bucket_size == 200_000_000
    assert ds.spec.overlap_comm is True
    assert "deepspeed-trainer-mismatch" not in codes(ds.findings)


def test_transformers_zero3_as_shipped_fails_like_deepspeed() -> None:
    raw = load_deepspeed_file(str(DS / "transformers_ds_config_zero3.json"))
    # No batch keys at all: DeepSpeed's _set_batch_related_parameters asserts.
    with pytest.raises(ConfigError, match="Either train_batch_size or train_micro_batch_size_per_gpu"):
        resolve_deepspeed(raw, source="z3.json", run={}, run_provenance={}, world_size=4, hidden_size=None)
    # With a micro batch: reduce_bucket_size 0 violates DeepSpeedZeroConfig Field(gt=0).
    raw["train_micro_batch_size_per_gpu"] = "auto"
    with pytest.raises(ConfigError, match="reduce_bucket_size"):
        resolve_deepspeed(raw, source="z3.json", run={}, run_provenance={}, world_size=4, hidden_size=None)
    zero = dict(raw["zero_optimization"])  # type: ignore[call-overload]
    zero["reduce_bucket_size"] = "auto"
    raw["zero_optimization"] = zero
    ds = resolve_deepspeed(
        raw,
        source="z3.json",
        run={"per_device_train_batch_size": 2},
        run_provenance={},
        world_size=4,
        hidden_size=1024,
    )
    assert (ds.micro_batch, ds.grad_accum, ds.train_batch_size) == (2, 1, 8)  # accelerate adds GAS 1
    assert ds.spec.stage == 3 and ds.spec.reduce_bucket_size == 1024 * 1024
    assert ds.spec.offload_param is OffloadDevice.CPU and ds.spec.offload_optimizer is OffloadDevice.CPU
    assert ds.spec.prefetch_bucket_size == 0 and ds.spec.param_persistence_threshold == 0
    assert ds.spec.sub_group_size == 10**14
    assert ds.mixed_precision is MixedPrecision.FP16 and ds.precision_from_file


def test_accelerate_zero2_auto_bucket_from_hidden_size() -> None:
    raw = load_deepspeed_file(str(DS / "accelerate_zero_stage2_config.json"))
    ds = resolve_deepspeed(raw, source="a2.json", run={}, run_provenance={}, world_size=2, hidden_size=4096)
    assert ds.spec.reduce_bucket_size == 4096 * 4096  # transformers trainer_config_finalize: hidden²
    assert (ds.micro_batch, ds.grad_accum, ds.train_batch_size) == (8, 1, 16)  # TrainingArguments default 8
    assert "TrainingArguments default" in ds.provenance["train_micro_batch_size_per_gpu"]
    assert ds.mixed_precision is MixedPrecision.FP16


def test_accelerate_zero3_offload_hidden_autos() -> None:
    raw = load_deepspeed_file(str(DS / "accelerate_zero_stage3_offload_config.json"))
    ds = resolve_deepspeed(
        raw,
        source="a3.json",
        run={"per_device_train_batch_size": 1},
        run_provenance={},
        world_size=8,
        hidden_size=4096,
    )
    assert ds.spec.prefetch_bucket_size == int(0.9 * 4096 * 4096)
    assert ds.spec.param_persistence_threshold == 10 * 4096
    assert ds.spec.max_live_parameters == 1_000_000_000 and ds.spec.sub_group_size == 1_000_000_000


def test_hidden_size_auto_without_hidden_size_is_config_error() -> None:
    raw = load_deepspeed_file(str(DS / "accelerate_zero_stage3_offload_config.json"))
    with pytest.raises(ConfigError, match=r"reduce_bucket_size.*hidden_size"):
        resolve_deepspeed(raw, source="a3.json", run={}, run_provenance={}, world_size=8, hidden_size=None)


def test_batch_assertion_worded_like_deepspeed() -> None:
    raw = {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
    }
    with pytest.raises(
        ConfigError,
        match=r"train_batch_size is not equal to micro_batch_per_gpu \* "
        r"gradient_acc_step \* world_size 32 != 4 \* 1 \* 4",
    ):
        resolve_deepspeed(raw, source="ds.json", run={}, run_provenance={}, world_size=4, hidden_size=None)


def test_trainer_mismatch_is_an_error_finding_naming_both() -> None:
    raw = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 1},
    }
    ds = resolve_deepspeed(
        raw,
        source="ds.json",
        run={"gradient_accumulation_steps": 2},
        run_provenance={"gradient_accumulation_steps": "args.json:gradient_accumulation_steps"},
        world_size=2,
        hidden_size=None,
    )
    f = next(f for f in ds.findings if f.code == "deepspeed-trainer-mismatch")
    assert "ds gradient_accumulation_steps=8 vs hf gradient_accumulation_steps=2" in f.message
    assert "args.json" in f.message and "auto" in f.hint


def test_unknown_zero_key_warns_and_removed_key_errors() -> None:
    raw = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}}
    ds = resolve_deepspeed(raw, source="ds.json", run={}, run_provenance={}, world_size=1, hidden_size=None)
    assert "deepspeed-unknown-key" in codes(ds.findings)
    raw["zero_optimization"] = {"stage": 3, "mics_shard_size": 8}
    with pytest.raises(ConfigError, match="mics_shard_size"):
        resolve_deepspeed(raw, source="ds.json", run={}, run_provenance={}, world_size=1, hidden_size=None)


def test_negative_bucket_and_missing_zero_section() -> None:
    raw = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": -5}}
    with pytest.raises(ConfigError, match="reduce_bucket_size"):
        resolve_deepspeed(raw, source="ds.json", run={}, run_provenance={}, world_size=1, hidden_size=None)
    with pytest.raises(ConfigError, match="ZeRO optimization config"):
        resolve_deepspeed(
            {"train_batch_size": 8},
            source="ds.json",
            run={},
            run_provenance={},
            world_size=1,
            hidden_size=None,
        )


def test_tensor_parallel_not_modelled() -> None:
    raw = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 1},
        "tensor_parallel": {"autotp_size": 2},
    }
    ds = resolve_deepspeed(raw, source="ds.json", run={}, run_provenance={}, world_size=2, hidden_size=None)
    assert "not-modelled" in codes(ds.findings)


def test_zero_keys_match_installed_deepspeed() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from fitcheck.readers.deepspeed_zero import ZERO_KEYS

    names = {f.alias or n for n, f in DeepSpeedZeroConfig.model_fields.items()} | set(
        DeepSpeedZeroConfig.model_fields
    )
    assert names <= ZERO_KEYS


# ---------------------------------------------------------------- accelerate


def test_accelerate_single_gpu() -> None:
    acc = read_accelerate_config(str(ACC / "single_gpu.yaml"))
    assert (acc.distributed_type, acc.num_processes, acc.num_machines) == ("NO", 1, 1)
    assert acc.mixed_precision is MixedPrecision.BF16


def test_accelerate_multi_node_counts_total_processes() -> None:
    acc = read_accelerate_config(str(ACC / "multi_node.yaml"))
    run = merge_sources(
        {},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=str(ACC / "multi_node.yaml"),
        fsdp=None,
        env=NO_ENV,
    )
    assert acc.num_processes == 8 and acc.num_machines == 2
    assert run.sharding.strategy is Strategy.DDP and run.sharding.processes_per_machine == 4


def test_accelerate_inline_deepspeed_zero3() -> None:
    run = merge_sources(
        {"per_device_train_batch_size": 2},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=str(ACC / "trl_deepspeed_zero3.yaml"),
        fsdp=None,
        env=NO_ENV,
        hidden_size=4096,
    )
    ds = run.sharding.deepspeed
    assert run.sharding.strategy is Strategy.DEEPSPEED and ds is not None
    assert ds.stage == 3 and ds.offload_optimizer is OffloadDevice.NONE and ds.zero3_init
    # zero3_save_16bit_model: true -> zero_optimization.stage3_gather_16bit_weights_on_model_save (accelerate 1.15
    # DeepSpeedPlugin.__post_init__); the save-time gather is estimated from it
    assert ds.gather_16bit_on_save
    assert run.values["fp16"] is True and run.values["gradient_accumulation_steps"] == 1
    assert run.sharding.num_processes == 8


def test_accelerate_deepspeed_file_missing_is_config_error() -> None:
    acc = read_accelerate_config(str(ACC / "deepspeed_file.yaml"))
    assert acc.deepspeed_config_file == "../deepspeed_config_templates/zero_stage1_config.json"
    assert acc.zero3_init is False and acc.num_processes == 2
    with pytest.raises(ConfigError, match="does not exist"):
        merge_sources(
            {},
            training_args_file=None,
            deepspeed_file=None,
            accelerate_config_file=str(ACC / "deepspeed_file.yaml"),
            fsdp=None,
            env=NO_ENV,
        )


def test_accelerate_deepspeed_file_with_inline_keys_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "acc.yaml"
    cfg.write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
        "  deepspeed_config_file: ds.json\n  zero_stage: 2\n"
    )
    with pytest.raises(ConfigError, match=r"deepspeed_config_file.*zero_stage"):
        read_accelerate_config(str(cfg))


def test_accelerate_fsdp1_legacy_strategy() -> None:
    acc = read_accelerate_config(str(ACC / "fsdp1.yaml"))
    assert acc.fsdp is not None
    fs = acc.fsdp.spec
    assert (fs.version, fs.sharding_strategy, fs.reshard_after_forward, fs.offload_params) == (
        1,
        "FULL_SHARD",
        True,
        False,
    )
    assert fs.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" and fs.use_orig_params
    assert fs.backward_prefetch == "BACKWARD_PRE"  # accelerate's template; the Trainer's own default: NO_PREFETCH


@pytest.mark.parametrize(("cfg", "want"), [
    ({"fsdp_version": 1}, "NO_PREFETCH"),
    ({"fsdp_version": 1, "fsdp_backward_prefetch": "2"}, "BACKWARD_POST"),
    ({"fsdp_version": 2, "fsdp_backward_prefetch": "BACKWARD_PRE"}, "NO_PREFETCH"),
])
def test_fsdp_backward_prefetch_as_accelerate_reads_it(cfg: dict[str, object], want: str) -> None:
    """accelerate 1.15 ``FullyShardedDataParallelPlugin``: a name or torch's ``BackwardPrefetch`` value; None under
    FSDP2; a bad value refused (exit 2)."""
    assert fsdp_from_config(cfg, source="acc.yaml", flavour="accelerate").spec.backward_prefetch == want
    with pytest.raises(ConfigError, match="fsdp_backward_prefetch"):
        fsdp_from_config({"fsdp_version": 1, "fsdp_backward_prefetch": "BACKWARDS"}, source="acc.yaml",
                         flavour="accelerate")


def test_accelerate_fsdp2() -> None:
    run = merge_sources(
        {},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=str(ACC / "trl_fsdp2.yaml"),
        fsdp=None,
        env=NO_ENV,
    )
    fs = run.sharding.fsdp
    assert run.sharding.strategy is Strategy.FSDP and fs is not None
    assert (fs.version, fs.reshard_after_forward, fs.sharding_strategy) == (2, True, "FULL_SHARD")
    assert run.values["bf16"] is True and run.provenance["bf16"].endswith("mixed_precision")


def test_accelerate_fsdp_qlora_offload() -> None:
    acc = read_accelerate_config(str(ACC / "trl_fsdp_qlora.yaml"))
    assert acc.fsdp is not None and acc.fsdp.spec.offload_params and not acc.fsdp.spec.use_orig_params


def test_accelerate_unknown_top_level_key_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "a.yaml"
    cfg.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nnum_proceses: 4\n")
    with pytest.raises(ConfigError, match="unknown keys"):
        read_accelerate_config(str(cfg))


def test_accelerate_num_processes_minus_one_needs_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "a.yaml"
    cfg.write_text("distributed_type: MULTI_GPU\nnum_processes: -1\n")
    with pytest.raises(ConfigError, match="--num_processes"):
        merge_sources(
            {},
            training_args_file=None,
            deepspeed_file=None,
            accelerate_config_file=str(cfg),
            fsdp=None,
            env=NO_ENV,
        )
    run = merge_sources(
        {"num_processes": 4},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=str(cfg),
        fsdp=None,
        env=NO_ENV,
    )
    assert run.sharding.num_processes == 4 and run.provenance["num_processes"] == "--num_processes"


def test_default_config_location_honours_env(tmp_path: Path) -> None:
    assert default_config_path({"HF_HOME": "/h"}) == "/h/accelerate/default_config.yaml"
    assert default_config_path({"XDG_CACHE_HOME": "/x"}) == "/x/huggingface/accelerate/default_config.yaml"
    assert default_config_path({"HOME": "/u"}) == "/u/.cache/huggingface/accelerate/default_config.yaml"
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accelerate" / "default_config.yaml").write_text((ACC / "trl_multi_gpu.yaml").read_text())
    run = merge_sources(
        {},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=None,
        fsdp=None,
        env={"HF_HOME": str(tmp_path)},
    )
    assert run.sharding.num_processes == 8 and "accelerate-default-config" in codes(run.findings)


# ---------------------------------------------------------------- TrainingArguments


def test_alignment_handbook_yaml() -> None:
    read = read_training_args_file(str(TA / "alignment_handbook_zephyr_sft_qlora.yaml"))
    v = read.values
    assert v["per_device_train_batch_size"] == 4 and v["gradient_accumulation_steps"] == 2
    assert v["dtype"] == "bfloat16" and read.provenance["dtype"][1] == "torch_dtype"
    assert v["max_seq_length"] == 2048 and read.provenance["max_seq_length"][1] == "max_length"
    assert v["gradient_checkpointing"] is True and v["load_in_4bit"] is True and v["lora_r"] == 16
    assert v["lora_target_modules"] == (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    assert "chat_template" in read.ignored
    spelled = [f.message for f in read.findings if f.code == "spelling-read"]
    assert any("torch_dtype" in m for m in spelled)


def test_transformers_5_json_prefers_new_name() -> None:
    read = read_training_args_file(str(TA / "transformers_5_23_to_json_string.json"))
    assert read.values["gradient_checkpointing"] is True
    assert read.provenance["gradient_checkpointing"][1] == "activation_checkpointing"
    assert read.values["gradient_checkpointing_kwargs"] == {"every_n_layers": 2}
    run = merge_sources(
        {},
        training_args_file=str(TA / "transformers_5_23_to_json_string.json"),
        deepspeed_file=None,
        accelerate_config_file=None,
        fsdp=None,
        env=NO_ENV,
    )
    assert run.values["checkpoint_every_n_layers"] == 2 and run.sharding.strategy is Strategy.SINGLE


def test_transformers_4x_spellings() -> None:
    read = read_training_args_file(str(TA / "transformers_4x_spellings.json"))
    assert (
        read.values["eval_strategy"] == "steps"
        and read.provenance["eval_strategy"][1] == "evaluation_strategy"
    )
    assert read.values["use_cpu"] is False and read.values["dtype"] == "float16"
    assert read.values["fp16"] is True


def test_script_argv_passes_over_unknown_flags() -> None:
    argv = [
        "--model_name_or_path",
        "m",
        "--per-device-train-batch-size",
        "4",
        "--bf16",
        "--my_flag",
        "x",
        "y",
        "--no_use_cpu",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--gradient_checkpointing=false",
        "--fsdp",
        "--max_length",
        "512",
    ]
    read = read_script_argv(argv)
    v = read.values
    assert v["per_device_train_batch_size"] == 4 and v["bf16"] is True and v["use_cpu"] is False
    assert v["lora_target_modules"] == ("q_proj", "v_proj") and v["gradient_checkpointing"] is False
    assert v["fsdp"] is True and v["max_seq_length"] == 512
    assert "--my_flag" in read.ignored and "script-flags-passed-over" in codes(read.findings)


def test_script_argv_missing_value() -> None:
    with pytest.raises(ConfigError, match="--per_device_train_batch_size expects a value"):
        read_script_argv(["--per_device_train_batch_size"])


# ---------------------------------------------------------------- merge precedence and conflicts


def test_cli_beats_file_beats_deepspeed(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text('{"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": true}')
    run = merge_sources(
        {"per_device_train_batch_size": 3},
        training_args_file=str(args),
        deepspeed_file=str(DS / "transformers_ds_config_zero2.json"),
        accelerate_config_file=None,
        fsdp=None,
        env=NO_ENV,
        hidden_size=4096,
    )
    assert run.values["per_device_train_batch_size"] == 3
    assert run.provenance["per_device_train_batch_size"] == "--per_device_train_batch_size"
    assert run.values["gradient_accumulation_steps"] == 4
    assert run.provenance["gradient_accumulation_steps"] == f"{args}:gradient_accumulation_steps"
    assert run.sharding.deepspeed is not None and run.sharding.deepspeed.stage == 2
    assert "conflicting-sources" in codes(run.findings)


def test_trainer_bf16_vs_deepspeed_fp16_names_both(tmp_path: Path) -> None:
    run = merge_sources(
        {"bf16": True},
        training_args_file=None,
        deepspeed_file=str(DS / "accelerate_zero_stage2_config.json"),
        accelerate_config_file=None,
        fsdp=None,
        env=NO_ENV,
        hidden_size=1024,
    )
    f = next(f for f in run.findings if f.code == "precision-conflict")
    assert "--bf16" in f.message and "accelerate_zero_stage2_config.json" in f.message


def test_gas_in_accelerate_and_trainer_conflict(tmp_path: Path) -> None:
    run = merge_sources(
        {"gradient_accumulation_steps": 4},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=str(ACC / "trl_deepspeed_zero3.yaml"),
        fsdp=None,
        env=NO_ENV,
        hidden_size=None,
    )
    f = next(f for f in run.findings if f.code == "deepspeed-trainer-mismatch")
    assert "gradient_accumulation_steps=1 vs hf gradient_accumulation_steps=4" in f.message
    assert "--gradient_accumulation_steps" in f.message


def test_cli_sharding_flags() -> None:
    run = merge_sources(
        {
            "zero_stage": 3,
            "offload_optimizer": "cpu",
            "offload_param": "cpu",
            "num_processes": 16,
            "num_machines": 2,
        },
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=None,
        fsdp=None,
        env=NO_ENV,
    )
    ds = run.sharding.deepspeed
    assert ds is not None and ds.stage == 3 and ds.offload_param is OffloadDevice.CPU
    assert run.sharding.processes_per_machine == 8
    run = merge_sources(
        {"num_processes": 8, "gradient_accumulation_steps": 4},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=None,
        fsdp="full_shard auto_wrap offload",
        env=NO_ENV,
    )
    fs = run.sharding.fsdp
    assert fs is not None and fs.version == 2 and fs.offload_params and fs.reshard_after_forward


def test_fsdp_option_string_rules() -> None:
    assert fsdp_option_string("shard_grad_op auto_wrap", at="--fsdp") == {"reshard_after_forward": False}
    assert fsdp_option_string("hybrid_shard", at="--fsdp", version=1) == {
        "reshard_after_forward": "HYBRID_SHARD"
    }
    with pytest.raises(ConfigError, match="only available with FSDP1"):
        fsdp_option_string("hybrid_shard", at="--fsdp")
    with pytest.raises(ConfigError, match="Unknown `fsdp` option"):
        fsdp_option_string("full_shrad", at="--fsdp")


def test_fsdp_config_file_and_sync_each_batch(tmp_path: Path) -> None:
    cfg = tmp_path / "fsdp.json"
    cfg.write_text('{"fsdp_version": 1, "fsdp_sharding_strategy": "HYBRID_SHARD", "fsdp_cpu_offload": false}')
    run = merge_sources(
        {"num_processes": 16, "num_machines": 2, "fsdp_config": str(cfg), "sync_each_batch": True},
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=None,
        fsdp="full_shard",
        env=NO_ENV,
    )
    fs = run.sharding.fsdp
    assert fs is not None and fs.sharding_strategy == "HYBRID_SHARD" and fs.sync_each_batch


def test_deepspeed_and_fsdp_together_is_error() -> None:
    with pytest.raises(ConfigError, match="both configured"):
        merge_sources(
            {"zero_stage": 2, "num_processes": 2},
            training_args_file=None,
            deepspeed_file=None,
            accelerate_config_file=None,
            fsdp="full_shard",
            env=NO_ENV,
        )


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        merge_sources(
            {},
            training_args_file=str(tmp_path / "nope.json"),
            deepspeed_file=None,
            accelerate_config_file=None,
            fsdp=None,
            env=NO_ENV,
        )
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        merge_sources(
            {},
            training_args_file=None,
            deepspeed_file=str(bad),
            accelerate_config_file=None,
            fsdp=None,
            env=NO_ENV,
        )


def test_the_users_stage3_reuse_distance_and_live_parameters_are_read() -> None:
    """Both reach the ZeRO-3 replay (``deepspeed_run_zero3``); DeepSpeed's names and their aliases."""
    from fitcheck.readers.deepspeed_zero import zero_spec

    for reuse, live in (("stage3_max_reuse_distance", "stage3_max_live_parameters"),
                        ("max_reuse_distance", "max_live_parameters")):
        prov: dict[str, str] = {}
        spec = zero_spec({"stage": 3, reuse: 0, live: 3e8}, source="z3.json", hidden=64, prov=prov, findings=[])
        assert (spec.max_reuse_distance, spec.max_live_parameters) == (0, 300_000_000)
    with pytest.raises(ConfigError, match="stage3_max_reuse_distance"):
        zero_spec({"stage": 3, "stage3_max_reuse_distance": -1}, source="z3.json", hidden=64, prov={}, findings=[])
