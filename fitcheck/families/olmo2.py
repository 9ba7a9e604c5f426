"""OLMo-2 (``model_type`` olmo2): inventory and traits.

Norms only after attention and MLP (none before), full-width q/k norms, RMSNorms that multiply the weight with
the fp32 normalised tensor, fp32 rotary tables (modeling_olmo2.py).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.decoder_blocks import (
    LAYER,
    attention_linears,
    decoder_shape,
    gated_mlp,
    kv_heads,
    layer_norms,
)
from fitcheck.spec import FamilyTraits, NormKind, NormPlacement, QkNorm, RotaryTables


def olmo2(cfg: ConfigView) -> Inventory:
    """Olmo2ForCausalLM: q/k RMSNorms over the whole q / kv width; post-attention and post-feedforward norms
    only (modeling_olmo2.py ``Olmo2DecoderLayer``)."""
    vocab = cfg.get_int("vocab_size", default=50304)
    hidden = cfg.get_int("hidden_size", default=4096)
    inter = cfg.get_int("intermediate_size", default=11008)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = kv_heads(cfg, heads, None)
    head_dim = cfg.opt_int("head_dim") or hidden // heads
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    attention_linears(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    b.norm(f"{LAYER}.self_attn.q_norm", heads * head_dim, bias=False, repeat=layers)
    b.norm(f"{LAYER}.self_attn.k_norm", kv * head_dim, bias=False, repeat=layers)
    gated_mlp(b, hidden, inter, layers, bias=False)
    layer_norms(b, hidden, layers, ("post_attention_layernorm", "post_feedforward_layernorm"))
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = decoder_shape(cfg, architecture="Olmo2ForCausalLM", no_split="Olmo2DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=2048, activation=cfg.get_str("hidden_act", default="silu"))
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """OLMo-2's traits, pinned full and LoRA."""
    return replace(base, norm_kind=NormKind.RMS_FP32_PRODUCT, norm_placement=NormPlacement.POST,
                   qk_norm=QkNorm.FULL_WIDTH, rotary=RotaryTables.FP32, activations_pinned=True)


FAMILY = Family("olmo2", traits, olmo2)
