"""The pure per-family activation formulas equal fake-tensor traces of the real models (<= 1 %).

For FORWARD_END and BACKWARD_START the formula's components must equal what the trace holds besides parameters
and optimizer states (no gradient exists then in the steady-state step).
"""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import assert_activations_match_trace, llama_like_configs, spec_from_config

from fitcheck.core.activations.decoder import activation_components
from fitcheck.report import Phase
from fitcheck.spec import LoraSpec

FAMILIES = llama_like_configs(
    {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2,
     "num_hidden_layers": 2, "vocab_size": 1000},
    moe_intermediate=512,
)
GRID = [
    ("llama", {}), ("llama", {"dtype": "float32"}), ("llama", {"dtype": "float32", "mixed": "bf16"}),
    ("llama", {"attn": "eager", "seq": 96, "batch": 2}), ("llama", {"checkpointing": True}),
    ("llama", {"checkpointing": True, "dtype": "float32"}),
    ("llama", {"lora": LoraSpec(r=8, target_modules=("q_proj", "v_proj"))}),
    ("llama", {"lora": LoraSpec(r=8, target_modules=("all-linear",)), "checkpointing": True}),
    ("qwen2", {"attn": "eager"}), ("mistral", {"dtype": "float32", "mixed": "bf16"}),
    ("gemma", {}), ("gemma", {"dtype": "float32", "attn": "eager"}),
    ("mixtral", {}), ("mixtral", {"attn": "eager", "seq": 128}),
    ("phi3", {"dtype": "float32"}), ("phi3", {"attn": "eager"}),
]


@pytest.mark.parametrize(("family", "kw"), GRID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(GRID)])
def test_formula_matches_trace(family: str, kw: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    assert_activations_match_trace(FAMILIES[family], family, **kw)


def test_logits_are_their_own_component_llama3_8b_shape() -> None:
    cfg = dict(FAMILIES["llama"], hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256)
    comps = {c.name: c for c in activation_components(spec_from_config(cfg, seq=8192))}
    # 12 B per logit at the start of backward: log-softmax output, its gradient, the fp32 logits gradient
    assert comps["logits.loss"].at(Phase.BACKWARD_START) == 12 * 8192 * 128256 + 8
    assert comps["logits.loss"].at(Phase.OPTIMIZER_STEP) == 0
    # 8B bf16 SDPA: 20h + 4kv + 8I (+ 4a + 8) bytes per token per layer (design note 04: 392.27 MiB at s=2048)
    per_layer = (20 * 4096 + 4 * 1024 + 8 * 14336 + 4 * 32 + 8) * 2048
    assert abs(per_layer / 2**20 - 392.27) < 0.3
