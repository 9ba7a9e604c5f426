"""The 2025 families: Qwen3 (q/k norms), Qwen3-MoE, Gemma-3, OLMo-2 (full-width q/k norms, post-norms) and
gpt-oss (sinks, clamped-SwiGLU grouped_mm experts) activations equal fake-tensor traces; the families the
formula does not match say so (issue 12). Real widths: benchmarks/families_vs_trace.py."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import assert_activations_match_trace, spec_from_config

from fitcheck.core.activations import activation_findings
from fitcheck.spec import LoraSpec

WIDTHS = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "vocab_size": 1000, "head_dim": 32}
QWEN3 = {**WIDTHS, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
QWEN3_MOE = {**WIDTHS, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 512}
# sliding_window >= seq: a window shorter than the sequence leaves a CPU-trace residual (recent.py docstring)
GEMMA3 = {**WIDTHS, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "sliding_window": 4096}
# OLMo-2: GQA here (the 7B is MHA: the real-width grid covers it); gpt-oss: a window shorter than the sequence
# changes the mask only (eager computes every score), 4 experts, top-2, the real SwiGLU limit; a vocabulary large
# enough that the loss, not a checkpointed layer's forward transient, sets the forward peak (as at real widths:
# 201,088 tokens)
OLMO2 = {**WIDTHS, "model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"]}
GPT_OSS = {**WIDTHS, "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_local_experts": 4,
           "num_experts_per_tok": 2, "intermediate_size": 256, "sliding_window": 32, "swiglu_limit": 7.0,
           "vocab_size": 8192}
ALL_LINEAR = LoraSpec(r=8, target_modules=("all-linear",))
GRID: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (QWEN3, {}), (QWEN3, {"dtype": "float32"}), (QWEN3, {"dtype": "float32", "mixed": "bf16"}),
    (QWEN3, {"attn": "eager", "seq": 96}), (QWEN3, {"checkpointing": True}), (QWEN3, {"lora": ALL_LINEAR}),
    (QWEN3, {"lora": LoraSpec(r=8, dropout=0.1, target_modules=("all-linear",))}),
    (QWEN3, {"dtype": "float32", "lora": LoraSpec(r=8, target_modules=("q_proj", "v_proj"))}),
    (QWEN3_MOE, {}), (QWEN3_MOE, {"attn": "eager"}), (QWEN3_MOE, {"checkpointing": True}),
    (GEMMA3, {}), (GEMMA3, {"lora": ALL_LINEAR}), (GEMMA3, {"dtype": "float32"}),
    (GEMMA3, {"dtype": "float32", "mixed": "bf16"}), (GEMMA3, {"attn": "eager"}), (GEMMA3, {"checkpointing": True}),
    (OLMO2, {}), (OLMO2, {"lora": ALL_LINEAR}), (OLMO2, {"dtype": "float32"}), (OLMO2, {"attn": "eager", "seq": 96}),
    (OLMO2, {"checkpointing": True}),
    (OLMO2, {"dtype": "float32", "mixed": "bf16", "checkpointing": True, "lora": ALL_LINEAR}),
    (OLMO2, {"lora": LoraSpec(r=8, dropout=0.1, target_modules=("all-linear",))}),
    (GPT_OSS, {}), (GPT_OSS, {"lora": ALL_LINEAR}), (GPT_OSS, {"seq": 128, "batch": 2}),
    (GPT_OSS, {"checkpointing": True}), (GPT_OSS, {"checkpointing": True, "lora": ALL_LINEAR}),
]


@pytest.mark.parametrize(("config", "kw"), GRID, ids=[f"{c['model_type']}-{i}" for i, (c, _) in enumerate(GRID)])
def test_formula_matches_trace(config: dict[str, Any], kw: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    assert_activations_match_trace(config, config["model_type"], **kw)


@pytest.mark.parametrize(
    ("config", "lora", "flagged"),
    [
        (QWEN3, ALL_LINEAR, False),
        (QWEN3_MOE, None, False),
        (QWEN3_MOE, ALL_LINEAR, False),  # pinned: activations/param_wrapper.py (i12moe)
        (GEMMA3, None, False),
        (OLMO2, None, False),
        (OLMO2, ALL_LINEAR, False),
        (GPT_OSS, None, False),
        (GPT_OSS, ALL_LINEAR, False),
        (GPT_OSS, LoraSpec(r=8, target_parameters=("mlp.experts.gate_up_proj",)), True),
    ],
)
def test_unpinned_recent_families_warn(config: dict[str, Any], lora: LoraSpec | None, flagged: bool) -> None:
    findings = activation_findings(spec_from_config(config, lora=lora))
    assert any(f.code == "activations-not-pinned" for f in findings) is flagged
