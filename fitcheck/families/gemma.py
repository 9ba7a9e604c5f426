"""Gemma, Gemma-2, Gemma-3 (``model_type`` gemma, gemma2, gemma3_text, gemma3): inventories and traits.

Every Gemma RMSNorm computes in fp32 and scales by ``(1 + weight.float())`` (modeling_gemma.py
``GemmaRMSNorm``); Gemma-2 and Gemma-3 add post-attention / post-feedforward norms, Gemma-2 soft-caps the
attention scores (no SDPA path) and the final logits (``final_logit_softcapping``, default 30.0,
configuration_gemma2.py), Gemma-3 adds per-head q/k norms. Any other ``model_type`` starting with ``gemma``
(a later Gemma) gets the Gemma norm and nothing else (:data:`DESCENDANT`).
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
    llama_like,
)
from fitcheck.families.tp_plans import ATTN_MLP, QK_NORM
from fitcheck.spec import AttentionKind, FamilyTraits, NormKind, NormPlacement, QkNorm, RecipeGaps


def gemma(cfg: ConfigView) -> Inventory:
    """GemmaForCausalLM: head_dim defaults to 256, tied embeddings by default, GELU-tanh gated MLP."""
    attention_bias = cfg.get_bool("attention_bias", default=False)
    return llama_like(
        cfg,
        prefix="Gemma",
        vocab_default=256000,
        hidden_default=3072,
        inter_default=24576,
        layers_default=28,
        heads_default=16,
        kv_default=16,
        head_dim_default=256,
        max_pos_default=8192,
        tie_default=True,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=False,
        norms=PRE_POST,
        act_keys=("hidden_activation", "hidden_act"),
        act_default="gelu_pytorch_tanh",
    )


def gemma2(cfg: ConfigView) -> Inventory:
    """Gemma2ForCausalLM: four RMSNorms per layer; alternating sliding (default 4096) and global layers."""
    attention_bias = cfg.get_bool("attention_bias", default=False)
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 4096
    return llama_like(
        cfg,
        prefix="Gemma2",
        vocab_default=256000,
        hidden_default=2304,
        inter_default=9216,
        layers_default=26,
        heads_default=8,
        kv_default=4,
        head_dim_default=256,
        max_pos_default=8192,
        tie_default=True,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=False,
        norms=(
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        act_keys=("hidden_activation", "hidden_act"),
        act_default="gelu_pytorch_tanh",
        sliding_window=window,
    )


def gemma3_text(cfg: ConfigView) -> Inventory:
    """Gemma3ForCausalLM (``gemma3_text``): Gemma-2's four norms per layer plus q/k norms over head_dim; local
    (``sliding_window``, default 4096) and global layers interleaved by ``layer_types`` (5 local : 1 global)."""
    vocab = cfg.get_int("vocab_size", default=262_208)
    hidden = cfg.get_int("hidden_size", default=2304)
    inter = cfg.get_int("intermediate_size", default=9216)
    layers = cfg.get_int("num_hidden_layers", default=26)
    heads = cfg.get_int("num_attention_heads", default=8)
    kv = kv_heads(cfg, heads, 4)
    head_dim = cfg.opt_int("head_dim") or 256
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    attention_linears(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    layer_norms(b, head_dim, layers, ("self_attn.q_norm", "self_attn.k_norm"))
    gated_mlp(b, hidden, inter, layers, bias=False)
    layer_norms(b, hidden, layers, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                     "post_feedforward_layernorm"))
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 4096
    shape = decoder_shape(cfg, architecture="Gemma3ForCausalLM", no_split="Gemma3DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=131_072,
                   activation=cfg.get_str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh"),
                   sliding_window=window)
    return b.params, shape


def gemma_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Gemma's traits: Llama's layer with Gemma's norm, traced in every mode."""
    return replace(base, norm_kind=NormKind.RMS_ONE_PLUS, activations_pinned=True, backward_pinned=True,
                   kbit_pinned=True, liger_patched=True, tp_plan=ATTN_MLP)


def gemma2_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Gemma-2's traits: four norms per layer, soft-capped scores (eager only) and logits."""
    return replace(base, norm_kind=NormKind.RMS_ONE_PLUS, norm_placement=NormPlacement.PRE_AND_POST,
                   attention=AttentionKind.SOFTCAPPED, eager_only=True, activations_pinned=True,
                   liger_patched=True, tp_plan=ATTN_MLP,
                   logit_softcapping=bool(cfg.get("final_logit_softcapping", 30.0)))


def gemma3_text_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Gemma-3 text's traits: Gemma-2's norms plus per-head q/k norms (within 0.73 % of traces)."""
    return replace(base, norm_kind=NormKind.RMS_ONE_PLUS, norm_placement=NormPlacement.PRE_AND_POST,
                   qk_norm=QkNorm.PER_HEAD, activations_pinned=True, tp_plan=ATTN_MLP + QK_NORM)


def gemma3_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Gemma-3 image-text (composite config): the Llama-style recipe with Gemma's norm, not pinned.

    Only the norm kind is declared: the recipe counts the composite as a two-norm layer without q/k norms, as it
    did before the traits existed (the warning says the widths and the tower are not modelled).
    """
    why = "Gemma-3 image-text models (the vision tower, and the text widths of a composite config)"
    return replace(base, norm_kind=NormKind.RMS_ONE_PLUS, gaps=RecipeGaps(always=why))


def descendant_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """A later Gemma (``model_type`` starting with ``gemma``): Gemma's norm, nothing else declared."""
    return replace(base, norm_kind=NormKind.RMS_ONE_PLUS)


GEMMA_1_2 = (Family("gemma", gemma_traits, gemma), Family("gemma2", gemma2_traits, gemma2))
GEMMA_3 = (Family("gemma3_text", gemma3_text_traits, gemma3_text), Family("gemma3", gemma3_traits))
# The fallback for an undeclared model_type starting with "gemma"
DESCENDANT_PREFIX = "gemma"
DESCENDANT = Family(DESCENDANT_PREFIX, descendant_traits)
