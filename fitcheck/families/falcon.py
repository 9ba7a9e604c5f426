"""Falcon (``model_type`` falcon): inventory and traits.

The 7B layout: one LayerNorm, parallel multi-query attention and a GELU MLP. ALiBi and the new decoder
architecture (40B/180B) are config options the recipe was not traced for.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.layernorm_blocks import dropout_prob, layernorm_shape
from fitcheck.spec import (
    AttentionKind,
    Dropout,
    FamilyTraits,
    LayerRecipe,
    NormKind,
    RecipeGaps,
    Role,
)


def falcon(cfg: ConfigView) -> Inventory:
    """FalconForCausalLM: fused query_key_value sized by new_decoder_architecture / multi_query, parallel
    attention with one or two LayerNorms (modeling_falcon.py FalconAttention, FalconDecoderLayer)."""
    vocab = cfg.get_int("vocab_size", default=65024)
    hidden = cfg.get_int("n_embed", "hidden_size", default=4544)  # FalconConfig.__post_init__: n_embed wins
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=71)
    new_arch = cfg.get_bool("new_decoder_architecture", default=False)
    multi_query = cfg.get_bool("multi_query", default=True)
    parallel = cfg.get_bool("parallel_attn", default=True)
    bias = cfg.get_bool("bias", default=False)
    kv_config = cfg.opt_int("num_kv_heads") or heads
    head_dim = hidden // heads
    if new_arch:
        qkv_out, kv = (2 * kv_config + heads) * head_dim, kv_config
    elif multi_query:
        qkv_out, kv = hidden + 2 * head_dim, 1
    else:
        qkv_out, kv = 3 * hidden, heads
    ffn = cfg.opt_int("ffn_hidden_size") or 4 * hidden
    n_ln = cfg.opt_int("num_ln_in_parallel_attn") or (2 if new_arch else None)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    lay = "transformer.h.*"
    b = InventoryBuilder()
    b.embedding("transformer.word_embeddings", vocab, hidden)
    b.linear(
        f"{lay}.self_attention.query_key_value", hidden, qkv_out, Role.ATTENTION, bias=bias, repeat=layers
    )
    b.linear(f"{lay}.self_attention.dense", hidden, hidden, Role.ATTENTION, bias=bias, repeat=layers)
    b.linear(f"{lay}.mlp.dense_h_to_4h", hidden, ffn, Role.MLP, bias=bias, repeat=layers)
    b.linear(f"{lay}.mlp.dense_4h_to_h", ffn, hidden, Role.MLP, bias=bias, repeat=layers)
    if not parallel:
        norms: tuple[str, ...] = ("post_attention_layernorm", "input_layernorm")
    elif n_ln == 2:
        norms = ("ln_attn", "ln_mlp")
    else:
        norms = ("input_layernorm",)
    for name in norms:
        b.norm(f"{lay}.{name}", hidden, bias=True, repeat=layers)
    b.norm("transformer.ln_f", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied)
    shape = layernorm_shape(
        cfg,
        architecture="FalconForCausalLM",
        no_split="FalconDecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        inter=ffn,
        vocab=vocab,
        tied=tied,
        max_pos=cfg.get_int("max_position_embeddings", default=2048),
        activation=cfg.get_str("activation", default="gelu"),
        parallel_attn=parallel,
    )
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Falcon's traits (FalconConfig dropout defaults 0.0)."""
    dropout = Dropout(attention=dropout_prob(cfg, "attention_dropout", 0.0),
                      hidden=dropout_prob(cfg, "hidden_dropout", 0.0),
                      functional=("hidden",))  # modeling_falcon.py dropout_add: F.dropout(p=config.hidden_dropout)
    gap = None
    if cfg.get("alibi") or cfg.get("new_decoder_architecture"):
        gap = "Falcon with ALiBi or the new decoder architecture (40B/180B) is not pinned; the 7B recipe is used"
    return replace(base, recipe=LayerRecipe.FALCON_PARALLEL, norm_kind=NormKind.LAYERNORM, dropout=dropout,
                   attention=AttentionKind.ALIBI if cfg.get("alibi") else AttentionKind.STANDARD,
                   activations_pinned=True, gaps=RecipeGaps(config=gap))


FAMILY = Family("falcon", traits, falcon)
