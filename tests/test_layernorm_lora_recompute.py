"""GPT-2 / Phi checkpointed LoRA under CUDA autocast: the formula equals a CUDA-kernel fake-tensor trace (<= 1 %).

The runs TRL's defaults give these families (fp32 GPT-2 and fp16 Phi-2 weights under bf16 autocast, every layer
checkpointed, LoRA on every linear): the recipe's 16-bit matmul outputs and gelu_new's fp32 tensors, the top
layer's recompute / gelu-backward moments (``core/activations/layernorm_recompute.py``) and Phi's fp32 residual
stream. Main was -10 % .. -47 % during backward and -43 % at the start of backward (Phi) on these tiny models.
Real widths: ``benchmarks/layernorm_lora_vs_trace.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tiny_models import spec_from_config

from fitcheck.core import estimate
from fitcheck.report import Category, Phase
from fitcheck.spec import DeviceType, LoraSpec, TrainerKind, TrainerSpec, TrainingSpec

GPT2: dict[str, Any] = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=256, n_head=8, n_layer=3,
                            vocab_size=2000, n_positions=512, bos_token_id=0, eos_token_id=0)
PHI: dict[str, Any] = dict(model_type="phi", architectures=["PhiForCausalLM"], hidden_size=256, num_attention_heads=8,
                           num_key_value_heads=8, num_hidden_layers=3, intermediate_size=1024, vocab_size=2000,
                           partial_rotary_factor=0.4, resid_pdrop=0.1, bos_token_id=0, eos_token_id=0)
BODY = (Category.ACTIVATIONS, Category.TEMPORARIES, Category.GRADIENTS)
# one case per family (the CI budget); dropout off and other shapes: benchmarks/layernorm_lora_vs_trace.py
CASES = [
    ("gpt2", GPT2, "float32", 0.05, 4, 128),
    ("phi", PHI, "float16", 0.05, 2, 128),
]


def _spec(cfg: dict[str, Any], dtype: str, dropout: float, b: int, s: int) -> TrainingSpec:
    spec = spec_from_config(cfg, seq=s, batch=b, dtype=dtype, mixed="bf16", checkpointing=True,
                            lora=LoraSpec(r=16, alpha=32, target_modules=("all-linear",), dropout=dropout),
                            device=DeviceType.CUDA)
    # TRL's SFTTrainer: its fused LM head is the formula's in both answers (the trace leaves the logits out)
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, config=cfg),
                               trainer=TrainerSpec(kind=TrainerKind.SFT))


@pytest.mark.parametrize(("name", "cfg", "dtype", "dropout", "b", "s"), CASES,
                         ids=[f"{c[0]}-{c[2]}-drop{c[3]}-{c[4]}x{c[5]}" for c in CASES])
def test_checkpointed_lora_autocast_matches_cuda_trace(name: str, cfg: dict[str, Any], dtype: str, dropout: float,
                                                       b: int, s: int) -> None:
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters import activation_trace_kwargs, trace_step

    spec = _spec(cfg, dtype, dropout, b, s)
    report = estimate(spec)
    traced = trace_step(cfg, **activation_trace_kwargs(spec))  # CUDA kernels: autocast lists, fused SDPA
    for phase in (Phase.BACKWARD_START, Phase.BACKWARD):
        br = traced.phases[phase]
        trace = br.total - br.get("parameters") - br.get("optimizer_state")
        formula = sum(c.at(phase) for c in report.components if c.category in BODY)
        assert abs(formula - trace) <= 0.01 * trace, (name, phase.value, formula, trace)
