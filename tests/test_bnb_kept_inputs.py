"""bitsandbytes <= 0.43.1 keeps every 4-bit linear's input (``MatMul4Bit.forward``: ``ctx.tensors = (A, B)``; PR #1270,
0.43.2, made it ``(None, B)``): the formula (fitcheck/core/activations/bnb_kept_inputs.py) against fake-tensor traces
of the real transformers Llama + peft + bitsandbytes 0.50.2 ``Linear4bit`` step with that line put back
(``tracer_quant.matmul4bit_keeps_input``), and the finding."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tiny_models import spec_from_config

from fitcheck.core import estimate
from fitcheck.report import Phase
from fitcheck.spec import Dtype, LoraSpec, QuantSpec, StackSpec

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2000,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}
OLD = StackSpec((("bitsandbytes", "0.42.0"),), "--stack")
QV = ("q_proj", "v_proj")
H, INTER = 256, 688
# (LoRA targets, dropout, checkpointing, k-bit preparation), per-layer extra bytes per token at the end of forward
RECIPES = {
    # HF q/v QLoRA without preparation (bf16 residual = compute dtype): q/k/v's norm output (peft casts it to the
    # fp32 adapter), the MLP norm output and the MLP product; o_proj reads SDPA's saved output
    "qv": ((QV, 0.0, False, False), 2 * (2 * H + INTER)),
    # peft k-bit preparation (fp32 residual): x.to(bfloat16) is a fresh copy per linear, nothing else holds it
    "qv-prep": ((QV, 0.0, False, True), 2 * (3 * H + H + 2 * H + INTER)),
    # non-reentrant checkpointing: every kept input survives the checkpoint, the first layer's too
    "all-dropout-ckpt": ((("all-linear",), 0.05, True, True), 2 * (3 * H + H + 2 * H + INTER)),
}
PHASES = (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD)


def _device(report: Any, phase: Phase) -> int:
    return sum(c.at(phase) for c in report.components if c.location.value == "device")


@pytest.mark.parametrize("seq", [64, 256])
@pytest.mark.parametrize("name", list(RECIPES))
def test_old_bitsandbytes_kept_inputs_formula_equals_trace(name: str, seq: int) -> None:
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    from fitcheck.torch_adapters.tracer_depth import trace_components

    (targets, dropout, ckpt, prep), per_layer = RECIPES[name]
    quant = QuantSpec(bits=4, quant_type="nf4", compute_dtype=Dtype.BFLOAT16, prepare_for_kbit_training=prep)
    lora = LoraSpec(r=8, alpha=16, dropout=dropout, target_modules=targets)
    new = spec_from_config(TINY, seq=seq, checkpointing=ckpt, lora=lora, quant=quant)
    old = dataclasses.replace(new, stack=OLD)
    f_new, f_old = estimate(new), estimate(old)
    t_new, t_old = estimate(new, activations=trace_components(new)), estimate(old, activations=trace_components(old))
    first_less = 0 if ckpt else 2 * H * (3 if prep else 1)  # layer 0: no q/k/v node (input needs no grad)
    end = _device(f_old, Phase.FORWARD_END) - _device(f_new, Phase.FORWARD_END)
    assert end == (2 * per_layer - first_less) * seq
    for phase in PHASES:
        f_delta = _device(f_old, phase) - _device(f_new, phase)
        t_delta = _device(t_old, phase) - _device(t_new, phase)
        if phase is not Phase.BACKWARD:  # the moments before backward: the same bytes exactly
            assert f_delta == t_delta, phase
        assert abs(f_delta - t_delta) <= 0.01 * _device(t_old, phase), phase
        # and the old stack's answer is as close to its trace as the modelled stack's is to its own
        old_error = abs(_device(f_old, phase) - _device(t_old, phase)) / _device(t_old, phase)
        assert old_error <= abs(_device(f_new, phase) - _device(t_new, phase)) / _device(t_new, phase) + 0.01, phase


def test_old_bitsandbytes_finding_is_modelled_info_or_a_bounded_warning() -> None:
    quant = QuantSpec(bits=4, quant_type="nf4", compute_dtype=Dtype.BFLOAT16)
    spec = spec_from_config(TINY, lora=LoraSpec(r=8, alpha=16, target_modules=QV), quant=quant)
    old = dataclasses.replace(spec, stack=OLD)
    found = {f.code: f for f in estimate(old).findings}
    info = found["bnb-keeps-inputs"]
    assert info.severity.value == "info" and "modelled" in info.message and "PR #1270" in info.message
    assert "except the 4-bit inputs it keeps" in found["versions-not-modelled"].message
    assert "bnb-keeps-inputs" not in {f.code for f in estimate(spec).findings}
    fixed = dataclasses.replace(spec, stack=StackSpec((("bitsandbytes", "0.43.2"),), "--stack"))
    assert "bnb-keeps-inputs" not in {f.code for f in estimate(fixed).findings}
    dora = dataclasses.replace(old, lora=LoraSpec(r=8, alpha=16, target_modules=QV, use_dora=True))
    warning = {f.code: f for f in estimate(dora).findings}["bnb-keeps-inputs"]
    assert warning.severity.value == "warning" and "not modelled" in warning.message
