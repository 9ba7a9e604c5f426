"""PEFT / quantization config readers, and reading live objects by attribute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.errors import ConfigError, NotModelledError
from fitcheck.findings import Finding
from fitcheck.readers.peft_config import (
    lora_from_mapping,
    lora_from_object,
    read_adapter_config,
)
from fitcheck.readers.quantization_config import (
    quant_from_mapping,
    quant_from_model_config,
    quant_from_object,
)
from fitcheck.readers.trainer_args import read_training_args_object
from fitcheck.spec import Dtype, QuantSpec


def test_live_lora_config_object() -> None:
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(
        r=32, lora_alpha=64, target_modules=["q_proj", "v_proj"], use_dora=True, modules_to_save=["lm_head"]
    )
    spec = lora_from_object(cfg)
    assert spec.r == 32 and spec.alpha == 64 and spec.use_dora and spec.modules_to_save == ("lm_head",)
    assert set(spec.target_modules) == {"q_proj", "v_proj"}
    assert lora_from_object(peft.LoraConfig(target_modules="all-linear")).target_modules == ("all-linear",)
    assert lora_from_object(peft.LoraConfig(target_modules=r".*\.q_proj")).target_regex == r".*\.q_proj"


def test_adapter_config_json_and_non_lora(tmp_path: Path) -> None:
    path = tmp_path / "adapter_config.json"
    path.write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 8,
                "lora_alpha": 16,
                "target_modules": ["c_attn"],
                "layers_to_transform": [0, 1],
                "rank_pattern": {"c_attn": 4},
            }
        )
    )
    spec = read_adapter_config(str(path))
    assert spec.layers_to_transform == (0, 1) and spec.rank_pattern == {"c_attn": 4}
    with pytest.raises(NotModelledError, match="IA3"):
        lora_from_mapping({"peft_type": "IA3"}, source="a.json")
    with pytest.raises(ConfigError, match="lora_dropout"):
        lora_from_mapping({"lora_dropout": 1.5}, source="a.json")


_UNMODELLED_KEYS = ("exclude_modules", "bias", "lora_bias", "layer_replication", "trainable_token_indices",
                    "use_bdlora", "init_lora_weights", "kasa_config", "use_qalora")


@pytest.mark.parametrize("key", _UNMODELLED_KEYS)
def test_lora_settings_that_change_the_trained_tensors_are_refused(tmp_path: Path, key: str) -> None:
    """peft 0.21.2 accepts these LoraConfig settings and trains something other than plain LoRA (MiCA freezes B,
    BD-LoRA splits the factors into blocks, ...); read from the adapter_config.json peft itself writes, each is
    refused naming the key (it used to be estimated as plain LoRA)."""
    peft = pytest.importorskip("peft")
    from peft.tuners.lora.config import BdLoraConfig, KasaConfig

    value = {
        "exclude_modules": ["v_proj"],
        "bias": "lora_only",
        "lora_bias": True,
        "layer_replication": [(0, 2), (1, 3)],
        "trainable_token_indices": [0, 1],
        "use_bdlora": BdLoraConfig(target_modules_bd_a=["q_proj"], target_modules_bd_b=["v_proj"], nblocks=2),
        "init_lora_weights": "mica",
        "kasa_config": KasaConfig(),
        "use_qalora": True,
    }[key]
    cfg = peft.LoraConfig(target_modules=["q_proj", "v_proj"], **{key: value})
    cfg.save_pretrained(str(tmp_path))
    with pytest.raises(NotModelledError, match=rf"adapter_config.json:{key}: {key}="):
        read_adapter_config(str(tmp_path / "adapter_config.json"))
    with pytest.raises(NotModelledError, match=rf"LoraConfig:{key}"):
        lora_from_object(cfg)


def test_init_only_lora_settings_are_estimated_as_plain_lora(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    for init in ("gaussian", "pissa", "olora", "orthogonal", False):
        cfg = peft.LoraConfig(target_modules=["q_proj"], init_lora_weights=init)
        cfg.save_pretrained(str(tmp_path))
        assert read_adapter_config(str(tmp_path / "adapter_config.json")).r == 8


def test_bitsandbytes_config_object_and_dict() -> None:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    for q in (quant_from_object(cfg), quant_from_mapping(cfg.to_dict(), source="bnb")):
        assert isinstance(q, QuantSpec)
        assert (q.bits, q.quant_type, q.double_quant) == (4, "nf4", True)
        assert q.compute_dtype is Dtype.BFLOAT16 and q.quant_storage is Dtype.BFLOAT16
    default = quant_from_object(transformers.BitsAndBytesConfig(load_in_4bit=True))
    # transformers turns compute dtype None into torch.float32 on the object
    assert (
        isinstance(default, QuantSpec)
        and default.quant_type == "fp4"
        and default.compute_dtype is Dtype.FLOAT32
    )


def test_pre_quantized_checkpoint_and_gptq() -> None:
    q = quant_from_model_config(
        {
            "quantization_config": {
                "quant_method": "bitsandbytes",
                "_load_in_4bit": True,
                "bnb_4bit_quant_type": "nf4",
            }
        },
        source="config.json",
    )
    assert isinstance(q, QuantSpec) and q.pre_quantized
    gptq = quant_from_model_config(
        {"quantization_config": {"quant_method": "gptq", "bits": 4}}, source="c.json"
    )
    assert isinstance(gptq, QuantSpec) and gptq.method == "gptq" and gptq.pre_quantized  # issue 12: modelled
    hqq = quant_from_model_config({"quantization_config": {"quant_method": "hqq", "nbits": 4}}, source="c.json")
    assert isinstance(hqq, Finding) and "hqq" in hqq.message
    with pytest.raises(ConfigError, match="both true"):
        quant_from_mapping({"load_in_4bit": True, "load_in_8bit": True}, source="q")


def test_live_training_arguments_object() -> None:
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(
        output_dir="/tmp/fitcheck-unused",
        per_device_train_batch_size=3,
        gradient_accumulation_steps=5,
        activation_checkpointing=True,
        optim="adamw_torch",
        use_cpu=True,
        report_to="none",
    )
    read = read_training_args_object(args)
    v = read.values
    assert v["per_device_train_batch_size"] == 3 and v["gradient_accumulation_steps"] == 5
    assert v["gradient_checkpointing"] is True and v["optim"] == "adamw_torch"
    assert read.provenance["gradient_checkpointing"] == ("TrainingArguments", "activation_checkpointing")


def test_preflight_refuses_a_peft_config_it_does_not_model() -> None:
    """The same refusal on preflight's/FitcheckCallback's ``peft_config`` path (integrations/spec_build.lora_values)."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from fitcheck import preflight

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    mica = peft.LoraConfig(target_modules=["q_proj", "v_proj"], init_lora_weights="mica")
    with pytest.raises(NotModelledError, match="LoraConfig:init_lora_weights"):
        preflight(config, peft_config=mica, gpu="H100-80GB", max_seq_length=128)
    plain = peft.LoraConfig(target_modules=["q_proj", "v_proj"])
    assert preflight(config, peft_config=plain, gpu="H100-80GB", max_seq_length=128).spec.lora is not None
