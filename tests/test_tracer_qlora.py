"""QLoRA (bitsandbytes 4-bit base + LoRA): the emulated fake base equals real bitsandbytes on CPU, the tracer's
4-bit build equals transformers' own loading path, and the pure formula reproduces the traces."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from tiny_models import family_config, spec_from_config, trace_spec

from fitcheck.core.activations.decoder import activation_findings
from fitcheck.core.estimator import estimate
from fitcheck.core.states.quantization import base_weights
from fitcheck.report import Phase
from fitcheck.spec import Dtype, LoraSpec, QuantSpec, TrainingSpec

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 8000,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}
TINY_QWEN2 = family_config("qwen2", TINY, tie_word_embeddings=True)
NF4_DQ = QuantSpec(quant_type="nf4", double_quant=True, compute_dtype=Dtype.BFLOAT16)
ALL = LoraSpec(r=8, alpha=16, target_modules=("all-linear",))
SEQ, BATCH = 64, 2


def _spec(config: dict[str, Any], *, quant: QuantSpec, lora: LoraSpec, **settings: Any) -> TrainingSpec:
    return spec_from_config(config, seq=SEQ, batch=BATCH, quant=quant, lora=lora, **settings)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        {"lora": ALL, "quant": NF4_DQ, "checkpointing": True, "mixed": "bf16"},
        {"lora": dataclasses.replace(ALL, dropout=0.1), "quant": QuantSpec(quant_type="fp4")},
    ],
    ids=["nf4-dq-ckpt-autocast", "fp4-dropout-fp32-compute"],
)
def test_fake_4bit_base_equals_real_bitsandbytes(kw: dict[str, Any]) -> None:
    """Every phase, every category, to the byte: the emulated Params4bit is what real bnb allocates."""
    spec = _spec(TINY, **kw)
    real = trace_spec(TINY, spec, fake=False)
    fake = trace_spec(TINY, spec, fake=True)
    for phase in real.phases:
        assert fake.phases[phase].by_category == real.phases[phase].by_category, phase
    assert fake.final_grads == real.final_grads


@pytest.mark.slow
def test_tracer_build_equals_from_pretrained(tmp_path: Path) -> None:
    """Quantizing random weights in place builds what from_pretrained(quantization_config=...) loads."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    from fitcheck.torch_adapters.tracer_build import build_model, hf_config, model_class
    from fitcheck.torch_adapters.tracer_quant import bnb_config, quant_state_tensors

    def summary(model: Any) -> dict[Any, int]:
        out: dict[Any, int] = {}
        for name, p in model.named_parameters():
            key = (name, str(p.dtype), type(p).__name__, tuple(p.shape))
            out[key] = p.untyped_storage().nbytes()
        meta = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in quant_state_tensors(model)}
        out["quant_state"] = sum(meta.values())
        return out

    cfg = hf_config(TINY_QWEN2, "sdpa")
    model_class(TINY_QWEN2)._from_config(cfg, dtype=torch.bfloat16).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=bnb_config(NF4_DQ),
                                                  dtype=torch.bfloat16, device_map="cpu")
    loaded = prepare_model_for_kbit_training(loaded, use_gradient_checkpointing=False)  # type: ignore[no-untyped-call]
    built = build_model(TINY_QWEN2, dtype=torch.bfloat16, attn_implementation="sdpa", checkpointing=False,
                        quant=NF4_DQ, fake=False)
    assert summary(built) == summary(loaded)
    assert summary(built)["quant_state"] > 0


CASES = [
    ("llama", {"checkpointing": True, "mixed": "bf16", "lora": dataclasses.replace(ALL, dropout=0.05)}),
    ("llama", {"checkpointing": False}),
    ("llama", {"checkpointing": True}),
    ("llama", {"checkpointing": True, "mixed": "bf16"}),
    ("llama", {"checkpointing": False, "mixed": "bf16"}),
    ("llama", {"checkpointing": True, "lora": LoraSpec(r=4, dropout=0.1, target_modules=("q_proj", "v_proj"))}),
    ("qwen2", {"attn": "eager", "mixed": "bf16"}),
]


@pytest.mark.parametrize(("family", "kw"), CASES)
def test_formula_matches_qlora_trace(family: str, kw: dict[str, Any]) -> None:
    """The pure estimate's peak (and the phase that sets it) against a fake trace of the same QLoRA step."""
    config = TINY if family == "llama" else TINY_QWEN2
    kw = dict(kw)
    lora = kw.pop("lora", ALL)
    spec = _spec(config, quant=NF4_DQ, lora=lora, **kw)
    traced = trace_spec(config, spec)
    report = estimate(spec)
    assert report.peak_phase is traced.peak_phase is Phase.BACKWARD_START
    # eager: the formula keeps the 4-D mask alive into backward, the real step frees it (b·s²·4 bytes)
    slack = BATCH * SEQ * SEQ * 4 if kw.get("attn") == "eager" else 0
    diff = report.peak_allocated_bytes - traced.peak
    assert -0.001 * traced.peak <= diff <= slack + 0.001 * traced.peak


def test_qlora_upcast_changes_the_estimate_and_drops_the_finding() -> None:
    """prepare_model_for_kbit_training makes activations fp32; without it the bf16 LoRA recipe applies."""
    prepared = _spec(TINY, quant=NF4_DQ, lora=ALL)
    raw = dataclasses.replace(prepared, quant=dataclasses.replace(NF4_DQ, prepare_for_kbit_training=False))
    assert estimate(prepared).peak_allocated_bytes > estimate(raw).peak_allocated_bytes
    assert not [f for f in activation_findings(prepared) if f.code == "activations-not-pinned"]
    assert [f for f in activation_findings(raw) if f.code == "activations-not-pinned"]


def test_quantized_linear_bias_resident_in_compute_dtype() -> None:
    """Linear4bit.forward casts its bias to the compute dtype (bitsandbytes nn/modules.py), undoing the upcast."""
    import torch

    from fitcheck.torch_adapters.tracer_build import build_model

    model = build_model(TINY_QWEN2, dtype=torch.bfloat16, attn_implementation="sdpa", checkpointing=False,
                        quant=NF4_DQ, fake=False)
    bias = model.model.layers[0].self_attn.q_proj.bias
    assert bias.dtype == torch.float32  # prepare_model_for_kbit_training upcast it
    ids = torch.randint(0, 8000, (1, 8))
    model(input_ids=ids)
    assert bias.dtype == torch.bfloat16  # ... and the first forward cast it to bnb_4bit_compute_dtype
    spec = _spec(TINY_QWEN2, quant=NF4_DQ, lora=ALL)
    dtypes = base_weights(spec).dtype_of
    assert dtypes["model.layers.*.self_attn.q_proj.bias"] is Dtype.BFLOAT16
    assert dtypes["model.norm.weight"] is Dtype.FLOAT32
