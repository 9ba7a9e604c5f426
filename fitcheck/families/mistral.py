"""Mistral (``model_type`` mistral): inventory and traits (the Llama layer with a sliding window).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory
from fitcheck.families.decoder_blocks import PRE_POST, llama_like
from fitcheck.families.tp_plans import ATTN_MLP
from fitcheck.spec import FamilyTraits


def mistral(cfg: ConfigView) -> Inventory:
    """MistralForCausalLM: no biases; sliding_window defaults to 4096 when the key is absent."""
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 4096
    return llama_like(
        cfg,
        prefix="Mistral",
        vocab_default=32000,
        hidden_default=4096,
        inter_default=14336,
        layers_default=32,
        heads_default=32,
        kv_default=8,
        head_dim_default=None,
        max_pos_default=131072,
        tie_default=False,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        norms=PRE_POST,
        sliding_window=window,
    )


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Mistral's traits: Llama's recipe, traced in every mode."""
    return replace(base, activations_pinned=True, backward_pinned=True, kbit_pinned=True, liger_patched=True,
                   banded_sliding_mask=True, tp_plan=ATTN_MLP)


FAMILY = Family("mistral", traits, mistral)
