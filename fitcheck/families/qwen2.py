"""Qwen2 (``model_type`` qwen2): inventory and traits (the Llama layer with q/k/v biases).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory
from fitcheck.families.decoder_blocks import PRE_POST, llama_like
from fitcheck.families.tp_plans import ATTN_MLP
from fitcheck.spec import FamilyTraits


def qwen2(cfg: ConfigView) -> Inventory:
    """Qwen2ForCausalLM: q/k/v biases, no o_proj bias; sliding window only with use_sliding_window."""
    window = cfg.opt_int("sliding_window") if cfg.get_bool("use_sliding_window", default=False) else None
    return llama_like(
        cfg,
        prefix="Qwen2",
        vocab_default=151936,
        hidden_default=4096,
        inter_default=22016,
        layers_default=32,
        heads_default=32,
        kv_default=32,
        head_dim_default=None,
        max_pos_default=32768,
        tie_default=False,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        norms=PRE_POST,
        sliding_window=window,
    )


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Qwen2's traits: Llama's recipe, traced in every mode."""
    return replace(base, activations_pinned=True, backward_pinned=True, kbit_pinned=True, liger_patched=True,
                   banded_sliding_mask=True, tp_plan=ATTN_MLP)


FAMILY = Family("qwen2", traits, qwen2)
