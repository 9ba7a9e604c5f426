"""FSDP1 units that hold frozen and trainable parameters together (core/states/fsdp_mixed_units.py), against torch's
real FSDP1 (CPU, gloo, one rank) over a real peft LoRA model: a wrap by decoder layer (Lightning Fabric's
``auto_wrap_policy={Block}``) gives every layer's frozen weights a gradient; peft's ``fsdp_auto_wrap_policy`` (what the
Trainer sets) does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from fitcheck.core import estimate
from fitcheck.readers import inventory_from_config
from fitcheck.report import Phase
from fitcheck.spec import (
    BatchSpec,
    FsdpSpec,
    LoraSpec,
    MixedPrecision,
    PrecisionSpec,
    ShardingSpec,
    Strategy,
    TrainingSpec,
)
from fitcheck.spec.model import Dtype

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 256, "tie_word_embeddings": False, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
           "hidden_act": "silu"}

_FSDP1_CPU = r"""
import json, sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
cfg = json.loads(sys.argv[1])
out = {}
for wrap in ("block", "peft"):
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**cfg)).float(),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    policy = ModuleWrapPolicy({LlamaDecoderLayer}) if wrap == "block" else fsdp_auto_wrap_policy(model)
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"))
    ids = torch.randint(0, 256, (2, 16))
    with model.no_sync():  # an accumulation micro-step: the unsharded gradients stay
        model(input_ids=ids, labels=ids).loss.backward()
    flat = [m._flat_param for m in FSDP.fsdp_modules(model) if m._flat_param is not None]
    out[wrap] = sum(f.grad.numel() * f.grad.element_size() for f in flat if f.grad is not None)
print("RESULT " + json.dumps(out))
dist.destroy_process_group()
"""


def _spec(mixed: bool) -> TrainingSpec:
    return TrainingSpec(
        model=inventory_from_config(_CONFIG, "tiny-llama", "test"),
        batch=BatchSpec(micro_batch=2, seq_len=16, grad_accum=2),
        precision=PrecisionSpec(load_dtype=Dtype.FLOAT32, mixed_precision=MixedPrecision.NO),
        lora=LoraSpec(r=4, alpha=4, target_modules=("q_proj", "v_proj")),
        sharding=ShardingSpec(strategy=Strategy.FSDP, num_processes=1,
                              fsdp=FsdpSpec(version=1, use_orig_params=True, frozen_shares_units=mixed)),
    )


def _grad_bytes(spec: TrainingSpec) -> int:
    report = estimate(spec)
    return sum(c.at(Phase.BACKWARD) for c in report.components if c.name.startswith("gradients"))


def test_real_fsdp1_gives_a_mixed_units_frozen_weights_a_gradient(free_port: int) -> None:
    port = free_port
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    config = {k: v for k, v in _CONFIG.items() if k not in ("model_type", "architectures")}
    done = subprocess.run([sys.executable, "-c", _FSDP1_CPU, json.dumps(config)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    # a wrap by decoder layer: the gradient covers the layers' frozen weights (the root unit holds no adapter)
    assert measured["block"] == _grad_bytes(_spec(mixed=True))
    # peft's policy: the LoRA layers are units of their own, only they have gradients
    assert measured["peft"] == _grad_bytes(_spec(mixed=False))
    assert measured["block"] > 20 * measured["peft"]


def test_mixed_units_only_under_fsdp1_with_use_orig_params() -> None:
    mixed = _spec(mixed=True)
    fs = mixed.sharding.fsdp
    assert fs is not None
    report = estimate(mixed)
    assert any(f.code == "fsdp-frozen-in-trainable-units" for f in report.findings)
    for other in (replace(fs, version=2), replace(fs, use_orig_params=False)):
        spec = replace(mixed, sharding=replace(mixed.sharding, fsdp=other))
        assert not any(c.name == "gradients.frozen_in_units" for c in estimate(spec).components)
