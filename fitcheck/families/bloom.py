"""BLOOM (``model_type`` bloom): inventory and traits.

Pre-LN blocks with a fused qkv, ALiBi position biases (transformers has no SDPA path: eager only).
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
    Role,
)


def bloom(cfg: ConfigView) -> Inventory:
    """BloomForCausalLM: ALiBi (no position table), embedding LayerNorm, biased fused QKV, 4h MLP."""
    vocab = cfg.get_int("vocab_size", default=250880)
    hidden = cfg.get_int("n_embed", "hidden_size", default=64)  # BloomConfig.__post_init__: n_embed wins
    layers = cfg.get_int("n_layer", "num_hidden_layers", default=2)
    heads = cfg.get_int("n_head", "num_attention_heads", default=8)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    lay = "transformer.h.*"
    b = InventoryBuilder()
    b.embedding("transformer.word_embeddings", vocab, hidden)
    b.norm("transformer.word_embeddings_layernorm", hidden, bias=True)
    b.norm(f"{lay}.input_layernorm", hidden, bias=True, repeat=layers)
    b.linear(
        f"{lay}.self_attention.query_key_value", hidden, 3 * hidden, Role.ATTENTION, bias=True, repeat=layers
    )
    b.linear(f"{lay}.self_attention.dense", hidden, hidden, Role.ATTENTION, bias=True, repeat=layers)
    b.norm(f"{lay}.post_attention_layernorm", hidden, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.dense_h_to_4h", hidden, 4 * hidden, Role.MLP, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.dense_4h_to_h", 4 * hidden, hidden, Role.MLP, bias=True, repeat=layers)
    b.norm("transformer.ln_f", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied)
    shape = layernorm_shape(
        cfg,
        architecture="BloomForCausalLM",
        no_split="BloomBlock",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=heads,
        inter=4 * hidden,
        vocab=vocab,
        tied=tied,
        # ALiBi has no position table; seq_length is the training length the config declares.
        max_pos=cfg.get_int("seq_length", default=0),
        activation="gelu",
    )
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """BLOOM's traits (BloomConfig dropout defaults 0.0)."""
    dropout = Dropout(attention=dropout_prob(cfg, "attention_dropout", 0.0),
                      hidden=dropout_prob(cfg, "hidden_dropout", 0.0),
                      functional=("hidden",))  # modeling_bloom.py dropout_add: F.dropout(p=self.hidden_dropout)
    return replace(base, recipe=LayerRecipe.BLOOM_ALIBI, norm_kind=NormKind.LAYERNORM, attention=AttentionKind.ALIBI,
                   eager_only=True, dropout=dropout, activations_pinned=True)


FAMILY = Family("bloom", traits, bloom)
