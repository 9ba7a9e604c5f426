"""LLM.int8 LoRA activations (fitcheck/core/activations/int8.py) against fake-tensor traces of the real
bitsandbytes ``Linear8bitLt`` layers (``MatMul8bitFp`` on CPU): one layer's saved bytes per token to the byte
(2-layer minus 1-layer trace), with and without checkpointing; the CUDA path is from source."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tiny_models import spec_from_config

from fitcheck.core.activations.int8 import (
    int8_checkpointed_inputs,
    int8_formula_applies,
    int8_layer_saved_per_token,
)
from fitcheck.core.activations.qlora import lora_layer_params, qlora_layer_saved_per_token
from fitcheck.spec import DeviceType, HardwareSpec, LoraSpec, QuantSpec

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2000,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
INT8 = QuantSpec(bits=8)
DROP = LoraSpec(r=8, alpha=16, dropout=0.05, target_modules=("all-linear",))
PLAIN = LoraSpec(r=8, alpha=16, target_modules=("all-linear",))
QV = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
SEQ = 64


def _layer_delta(lora: LoraSpec, mixed: str, attn: str, ckpt: bool, reentrant: bool = False) -> dict[str, int]:
    """Bytes per token one more decoder layer adds to the trace, by phase (activations)."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from fitcheck.torch_adapters.tracer import trace_step

    runs = [
        trace_step(TINY, seq_len=SEQ, micro_batch=1, dtype="bfloat16", mixed_precision=mixed,
                   attn_implementation=attn, checkpointing=ckpt, lora=lora, quant=INT8, num_layers=n,
                   use_reentrant=reentrant)
        for n in (1, 2)
    ]
    return {p.value: (runs[1].phases[p].get("activations") - runs[0].phases[p].get("activations")) // SEQ
            for p in runs[0].phases}


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("lora", "mixed", "attn"),
    [(DROP, "no", "sdpa"), pytest.param(PLAIN, "no", "sdpa", marks=SLOW), pytest.param(QV, "no", "sdpa", marks=SLOW),
     (DROP, "bf16", "sdpa"), pytest.param(PLAIN, "bf16", "sdpa", marks=SLOW),
     pytest.param(DROP, "no", "eager", marks=SLOW), pytest.param(DROP, "bf16", "eager", marks=SLOW)],
)
def test_int8_layer_equals_trace(lora: LoraSpec, mixed: str, attn: str) -> None:
    spec = spec_from_config(TINY, seq=SEQ, mixed=mixed, attn=attn, lora=lora, quant=INT8)
    assert int8_formula_applies(spec)
    per_token, s2 = int8_layer_saved_per_token(spec, attn == "eager")
    # autocast keeps the bf16 casts of the layer's LoRA weights until backward (a per-layer constant)
    cache = 2 * lora_layer_params(spec) // TINY["num_hidden_layers"] // SEQ if mixed == "bf16" else 0
    assert _layer_delta(lora, mixed, attn, False)["end of forward"] == per_token + s2 * SEQ + cache


@pytest.mark.parametrize("mixed", ["no", pytest.param("bf16", marks=SLOW)])
def test_checkpointed_int8_layer_keeps_every_linear_input(mixed: str) -> None:
    """Non-reentrant checkpointing drops saved tensors, not ``ctx.A`` (an attribute of MatMul8bitFp)."""
    spec = spec_from_config(TINY, seq=SEQ, mixed=mixed, checkpointing=True, lora=DROP, quant=INT8)
    residual = 4 * TINY["hidden_size"]  # the fp32 checkpoint input (k-bit preparation upcasts the model)
    assert _layer_delta(DROP, mixed, "sdpa", True)["start of backward"] == residual + int8_checkpointed_inputs(spec)


def test_int8_layer_exceeds_the_qlora_layer_where_only_ctx_a_keeps_the_input() -> None:
    spec = spec_from_config(TINY, seq=SEQ, lora=DROP, quant=INT8)
    h, inter = TINY["hidden_size"], TINY["intermediate_size"]
    extra = int8_layer_saved_per_token(spec, False)[0] - qlora_layer_saved_per_token(spec, False)[0]
    assert extra == 4 * (2 * h + inter)
    plain = spec_from_config(TINY, seq=SEQ, lora=PLAIN, quant=INT8)  # fp32 adapters keep those inputs already
    assert int8_layer_saved_per_token(plain, False) == qlora_layer_saved_per_token(plain, False)


def test_cuda_int8_autocast_keeps_fp32_mlp_outputs() -> None:
    """MatMul8bitLt returns the input's dtype (int8 GEMM, no autocast op): the MLP stays fp32 on CUDA, while CPU's
    MatMul8bitFp runs F.linear under autocast (bf16 outputs)."""
    cpu = spec_from_config(TINY, seq=SEQ, mixed="bf16", lora=DROP, quant=INT8)
    cuda = dataclasses.replace(cpu, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    inter = TINY["intermediate_size"]
    assert int8_layer_saved_per_token(cuda, False)[0] - int8_layer_saved_per_token(cpu, False)[0] == 8 * inter
    assert int8_checkpointed_inputs(cuda) - int8_checkpointed_inputs(cpu) == 2 * inter


@pytest.mark.slow
def test_reentrant_checkpointing_keeps_no_ctx_a() -> None:
    """Reentrant checkpointing runs the forward under no_grad: no MatMul8bitFp node, no ctx.A."""
    from fitcheck.core.estimator import estimate
    from fitcheck.report import Phase

    assert _layer_delta(DROP, "no", "sdpa", True, reentrant=True)["start of backward"] == 4 * TINY["hidden_size"]
    spec = spec_from_config(TINY, seq=SEQ, checkpointing=True, lora=DROP, quant=INT8)
    re = dataclasses.replace(spec, activations=dataclasses.replace(spec.activations, use_reentrant=True))

    def saved(s: Any) -> int:
        return next(c.at(Phase.BACKWARD_START) for c in estimate(s).components if c.name == "activations.saved")

    layers = TINY["num_hidden_layers"]
    assert saved(spec) - saved(re) == layers * int8_checkpointed_inputs(spec) * SEQ


def test_int8_lora_is_pinned_on_cpu_and_from_source_on_cuda() -> None:
    from fitcheck.core.activations import in_envelope
    from fitcheck.core.estimator import estimate
    from fitcheck.torch_adapters.differential import Cell, cell_spec

    # bf16: the autocast kind is in envelope_probe_misses.json (Llama-2-7B 1 x 1152: +2.9 %), not pinned anywhere
    cpu = cell_spec(Cell("llama", "int8", True, "sdpa", "bf16", 2048, 2))
    assert in_envelope(cpu) and estimate(cpu).pinned  # inside its checked range (envelope_ranges.json, issue 20)
    short = cell_spec(Cell("llama", "int8", True, "sdpa", "bf16", 64, 1))
    assert not in_envelope(short)  # below it: its single grid cell pinned this before
    assert not any("lower bound" in f.hint for f in estimate(cpu).findings)
    cuda = dataclasses.replace(cpu, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    report = estimate(cuda)
    assert not in_envelope(cuda) and not report.pinned
    assert any(f.code == "not-pinned" and "MatMul8bitLt" in f.message for f in report.findings)
    assert any(f.code == "cuda-not-traced" and "subA" in f.message for f in report.findings)
