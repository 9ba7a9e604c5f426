"""Flat TrainingArguments/TRL values -> TrainingSpec: defaults the libraries use, coercion, errors."""

from __future__ import annotations

import re

import pytest

from fitcheck.errors import ConfigError
from fitcheck.families import traits_of_type
from fitcheck.readers.run_args import canonical_key, spec_from_values
from fitcheck.spec import (
    AttnImpl,
    DeviceType,
    Dtype,
    Kind,
    MixedPrecision,
    ModelInventory,
    ModelShape,
    ParamEntry,
    Role,
    Strategy,
)


def tiny(family: str = "llama", dtype: Dtype | None = Dtype.BFLOAT16) -> ModelInventory:
    shape = ModelShape(
        family=family,
        traits=traits_of_type(family),
        architecture="LlamaForCausalLM",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
        config_dtype=dtype,
    )
    params = (
        ParamEntry(
            "model.embed_tokens.weight", (100, 64), Role.EMBEDDING, Kind.EMBEDDING, module="embed_tokens"
        ),
        ParamEntry(
            "model.layers.*.self_attn.q_proj.weight",
            (64, 64),
            Role.ATTENTION,
            Kind.LINEAR,
            2,
            "q_proj",
            64,
            64,
        ),
        ParamEntry(
            "lm_head.weight",
            (100, 64),
            Role.LM_HEAD,
            Kind.LINEAR,
            module="lm_head",
            in_features=64,
            out_features=100,
        ),
    )
    return ModelInventory("tiny", shape, params)


def test_defaults_are_the_libraries_defaults() -> None:
    spec, assumptions = spec_from_values({}, inventory=tiny())
    assert spec.precision.load_dtype is Dtype.BFLOAT16  # dtype="auto" -> config.json's dtype
    assert spec.precision.mixed_precision is MixedPrecision.NO
    assert spec.optimizer.name == "adamw_torch_fused"
    assert (spec.batch.micro_batch, spec.batch.seq_len, spec.batch.grad_accum) == (8, 1024, 1)
    assert spec.activations.attn_implementation is AttnImpl.SDPA
    assert spec.sharding.strategy is Strategy.SINGLE
    assert spec.hardware.device_type is DeviceType.CUDA
    assert spec.lora is None and spec.quant is None
    assert any("auto" in a for a in assumptions)


def test_config_without_dtype_loads_float32() -> None:
    spec, _ = spec_from_values({}, inventory=tiny(dtype=None))
    assert spec.precision.load_dtype is Dtype.FLOAT32


def test_aliases_and_string_coercion() -> None:
    assert canonical_key("torch_dtype") == "dtype"
    assert canonical_key("activation_checkpointing") == "gradient_checkpointing"
    assert canonical_key("max-length") == "max_seq_length"
    spec, _ = spec_from_values(
        {
            "torch_dtype": "float32",
            "bf16": "true",
            "activation_checkpointing": True,
            "per_device_train_batch_size": "4",
            "max_length": 2048,
            "num_processes": "4",
        },
        inventory=tiny(),
    )
    assert spec.precision.load_dtype is Dtype.FLOAT32
    assert spec.precision.mixed_precision is MixedPrecision.BF16
    assert spec.activations.checkpointing
    assert (spec.batch.micro_batch, spec.batch.seq_len) == (4, 2048)
    assert spec.sharding.strategy is Strategy.DDP and spec.sharding.num_processes == 4


def test_trl_lora_defaults_and_peft_target_table() -> None:
    spec, _ = spec_from_values({"use_peft": True}, inventory=tiny())
    assert spec.lora is not None
    assert (spec.lora.r, spec.lora.alpha, spec.lora.dropout) == (16, 32.0, 0.05)  # TRL ModelConfig defaults
    assert spec.lora.target_modules == ("q_proj", "v_proj")  # peft's table for llama


def test_family_without_peft_default_needs_targets() -> None:
    with pytest.raises(ConfigError, match="lora_target_modules"):
        spec_from_values({"use_peft": True}, inventory=tiny(family="phi3"))


def test_quantization_compute_dtype_follows_dtype() -> None:
    spec, _ = spec_from_values(
        {"load_in_4bit": True, "use_bnb_nested_quant": True, "dtype": "bfloat16"}, inventory=tiny()
    )
    assert spec.quant is not None
    assert (spec.quant.bits, spec.quant.quant_type, spec.quant.double_quant) == (4, "nf4", True)
    assert spec.quant.compute_dtype is Dtype.BFLOAT16


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"bf16": True, "fp16": True}, "only one of bf16"),
        ({"load_in_4bit": True, "load_in_8bit": True}, "only one"),
        ({"per_device_train_batch_size": -2}, "per_device_train_batch_size"),
        ({"gradient_accumulation_steps": 1.5}, "gradient_accumulation_steps"),
        ({"bf16": "maybe"}, "true or false"),
        ({"dtype": "int3"}, "dtype"),
        ({"num_processes": 6, "num_machines": 4}, "num_machines"),
        ({"optim_args": "rank"}, "key=value"),
        ({"loss": "mse"}, "loss"),
    ],
)
def test_bad_values_name_the_source(values: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        spec_from_values(values, inventory=tiny(), provenance={"dtype": "args.yaml:dtype"})


def test_provenance_is_used_in_messages() -> None:
    with pytest.raises(ConfigError, match=re.escape("args.yaml:per_device_train_batch_size")):
        spec_from_values(
            {"per_device_train_batch_size": 0},
            inventory=tiny(),
            provenance={"per_device_train_batch_size": "args.yaml:per_device_train_batch_size"},
        )


def test_pre_quantized_checkpoint_quantization_wins_and_other_methods_are_reported() -> None:
    import dataclasses

    bnb = dataclasses.replace(
        tiny(),
        quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "fp4"},
    )
    spec, _ = spec_from_values({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, inventory=bnb)
    assert spec.quant is not None and spec.quant.pre_quantized and spec.quant.quant_type == "fp4"
    gptq = dataclasses.replace(tiny(), quantization_config={"quant_method": "gptq", "bits": 4})
    spec, _ = spec_from_values({}, inventory=gptq)
    assert spec.quant is not None and spec.quant.method == "gptq"  # pre-quantized schemes are modelled (issue 12)
    hqq = dataclasses.replace(tiny(), quantization_config={"quant_method": "hqq", "nbits": 4})
    spec, _ = spec_from_values({}, inventory=hqq)
    assert spec.quant is None
    assert "quantization-not-modelled" in [f.code for f in spec.findings]
