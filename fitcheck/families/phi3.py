"""Phi-3 (``model_type`` phi3): inventory and traits (fused ``qkv_proj`` and ``gate_up_proj`` linears).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.decoder_blocks import LAYER, PRE_POST, decoder_shape, head_dim_of, layer_norms
from fitcheck.spec import FamilyTraits, Role


def phi3(cfg: ConfigView) -> Inventory:
    """Phi3ForCausalLM: fused ``qkv_proj`` and ``gate_up_proj`` (modeling_phi3.py), no biases."""
    vocab = cfg.get_int("vocab_size", default=32064)
    hidden = cfg.get_int("hidden_size", default=3072)
    inter = cfg.get_int("intermediate_size", default=8192)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = cfg.opt_int("num_key_value_heads") or heads
    head_dim = head_dim_of(cfg, hidden, heads)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    att, mlp = f"{LAYER}.self_attn", f"{LAYER}.mlp"
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    b.linear(f"{att}.o_proj", heads * head_dim, hidden, Role.ATTENTION, bias=False, repeat=layers)
    b.linear(
        f"{att}.qkv_proj", hidden, (heads + 2 * kv) * head_dim, Role.ATTENTION, bias=False, repeat=layers
    )
    b.linear(f"{mlp}.gate_up_proj", hidden, 2 * inter, Role.MLP, bias=False, repeat=layers)
    b.linear(f"{mlp}.down_proj", inter, hidden, Role.MLP, bias=False, repeat=layers)
    layer_norms(b, hidden, layers, PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = decoder_shape(
        cfg,
        architecture="Phi3ForCausalLM",
        no_split="Phi3DecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos_default=4096,
        activation=cfg.get_str("hidden_act", default="silu"),
        sliding_window=cfg.opt_int("sliding_window"),
        partial_rotary=cfg.partial_rotary_factor(1.0),
    )
    return b.params, shape


# transformers 5.23 configuration_phi3.py base_model_tp_plan
_TP_PLAN = (
    ("layers.*.self_attn.qkv_proj", "colwise_gather_output"),
    ("layers.*.self_attn.o_proj", "rowwise_split_input"),
    ("layers.*.mlp.gate_up_proj", "colwise_gather_output"),
    ("layers.*.mlp.down_proj", "rowwise_split_input"),
)


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Phi-3's traits: fused projections, traced for the layer recipe and the backward working set."""
    return replace(base, fused_projections=True, activations_pinned=True, backward_pinned=True, liger_patched=True,
                   banded_sliding_mask=True, tp_plan=_TP_PLAN)


FAMILY = Family("phi3", traits, phi3)
