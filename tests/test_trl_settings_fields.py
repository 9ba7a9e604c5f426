"""Issue 18: TRL settings are typed RunSettings fields, TRL defaults a merge layer, read-only after the readers."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from fitcheck.errors import ConfigError
from fitcheck.readers import merge_sources, trl_default_layer
from fitcheck.readers.run_settings import RunSettings


def test_trl_fields_are_typed_settings() -> None:
    s = RunSettings.from_values({"trainer": "grpo", "beta": "0.04", "num_generations": "4", "use_vllm": "true",
                                 "loss_type": "sigmoid"})
    assert (s.trainer, s.beta, s.num_generations, s.use_vllm, s.loss_type) == ("grpo", 0.04, 4, True, ("sigmoid",))
    with pytest.raises(ConfigError, match="beta"):
        RunSettings.from_values({"beta": "x"})


def test_default_layer_reads_never_writes() -> None:
    values = {"trainer": "dpo", "bf16": False}
    layer = trl_default_layer(values)
    assert values == {"trainer": "dpo", "bf16": False}  # not mutated
    assert "bf16" not in layer and layer["gradient_checkpointing"] == (True, "TRL DPOConfig default")
    assert layer["max_seq_length"] == (1024, "TRL DPOConfig default")
    assert trl_default_layer({}) == {}  # the plain Trainer: no TRL defaults


def test_merge_layers_trl_defaults_below_the_flags_and_hands_out_read_only_views() -> None:
    merged = merge_sources({"trainer": "sft", "gradient_checkpointing": "false"}, training_args_file=None,
                           deepspeed_file=None, accelerate_config_file=None, fsdp=None,
                           env={"HF_HOME": "/nonexistent"})
    s = merged.settings
    assert s.gradient_checkpointing is False and s.where("gradient_checkpointing") == "--gradient_checkpointing"
    assert s.bf16 is True and s.where("bf16") == "TRL SFTConfig default"
    assert isinstance(s.provenance, MappingProxyType) and isinstance(merged.values, MappingProxyType)


def test_a_live_deepspeed_dict_goes_through_the_merge() -> None:
    ds = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    merged = merge_sources({"deepspeed": ds, "num_processes": 2}, training_args_file=None, deepspeed_file=None,
                           accelerate_config_file=None, fsdp=None, env={"HF_HOME": "/nonexistent"})
    assert merged.sharding.deepspeed is not None and merged.sharding.deepspeed.stage == 3
    assert merged.settings.per_device_train_batch_size == 2
    assert ds == {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2,
                  "gradient_accumulation_steps": 1}
