"""Qwen3-MoE under LoRA (peft ParamWrapper on the fused experts) and DeepSeek-V3 (MLA, dense + MoE layers with
shared experts): the activation formulas equal fake-tensor traces of the real transformers 5.23 / peft 0.21
step (issue 12). Tiny widths here (fast); real widths: benchmarks/moe_mla_vs_trace.py, and one sampled
real-width cell below."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import assert_activations_match_trace, spec_from_config

from fitcheck.core.activations import activation_findings
from fitcheck.core.activations.param_wrapper import param_wrapper_saved
from fitcheck.spec import LoraSpec

ALL_LINEAR = LoraSpec(r=8, target_modules=("all-linear",))
QWEN3_MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256,
             "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2,
             "vocab_size": 1000, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 96}
# v_head_dim (24) != qk_nope + qk_rope (40): SDPA's flash kernels refuse it, as at DeepSeek-V3's real widths
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256,
               "intermediate_size": 512, "moe_intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000, "n_routed_experts": 8,
               "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
               "first_k_dense_replace": 1, "q_lora_rank": 96, "kv_lora_rank": 48, "qk_rope_head_dim": 16,
               "qk_nope_head_dim": 24, "v_head_dim": 24, "dtype": "bfloat16"}
GRID: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("qwen3_moe-lora", QWEN3_MOE, {"lora": ALL_LINEAR}),
    ("qwen3_moe-lora-long", QWEN3_MOE, {"lora": ALL_LINEAR, "seq": 256, "batch": 2}),
    ("deepseek-full", DEEPSEEK_V3, {}),
    ("deepseek-full-long", DEEPSEEK_V3, {"seq": 256, "batch": 2}),
    ("deepseek-lora", DEEPSEEK_V3, {"lora": ALL_LINEAR}),
    ("deepseek-lora-long", DEEPSEEK_V3, {"lora": ALL_LINEAR, "seq": 256}),
    ("deepseek-full-2dense", {**DEEPSEEK_V3, "num_hidden_layers": 3, "first_k_dense_replace": 2}, {}),
    ("deepseek-no-q-lora", {**DEEPSEEK_V3, "q_lora_rank": None}, {}),
]


@pytest.mark.parametrize(("label", "config", "kw"), GRID, ids=[g[0] for g in GRID])
def test_formula_matches_trace(label: str, config: dict[str, Any], kw: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    assert_activations_match_trace(config, label, **kw)


def test_merged_expert_stacks_scale_with_experts() -> None:
    """The ParamWrapper term is E·(3·I·h + r'·(d1 + d2)) elements per MoE layer: linear in the experts."""
    one = param_wrapper_saved(spec_from_config({**QWEN3_MOE, "num_experts": 8}, lora=ALL_LINEAR))
    two = param_wrapper_saved(spec_from_config({**QWEN3_MOE, "num_experts": 16}, lora=ALL_LINEAR))
    h, inter, layers = 256, 96, 2
    # gate_up rank 2r (peft rank_pattern), down rank r; router W + delta (E·h) in bf16
    per_expert = 2 * (3 * inter * h + 16 * (2 * inter + h) + 8 * (h + inter) + h) * layers
    assert two - one == 8 * per_expert
    assert param_wrapper_saved(spec_from_config(QWEN3_MOE, lora=ALL_LINEAR, checkpointing=True)) == 0


@pytest.mark.parametrize(
    ("config", "kw", "flagged"),
    [
        (QWEN3_MOE, {"lora": ALL_LINEAR}, False),
        (QWEN3_MOE, {"lora": ALL_LINEAR, "checkpointing": True}, True),
        (DEEPSEEK_V3, {}, False),
        (DEEPSEEK_V3, {"lora": ALL_LINEAR}, False),
        (DEEPSEEK_V3, {"checkpointing": True}, True),
    ],
)
def test_not_pinned_only_outside_what_was_traced(config: dict[str, Any], kw: dict[str, Any], flagged: bool) -> None:
    findings = activation_findings(spec_from_config(config, **kw))
    assert any(f.code == "activations-not-pinned" for f in findings) is flagged


def test_real_width_qwen3_moe_lora_sampled() -> None:
    """One real-width cell (Qwen3-30B-A3B, one layer, 256 tokens): formula = trace at every phase of the step."""
    pytest.importorskip("transformers")
    from fitcheck.catalog.models import find_catalog_config
    from fitcheck.core import estimate
    from fitcheck.report import Location, Phase
    from fitcheck.torch_adapters.trace_result import components_from_trace
    from fitcheck.torch_adapters.tracer import trace_step

    found = find_catalog_config("Qwen/Qwen3-30B-A3B")
    assert found is not None
    cfg = {**found[0], "num_hidden_layers": 1}
    spec = spec_from_config(cfg, seq=256, lora=LoraSpec(r=16, target_modules=("all-linear",)))
    traced = components_from_trace(trace_step(cfg, seq_len=256, micro_batch=1, dtype="bfloat16", lora=spec.lora))
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD):
        f = sum(c.at(phase) for c in estimate(spec).components if c.location is Location.DEVICE)
        t = sum(c.at(phase) for c in estimate(spec, activations=traced).components if c.location is Location.DEVICE)
        assert abs(f - t) <= 0.02 * t, (phase, f, t)


STEP_GRID: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("qwen3_moe-lora", QWEN3_MOE, {"lora": ALL_LINEAR, "seq": 128}),
    ("deepseek-full-long", {**DEEPSEEK_V3, "num_hidden_layers": 3, "first_k_dense_replace": 2}, {"seq": 512}),
    ("deepseek-lora", DEEPSEEK_V3, {"lora": ALL_LINEAR, "seq": 128}),
]


@pytest.mark.parametrize(("label", "config", "kw"), STEP_GRID, ids=[g[0] for g in STEP_GRID])
def test_whole_step_matches_trace(label: str, config: dict[str, Any], kw: dict[str, Any]) -> None:
    """Every phase of the step, the backward moments included (ParamWrapper's top MoE layer, DeepSeek's CPU math
    attention backward): formula = trace within 2 % of the step."""
    pytest.importorskip("transformers")
    from tiny_models import trace_spec

    from fitcheck.core import estimate
    from fitcheck.report import Location, Phase
    from fitcheck.torch_adapters.trace_result import components_from_trace

    spec = spec_from_config(config, **kw)
    traced = components_from_trace(trace_spec(config, spec))
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD):
        f = sum(c.at(phase) for c in estimate(spec).components if c.location is Location.DEVICE)
        t = sum(c.at(phase) for c in estimate(spec, activations=traced).components if c.location is Location.DEVICE)
        assert abs(f - t) <= 0.02 * t, (label, phase, f, t)
