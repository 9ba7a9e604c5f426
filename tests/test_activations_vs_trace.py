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


@pytest.mark.parametrize("seq", [512, 2048])
def test_logits_and_saved_activations_equal_a_trace_at_llama3_8b_width(seq: int) -> None:
    """At Llama-3-8B's real widths the logits component and the saved activations of the formulas equal a
    fake-tensor trace of the real model at the start of backward (one and two layers traced, extrapolated to 32),
    at two sequence lengths (was: a literal compared with arithmetic on literals)."""
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters.trace_result import ACTIVATIONS, INPUTS, LOGITS
    from fitcheck.torch_adapters.tracer import trace_step

    cfg = dict(FAMILIES["llama"], hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256)
    comps = {c.name: c for c in activation_components(spec_from_config(cfg, seq=seq))}
    one, two = (trace_step(cfg, seq_len=seq, micro_batch=1, num_layers=n, optimizer=None, steps=1) for n in (1, 2))
    start = Phase.BACKWARD_START
    assert comps["logits.loss"].at(start) == one.phases[start].get(LOGITS) == two.phases[start].get(LOGITS)
    per_layer = two.phases[start].get(ACTIVATIONS) - one.phases[start].get(ACTIVATIONS)
    traced = one.phases[start].get(ACTIVATIONS) + 31 * per_layer + one.phases[start].get(INPUTS)
    assert comps["activations.saved"].at(start) + comps["inputs.ids"].at(start) == traced
    assert comps["logits.loss"].at(Phase.OPTIMIZER_STEP) == 0
