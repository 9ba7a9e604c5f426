"""bitsandbytes bytes per parameter and which parameters transformers quantizes."""

from __future__ import annotations

import pytest
from test_model_states_inventories import llama_like, mixtral_like

from fitcheck.core.states.quantization import base_weights, bytes_per_param, is_quantized, quantized_bytes
from fitcheck.spec import Dtype, Kind, PrecisionSpec, QuantSpec, Role, TrainingSpec

N = 4096 * 4096


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        (QuantSpec(quant_type="nf4"), 0.562504),
        (QuantSpec(quant_type="fp4"), 0.562504),
        (QuantSpec(double_quant=True), 0.515934),
        (QuantSpec(blocksize=128), 0.531254),
        (QuantSpec(blocksize=128, double_quant=True), 0.508000),
    ],
)
def test_design_note_table(quant: QuantSpec, expected: float) -> None:
    """Design note 04: measured on real bnb tensors (4096 x 4096)."""
    assert round(bytes_per_param(N, quant), 6) == expected


def test_quant_storage_does_not_change_bytes_and_int8() -> None:
    assert quantized_bytes(N, QuantSpec(quant_storage=Dtype.BFLOAT16)) == quantized_bytes(N, QuantSpec())
    assert quantized_bytes(N, QuantSpec(bits=8), out_features=4096).total == N + 4 * 4096


def test_which_params_are_quantized() -> None:
    spec = TrainingSpec(model=llama_like(), quant=QuantSpec(skip_modules=("o_proj",)))
    quantized = {e.name for e in spec.model.params if is_quantized(spec, e)}
    assert "lm_head.weight" not in quantized and "model.embed_tokens.weight" not in quantized
    assert "model.layers.*.self_attn.o_proj.weight" not in quantized  # llm_int8_skip_modules (suffix)
    assert "model.layers.*.self_attn.q_proj.weight" in quantized


def test_moe_experts_router_stay_16bit_and_upcast() -> None:
    inv = mixtral_like()
    spec = TrainingSpec(model=inv, precision=PrecisionSpec(Dtype.BFLOAT16), quant=QuantSpec())
    b = base_weights(spec)
    experts = sum(e.numel for e in inv.params if e.kind is Kind.FUSED_EXPERTS)
    assert b.quantized_params == 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096)
    assert b.unquantized_params == inv.total_params - b.quantized_params
    assert b.upcast_params == b.unquantized_params > experts
    assert all(b.dtype_of[e.name] is Dtype.FLOAT32 for e in inv.params if e.role is Role.ROUTER)
