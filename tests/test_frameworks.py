"""axolotl and LLaMA-Factory YAML (``--axolotl`` / ``--llamafactory``): the frameworks' own example files.

The fixtures are verbatim copies of the frameworks' examples at pinned commits (tests/fixtures/axolotl/README.md,
tests/fixtures/llamafactory/README.md). Each is read with exit 0/1 (or refused by key name, exit 2, where the file
uses something fitcheck does not model); micro-batch, sequence length, trainer kind, method, quantization and
sharding equal the file's; and the estimate of a file equals the estimate of the same run written as flags.
Examples whose ``base_model`` is a Hub mirror outside the offline catalog (NousResearch/...) get the catalog id of
the same weights with ``--model_name_or_path`` (a flag given alongside the file wins, as in the frameworks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.cli.estimate import spec_from_values
from fitcheck.cli.main import main
from fitcheck.errors import ConfigError
from fitcheck.readers import read_axolotl, read_llamafactory
from fitcheck.readers.framework_yaml import MAX_ALIASES
from fitcheck.spec import Strategy, TrainerKind, TrainingSpec

AX = Path(__file__).parent / "fixtures" / "axolotl" / "examples"
LF = Path(__file__).parent / "fixtures" / "llamafactory" / "examples"
LLAMA_1B = "meta-llama/Llama-3.2-1B"  # NousResearch/Llama-3.2-1B mirrors it
LLAMA_8B = "meta-llama/Llama-3.1-8B"  # NousResearch/Meta-Llama-3.1-8B
LLAMA3_8B = "meta-llama/Meta-Llama-3-8B"  # the -Instruct config differs only in eos/bos ids
QWEN3_4B = "Qwen/Qwen3-4B"  # Qwen3-4B-Instruct-2507 has the same shapes


def _spec(flag: str, path: Path, **extra: object) -> TrainingSpec:
    spec, _ = spec_from_values({flag: str(path), **extra}, {})
    return spec


# (file, model override, micro-batch, seq, trainer, method, 4/8-bit, strategy)
AXOLOTL_CASES = [
    ("llama-3/lora-1b.yml", LLAMA_1B, 2, 2048, TrainerKind.TRAINER, "lora", None, Strategy.SINGLE),
    ("llama-3/qlora-1b.yml", LLAMA_1B, 2, 2048, TrainerKind.TRAINER, "lora", 4, Strategy.SINGLE),
    ("llama-3/fft-8b.yaml", LLAMA_8B, 1, 8192, TrainerKind.TRAINER, "full", None, Strategy.SINGLE),
    ("llama-3/instruct-dpo-lora-8b.yml", LLAMA3_8B, 2, 4096, TrainerKind.DPO, "lora", 8, Strategy.SINGLE),
    ("llama-3/qlora-1b-kto.yaml", None, 2, 2048, TrainerKind.KTO, "lora", 4, Strategy.SINGLE),
    ("llama-3/fft-8b-liger-fsdp.yaml", LLAMA_8B, 2, 4096, TrainerKind.TRAINER, "full", None, Strategy.FSDP),
    ("gpt-oss/gpt-oss-20b-fft-fsdp2.yaml", None, 1, 4096, TrainerKind.TRAINER, "full", None, Strategy.FSDP),
    ("gpt-oss/gpt-oss-20b-fft-deepspeed-zero3.yaml", None, 1, 4096, TrainerKind.TRAINER, "full", None,
     Strategy.DEEPSPEED),
    ("mistral/lora.yml", None, 2, 8192, TrainerKind.TRAINER, "lora", 8, Strategy.SINGLE),
    ("mistral/qlora.yml", None, 2, 8192, TrainerKind.TRAINER, "lora", 4, Strategy.SINGLE),
    ("qwen3/qlora-fsdp.yaml", None, 1, 2048, TrainerKind.TRAINER, "lora", 4, Strategy.FSDP),
    ("qwen3/32b-qlora.yaml", None, 1, 2048, TrainerKind.TRAINER, "lora", 4, Strategy.SINGLE),
]


def _method(spec: TrainingSpec) -> str:
    return "lora" if spec.lora is not None else "freeze" if spec.freeze is not None else "full"


@pytest.mark.parametrize(("name", "model", "mbs", "seq", "trainer", "method", "bits", "strategy"), AXOLOTL_CASES)
def test_axolotl_example_fields(
    name: str, model: str | None, mbs: int, seq: int, trainer: TrainerKind, method: str, bits: int | None,
    strategy: Strategy,
) -> None:
    extra = {"model_name_or_path": model} if model else {}
    spec = _spec("axolotl", AX / name, **extra)
    assert (spec.batch.micro_batch, spec.batch.seq_len) == (mbs, seq)
    assert spec.trainer.kind is trainer
    assert _method(spec) == method
    assert (spec.quant.bits if spec.quant is not None else None) == bits
    assert spec.sharding.strategy is strategy


def test_axolotl_example_details() -> None:
    """What axolotl adds beyond the keys: its QLoRA BitsAndBytesConfig, plugins, offloading, ZeRO-3 file."""
    qlora = _spec("axolotl", AX / "llama-3/qlora-1b.yml", model_name_or_path=LLAMA_1B)
    assert qlora.quant is not None and qlora.quant.double_quant and qlora.quant.quant_storage.value == "bfloat16"
    assert not qlora.quant.prepare_for_kbit_training  # norms/embeddings cast back to bf16 by axolotl
    assert qlora.lora is not None and qlora.lora.r == 32 and qlora.lora.dropout == 0.05
    fsdp2 = _spec("axolotl", AX / "gpt-oss/gpt-oss-20b-fft-fsdp2.yaml")
    assert fsdp2.activations.loss == "cce"  # CutCrossEntropyPlugin
    assert fsdp2.activations.offload_activations and fsdp2.activations.checkpointing
    assert fsdp2.sharding.fsdp is not None and fsdp2.sharding.fsdp.version == 2
    ds = _spec("axolotl", AX / "gpt-oss/gpt-oss-20b-fft-deepspeed-zero3.yaml")
    assert ds.sharding.zero_stage == 3
    liger = _spec("axolotl", AX / "llama-3/fft-8b-liger-fsdp.yaml", model_name_or_path=LLAMA_8B)
    assert liger.activations.liger is not None and liger.activations.liger.fused_linear_cross_entropy
    dpo = _spec("axolotl", AX / "llama-3/instruct-dpo-lora-8b.yml", model_name_or_path=LLAMA3_8B)
    assert dpo.lora is not None and dpo.lora.target_modules == ("all-linear",)  # lora_target_linear
    kto = _spec("axolotl", AX / "llama-3/qlora-1b-kto.yaml")
    assert kto.trainer.kind is TrainerKind.KTO and kto.precision.mixed_precision.value == "bf16"


def test_axolotl_gradient_checkpointing_offload_is_checkpointing_plus_trl_offloading() -> None:
    """axolotl@067b021 utils/schemas/validation.py check_gradient_checkpointing_w_offload: ``offload`` is
    rewritten to gradient_checkpointing true + activation_offloading true (not the legacy CPU wrapper)."""
    spec = _spec("axolotl", AX / "qwen3/32b-qlora.yaml")
    assert spec.activations.checkpointing and spec.activations.offload_activations
    assert spec.activations.loss == "cce" and spec.lora is not None and spec.lora.r == 16
    assert spec.provenance["activation_offloading"].endswith("32b-qlora.yaml:gradient_checkpointing")


@pytest.mark.parametrize(("name", "key"), [
    ("gpt-oss/gpt-oss-20b-sft-lora-singlegpu.yaml", "use_kernels"),
])
def test_axolotl_examples_refused_by_key(name: str, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss ``use_kernels: true`` stays refused: transformers 5.23 ``kernelize`` (integrations/hub_kernels.py)
    replaces GptOssMLP by kernels-community/megablocks' MegaBlocksMoeMLP, a Hub build fetched at run time whose
    source is in no pinned package (``kernels`` itself is not installed), so its saved tensors cannot be modelled."""
    code = main(["estimate", "--axolotl", str(AX / name), "--no_trace"])
    err = capsys.readouterr().err
    assert code == 2 and f"{key}: not modelled" in err and "Traceback" not in err
    if key == "use_kernels":
        assert "MegaBlocks" in err


# (file, micro-batch, seq, trainer, method, bits, strategy); sft/pt are the plain Trainer, dpo/kto TRL's
# DPOTrainer/KTOTrainer with LLaMA-Factory's full-logits log-probs (--loss full-logits)
LF_CASES = [
    ("train_lora/qwen3_lora_sft.yaml", 1, 2048, TrainerKind.TRAINER, "lora", None, Strategy.SINGLE),
    ("train_lora/qwen3_lora_pretrain.yaml", 1, 2048, TrainerKind.TRAINER, "lora", None, Strategy.SINGLE),
    ("train_lora/qwen3_lora_sft_ds3.yaml", 1, 2048, TrainerKind.TRAINER, "lora", None, Strategy.DEEPSPEED),
    ("train_full/qwen3_full_sft.yaml", 1, 2048, TrainerKind.TRAINER, "full", None, Strategy.DEEPSPEED),
    ("train_qlora/qwen3_lora_sft_otfq.yaml", 1, 2048, TrainerKind.TRAINER, "lora", 4, Strategy.SINGLE),
    ("train_lora/qwen3_lora_dpo.yaml", 1, 2048, TrainerKind.DPO, "lora", None, Strategy.SINGLE),
    ("train_lora/qwen3_lora_kto.yaml", 1, 2048, TrainerKind.KTO, "lora", None, Strategy.SINGLE),
]


@pytest.mark.parametrize(("name", "mbs", "seq", "trainer", "method", "bits", "strategy"), LF_CASES)
def test_llamafactory_example_fields(
    name: str, mbs: int, seq: int, trainer: TrainerKind, method: str, bits: int | None, strategy: Strategy
) -> None:
    spec = _spec("llamafactory", LF / name, model_name_or_path=QWEN3_4B)
    assert (spec.batch.micro_batch, spec.batch.seq_len) == (mbs, seq)
    assert spec.trainer.kind is trainer
    assert (spec.activations.loss == "full-logits") is (trainer is not TrainerKind.TRAINER)
    assert _method(spec) == method
    assert (spec.quant.bits if spec.quant is not None else None) == bits
    assert spec.sharding.strategy is strategy
    assert spec.activations.checkpointing  # disable_gradient_checkpointing defaults to false
    if spec.lora is not None:
        assert (spec.lora.r, spec.lora.alpha, spec.lora.dropout) == (8, 16.0, 0.0)


@pytest.mark.parametrize("stage", ["reward"])
def test_llamafactory_other_stages_refused(stage: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--llamafactory", str(LF / f"train_lora/qwen3_lora_{stage}.yaml"), "--no_trace"])
    err = capsys.readouterr().err
    assert code == 2 and "stage: not modelled" in err
    import trl

    # why it is refused and not modelled: the value-head class LLaMA-Factory's loader imports is not in the pinned TRL
    assert not hasattr(trl, "AutoModelForCausalLMWithValueHead") and "TRL 1.16" in err


# The same runs written as flags (what a user would type without the file).
EQUIVALENT = [
    (["--axolotl", str(AX / "llama-3/lora-1b.yml"), "--model_name_or_path", LLAMA_1B],
     ["--model_name_or_path", LLAMA_1B, "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
      "--max_seq_length", "2048", "--dtype", "bfloat16", "--bf16", "--optim", "adamw_bnb_8bit",
      "--gradient_checkpointing", "--gradient_checkpointing_kwargs", '{"use_reentrant": false}',
      "--attn_implementation", "flash_attention_2", "--use_peft", "--lora_r", "16", "--lora_alpha", "32",
      "--lora_dropout", "0.05", "--lora_target_modules", "gate_proj", "down_proj", "up_proj", "q_proj", "v_proj",
      "k_proj", "o_proj"]),
    (["--axolotl", str(AX / "llama-3/qlora-1b.yml"), "--model_name_or_path", LLAMA_1B],
     ["--model_name_or_path", LLAMA_1B, "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4",
      "--max_seq_length", "2048", "--dtype", "bfloat16", "--bf16", "--optim", "adamw_bnb_8bit",
      "--gradient_checkpointing", "--attn_implementation", "flash_attention_2", "--use_peft", "--lora_r", "32",
      "--lora_alpha", "16", "--lora_dropout", "0.05", "--lora_target_modules", "gate_proj", "down_proj", "up_proj",
      "q_proj", "v_proj", "k_proj", "o_proj", "--load_in_4bit", "--bnb_4bit_quant_type", "nf4",
      "--use_bnb_nested_quant", "--bnb_4bit_quant_storage", "bfloat16", "--prepare_for_kbit_training", "false"]),
    (["--axolotl", str(AX / "llama-3/fft-8b.yaml"), "--model_name_or_path", LLAMA_8B],
     ["--model_name_or_path", LLAMA_8B, "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8",
      "--max_seq_length", "8192", "--dtype", "bfloat16", "--bf16", "--optim", "paged_adamw_8bit",
      "--gradient_checkpointing", "--attn_implementation", "flash_attention_2"]),
    (["--axolotl", str(AX / "llama-3/instruct-dpo-lora-8b.yml"), "--model_name_or_path", LLAMA3_8B],
     ["--model_name_or_path", LLAMA3_8B, "--trainer", "dpo", "--per_device_train_batch_size", "2",
      "--gradient_accumulation_steps", "4", "--max_seq_length", "4096", "--dtype", "bfloat16", "--bf16",
      "--optim", "adamw_bnb_8bit", "--gradient_checkpointing", "--attn_implementation", "flash_attention_2",
      "--use_peft", "--lora_r", "32", "--lora_alpha", "16", "--lora_dropout", "0.05", "--lora_target_modules",
      "all-linear", "--load_in_8bit", "--prepare_for_kbit_training", "false"]),
    (["--axolotl", str(AX / "gpt-oss/gpt-oss-20b-fft-deepspeed-zero3.yaml"), "--num_processes", "8"],
     ["--model_name_or_path", "openai/gpt-oss-20b", "--num_processes", "8", "--per_device_train_batch_size", "1",
      "--gradient_accumulation_steps", "2", "--max_seq_length", "4096", "--dtype", "bfloat16", "--bf16",
      "--optim", "adamw_torch_8bit", "--gradient_checkpointing", "--activation_offloading", "--loss", "cce",
      "--attn_implementation", "flash_attention_2",
      "--deepspeed", str(AX.parent / "deepspeed_configs/zero3_bf16.json")]),
    (["--llamafactory", str(LF / "train_lora/qwen3_lora_sft.yaml"), "--model_name_or_path", QWEN3_4B],
     ["--model_name_or_path", QWEN3_4B, "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8",
      "--max_seq_length", "2048", "--dtype", "bfloat16", "--bf16", "--gradient_checkpointing",
      "--gradient_checkpointing_kwargs", '{"use_reentrant": true}', "--use_peft", "--lora_r", "8",
      "--lora_alpha", "16", "--lora_dropout", "0", "--lora_target_modules", "all-linear"]),
    (["--llamafactory", str(LF / "train_full/qwen3_full_sft.yaml"), "--model_name_or_path", QWEN3_4B,
      "--num_processes", "4"],
     ["--model_name_or_path", QWEN3_4B, "--num_processes", "4", "--per_device_train_batch_size", "1",
      "--gradient_accumulation_steps", "2", "--max_seq_length", "2048", "--dtype", "bfloat16", "--bf16",
      "--gradient_checkpointing", "--gradient_checkpointing_kwargs", '{"use_reentrant": true}',
      "--deepspeed", str(LF / "deepspeed/ds_z3_config.json")]),
    (["--llamafactory", str(LF / "train_qlora/qwen3_lora_sft_otfq.yaml"), "--model_name_or_path", QWEN3_4B],
     ["--model_name_or_path", QWEN3_4B, "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8",
      "--max_seq_length", "2048", "--dtype", "bfloat16", "--bf16", "--gradient_checkpointing",
      "--gradient_checkpointing_kwargs", '{"use_reentrant": true}', "--use_peft", "--lora_r", "8",
      "--lora_alpha", "16", "--lora_dropout", "0", "--lora_target_modules", "all-linear",
      "--load_in_4bit", "--use_bnb_nested_quant", "--bnb_4bit_quant_storage", "bfloat16",
      "--bnb_4bit_compute_dtype", "bfloat16", "--prepare_for_kbit_training", "false"]),
    *((["--llamafactory", str(LF / f"train_lora/qwen3_lora_{stage}.yaml"), "--model_name_or_path", QWEN3_4B],
        ["--model_name_or_path", QWEN3_4B, "--trainer", stage, "--loss", "full-logits",
         "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8", "--max_seq_length", "2048",
         "--dtype", "bfloat16", "--bf16", "--gradient_checkpointing", "--gradient_checkpointing_kwargs",
         '{"use_reentrant": true}', "--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0",
         "--lora_target_modules", "all-linear"])
      for stage in ("dpo", "kto")),
    (["--axolotl", str(AX / "qwen3/32b-qlora.yaml")],  # gradient_checkpointing: offload (validation.py)
     ["--model_name_or_path", "Qwen/Qwen3-32B", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps",
      "2", "--max_seq_length", "2048", "--dtype", "bfloat16", "--bf16", "--optim", "adamw_torch_4bit",
      "--gradient_checkpointing", "--gradient_checkpointing_kwargs", '{"use_reentrant": false}',
      "--activation_offloading", "--loss", "cce", "--attn_implementation", "flash_attention_2", "--use_peft",
      "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0", "--lora_target_modules", "q_proj", "k_proj",
      "v_proj", "o_proj", "down_proj", "up_proj", "--load_in_4bit", "--bnb_4bit_quant_type", "nf4",
      "--use_bnb_nested_quant", "--bnb_4bit_quant_storage", "bfloat16", "--prepare_for_kbit_training", "false"]),
]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    code = main(["estimate", *argv, "--json", "--no_trace", "--gpu", "H100-80GB"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The estimate without where its inputs were read (findings and assumptions name the file or the flag)."""
    kept = {k: v for k, v in report.items() if k not in ("findings", "assumptions")}
    kept["finding_codes"] = sorted(
        f["code"] for f in report["findings"] if f["code"] not in ("not-modelled", "unknown-keys", "spelling-read")
    )
    return kept


@pytest.mark.parametrize(("from_file", "as_flags"), EQUIVALENT, ids=[
    "axolotl-lora-1b", "axolotl-qlora-1b", "axolotl-fft-8b", "axolotl-dpo-int8-8b", "axolotl-gpt-oss-zero3",
    "lf-lora-sft", "lf-full-zero3", "lf-qlora", "lf-dpo-full-logits", "lf-kto-full-logits",
    "axolotl-qwen3-32b-qlora-gc-offload"])
def test_file_equals_flags(from_file: list[str], as_flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code_file, by_file = _json(capsys, from_file)
    code_flags, by_flags = _json(capsys, as_flags)
    assert code_file == code_flags
    assert _comparable(by_file) == _comparable(by_flags)


def test_flags_override_the_file() -> None:
    spec = _spec("axolotl", AX / "llama-3/lora-1b.yml", model_name_or_path=LLAMA_1B,
                 per_device_train_batch_size=7, max_seq_length=512)
    assert (spec.batch.micro_batch, spec.batch.seq_len) == (7, 512)
    assert spec.provenance.get("per_device_train_batch_size", "--per_device_train_batch_size").startswith("--")


def test_provenance_names_file_and_key() -> None:
    spec, _ = spec_from_values({"axolotl": str(AX / "llama-3/lora-1b.yml"), "model_name_or_path": LLAMA_1B}, {})
    assert spec.provenance["per_device_train_batch_size"].endswith("lora-1b.yml:micro_batch_size")
    assert spec.provenance["max_seq_length"].endswith("lora-1b.yml:sequence_len")


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cfg.yml"
    path.write_text(text)
    return str(path)


def test_unknown_keys_one_warning(tmp_path: Path) -> None:
    run = read_axolotl(_write(tmp_path, "base_model: meta-llama/Llama-3.2-1B\nfoo_bar: 1\nbaz: true\n"), cwd=".")
    unknown = [f for f in run.findings if f.code == "unknown-keys"]
    assert len(unknown) == 1 and "baz, foo_bar" in unknown[0].message


@pytest.mark.parametrize(("text", "key"), [
    ("chunked_cross_entropy: true\n", "chunked_cross_entropy"),
    ("activation_offloading: disk\n", "activation_offloading"),
    ("activation_offloading: legacy\n", "activation_offloading"),
    ("gradient_checkpointing: offload_disk\n", "gradient_checkpointing"),
    ("rl: orpo\n", "rl"),
    ("plugins: [some.other.Plugin]\n", "plugins"),
    ("adapter: lora\nlora_r: 8\nload_in_4bit: true\n", "load_in_4bit"),
    ("adapter: lora\nlora_r: 8\ngradient_checkpointing: false\n", "lora_mlp_kernel"),
])
def test_axolotl_refusals_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, "base_model: meta-llama/Llama-3.2-1B\n" + text)
    with pytest.raises(ConfigError) as err:
        read_axolotl(path, cwd=".")
    assert f"{key}: not modelled" in str(err.value)


@pytest.mark.parametrize(("text", "key"), [
    ("use_unsloth_gc: true\n", "use_unsloth_gc"),
    ("quantization_bit: 4\nquantization_method: hqq\n", "quantization_method"),
    ("finetuning_type: freeze\n", "finetuning_type"),
    ("stage: ppo\n", "stage"),
    ("upcast_lmhead_output: true\n", "upcast_lmhead_output"),
    ("stage: dpo\npref_loss: orpo\n", "pref_loss"),
    ("stage: dpo\nfinetuning_type: full\n", "finetuning_type"),
    ("stage: dpo\nref_model: Qwen/Qwen3-8B\n", "ref_model"),
    ("stage: kto\nfinetuning_type: full\n", "finetuning_type"),
    ("stage: kto\nenable_liger_kernel: true\n", "enable_liger_kernel"),
])
def test_llamafactory_refusals_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, "model_name_or_path: Qwen/Qwen3-4B\nbf16: true\n" + text)
    with pytest.raises(ConfigError) as err:
        read_llamafactory(path, cwd=".")
    assert f"{key}: not modelled" in str(err.value)


def test_llamafactory_freeze_under_pure_bf16_trains_the_last_layers(tmp_path: Path) -> None:
    path = _write(tmp_path, "model_name_or_path: Qwen/Qwen3-4B\npure_bf16: true\nbf16: true\nfinetuning_type: freeze\n")
    spec, _ = spec_from_values({"llamafactory": path}, {})
    assert spec.freeze is not None and spec.lora is None


def test_llamafactory_full_without_zero3_is_fp32_under_autocast(tmp_path: Path) -> None:
    path = _write(tmp_path, "model_name_or_path: Qwen/Qwen3-4B\nbf16: true\nfinetuning_type: full\n")
    spec, _ = spec_from_values({"llamafactory": path}, {})
    assert spec.precision.load_dtype.value == "float32" and spec.precision.mixed_precision.value == "bf16"


def test_alias_bomb_and_size_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ['a0: &a0 ["x", "x"]'] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 120)]
    bomb = _write(tmp_path, "\n".join(lines) + "\n")
    assert MAX_ALIASES < 2 * 119
    code = main(["estimate", "--axolotl", bomb])
    assert code == 2 and "alias" in capsys.readouterr().err
    big = tmp_path / "big.yml"
    big.write_text("base_model: x\n" + "#" * (2 << 20))
    assert main(["estimate", "--llamafactory", str(big)]) == 2
    assert "larger than" in capsys.readouterr().err


def test_python_tags_are_not_executed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "base_model: !!python/object/apply:os.system ['echo pwned']\n")
    assert main(["estimate", "--axolotl", path]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_named_deepspeed_file_missing_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "base_model: meta-llama/Llama-3.2-1B\ndeepspeed: nowhere/zero3.json\n")
    assert main(["estimate", "--axolotl", path]) == 2
    assert "deepspeed: file 'nowhere/zero3.json' not found" in capsys.readouterr().err


def test_launch_axolotl_train_estimates_then_runs_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    from fitcheck.cli import launch

    ran: list[list[str]] = []
    cfg = str(AX / "llama-3/qlora-1b-kto.yaml")
    code = launch.main(["--json", "axolotl", "train", cfg, "--micro_batch_size", "4"],
                       launcher=lambda cmd: ran.append(list(cmd)) or 0, env={})
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and ran == [["axolotl", "train", cfg, "--micro_batch_size", "4"]]
    assert (report["micro_batch"], report["seq_len"], report["trainer"]) == (4, 2048, "kto")


def test_launch_accelerate_module_and_llamafactory_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from fitcheck.cli import launch

    ran: list[list[str]] = []
    cfg = str(AX / "mistral/qlora.yml")
    env = {"FITCHECK_ACCELERATE_LAUNCHER": "accelerate-stub"}
    code = launch.main(["--json", "--num_processes", "2", "-m", "axolotl.cli.train", cfg],
                       launcher=lambda cmd: ran.append(list(cmd)) or 0, env=env)
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and ran == [["accelerate-stub", "-m", "axolotl.cli.train", cfg]]
    assert (report["micro_batch"], report["num_processes"], report["strategy"]) == (2, 2, "ddp")
    lf = str(LF / "train_lora/qwen3_lora_sft.yaml")
    code = launch.main(["--check-only", "--json", "--model_name_or_path", QWEN3_4B, "llamafactory-cli", "train", lf,
                        "cutoff_len=4096"], env={})
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["seq_len"] == 4096
    assert launch.main(["--check-only", "llamafactory-cli", "train", lf, "--json"], env={}) == 2
    assert "overrides are key=value" in capsys.readouterr().err
