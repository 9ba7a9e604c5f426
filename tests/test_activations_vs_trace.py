"""The pure per-family activation formulas equal fake-tensor traces of the real models (<= 1 %).

For FORWARD_END and BACKWARD_START the formula's components must equal what the trace holds besides parameters
and optimizer states (no gradient exists then in the steady-state step).
"""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.core.activations import activation_components
from fitcheck.readers.model_config import inventory_from_config
from fitcheck.report import Phase
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    OptimizerSpec,
    PrecisionSpec,
    TrainingSpec,
)

_BASE: dict[str, Any] = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8,
                         "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000}
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(_BASE, model_type="llama", architectures=["LlamaForCausalLM"]),
    "qwen2": dict(_BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
    "mistral": dict(_BASE, model_type="mistral", architectures=["MistralForCausalLM"]),
    "gemma": dict(_BASE, model_type="gemma", architectures=["GemmaForCausalLM"], head_dim=32),
    "mixtral": dict(_BASE, model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4,
                    num_experts_per_tok=2, intermediate_size=512),
    "phi3": dict(_BASE, model_type="phi3", architectures=["Phi3ForCausalLM"], num_key_value_heads=8, pad_token_id=0),
}


def _spec(cfg: dict[str, Any], s: int, b: int, dtype: str, mp: str, attn: str, ck: bool,
          lora: LoraSpec | None) -> TrainingSpec:
    return TrainingSpec(
        model=inventory_from_config(cfg, "tiny", "test"),
        precision=PrecisionSpec(Dtype(dtype), MixedPrecision(mp)),
        batch=BatchSpec(b, s),
        activations=ActivationSpec(checkpointing=ck, attn_implementation=AttnImpl(attn)),
        lora=lora,
        hardware=HardwareSpec(device_type=DeviceType.CPU),
        optimizer=OptimizerSpec("adamw_torch"),
    )


def _check(family: str, s: int = 64, b: int = 1, dtype: str = "bfloat16", mp: str = "no", attn: str = "sdpa",
           ck: bool = False, lora: LoraSpec | None = None) -> None:
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters.tracer import OPTSTATE, PARAMS, trace_step

    cfg = FAMILIES[family]
    comps = activation_components(_spec(cfg, s, b, dtype, mp, attn, ck, lora))
    trace = trace_step(cfg, seq_len=s, micro_batch=b, dtype=dtype, mixed_precision=mp,
                       attn_implementation=attn, checkpointing=ck, lora=lora)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
        br = trace.phases[phase]
        traced = br.total - br.get(PARAMS) - br.get(OPTSTATE)
        formula = sum(c.at(phase) for c in comps)
        assert abs(formula - traced) <= 0.01 * traced, (family, phase, formula, traced)


GRID = [
    ("llama", {}), ("llama", {"dtype": "float32"}), ("llama", {"dtype": "float32", "mp": "bf16"}),
    ("llama", {"attn": "eager", "s": 96, "b": 2}), ("llama", {"ck": True}), ("llama", {"ck": True, "dtype": "float32"}),
    ("llama", {"lora": LoraSpec(r=8, target_modules=("q_proj", "v_proj"))}),
    ("llama", {"lora": LoraSpec(r=8, target_modules=("all-linear",)), "ck": True}),
    ("qwen2", {"attn": "eager"}), ("mistral", {"dtype": "float32", "mp": "bf16"}),
    ("gemma", {}), ("gemma", {"dtype": "float32", "attn": "eager"}),
    ("mixtral", {}), ("mixtral", {"attn": "eager", "s": 128}),
    ("phi3", {"dtype": "float32"}), ("phi3", {"attn": "eager"}),
]


@pytest.mark.parametrize(("family", "kw"), GRID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(GRID)])
def test_formula_matches_trace(family: str, kw: dict[str, Any]) -> None:
    _check(family, **kw)


def test_logits_are_their_own_component_llama3_8b_shape() -> None:
    cfg = dict(FAMILIES["llama"], hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256)
    comps = {c.name: c for c in activation_components(_spec(cfg, 8192, 1, "bfloat16", "no", "sdpa", False, None))}
    # 12 B per logit at the start of backward: log-softmax output, its gradient, the fp32 logits gradient
    assert comps["logits.loss"].at(Phase.BACKWARD_START) == 12 * 8192 * 128256 + 8
    assert comps["logits.loss"].at(Phase.OPTIMIZER_STEP) == 0
    # 8B bf16 SDPA: 20h + 4kv + 8I (+ 4a + 8) bytes per token per layer (design note 04: 392.27 MiB at s=2048)
    per_layer = (20 * 4096 + 4 * 1024 + 8 * 14336 + 4 * 32 + 8) * 2048
    assert abs(per_layer / 2**20 - 392.27) < 0.3
