"""Qwen3 (``model_type`` qwen3): inventory and traits (Llama's layer plus per-head q/k RMSNorms).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.decoder_blocks import (
    PRE_POST,
    attention_linears,
    decoder_shape,
    gated_mlp,
    kv_heads,
    layer_norms,
)
from fitcheck.families.tp_plans import ATTN_MLP, QK_NORM
from fitcheck.spec import FamilyTraits, QkNorm


def qwen3(cfg: ConfigView) -> Inventory:
    """Qwen3ForCausalLM: Llama layout, ``head_dim`` default 128, q/k RMSNorms over head_dim (modeling_qwen3.py)."""
    vocab = cfg.get_int("vocab_size", default=151936)
    hidden = cfg.get_int("hidden_size", default=4096)
    inter = cfg.get_int("intermediate_size", default=22016)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = kv_heads(cfg, heads, 32)
    head_dim = cfg.opt_int("head_dim") or 128
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    attention_linears(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    layer_norms(b, head_dim, layers, ("self_attn.q_norm", "self_attn.k_norm"))
    gated_mlp(b, hidden, inter, layers, bias=False)
    layer_norms(b, hidden, layers, PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    # configuration_qwen3.py __post_init__: sliding_window only with use_sliding_window
    window = cfg.opt_int("sliding_window") if cfg.get_bool("use_sliding_window", default=False) else None
    shape = decoder_shape(cfg, architecture="Qwen3ForCausalLM", no_split="Qwen3DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=32768, activation=cfg.get_str("hidden_act", default="silu"),
                   sliding_window=window)
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Qwen3's traits: per-head q/k norms, traced in every mode; its QLoRA layer is the Llama one plus the q/k
    norms (``kbit_pinned``: ``core/activations/qlora.py``)."""
    return replace(base, qk_norm=QkNorm.PER_HEAD, activations_pinned=True, backward_pinned=True,
                   kbit_pinned=True, liger_patched=True, tp_plan=ATTN_MLP + QK_NORM)


FAMILY = Family("qwen3", traits, qwen3)
