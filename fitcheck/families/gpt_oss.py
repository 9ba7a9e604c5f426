"""gpt-oss (``model_type`` gpt_oss): inventory and traits.

Attention sinks (no SDPA path: ``GptOssPreTrainedModel._supports_sdpa = False``), fp32-product RMSNorms,
half-width rotary tables, grouped_mm experts with a clamped SwiGLU, and a full plus a sliding-window causal
mask (``layer_types``; ``GptOssConfig`` alternates them by default).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.decoder_blocks import (
    LAYER,
    PRE_POST,
    attention_linears,
    decoder_shape,
    fused_experts,
    kv_heads,
    layer_norms,
    router,
)
from fitcheck.spec import AttentionKind, FamilyTraits, Kind, MoeLayout, NormKind, RecipeGaps, Role, RotaryTables


def gpt_oss(cfg: ConfigView) -> Inventory:
    """GptOssForCausalLM: biased q/k/v/o, one attention-sink logit per head (``self_attn.sinks``), a biased
    router, transposed fused experts with biases (modeling_gpt_oss.py). Alternating sliding (128) / full layers.

    The inventory is the logical bf16 model: the checkpoint's MXFP4 expert storage is a QuantSpec matter.
    """
    vocab = cfg.get_int("vocab_size", default=201088)
    hidden = cfg.get_int("hidden_size", default=2880)
    inter = cfg.get_int("intermediate_size", default=2880)
    layers = cfg.get_int("num_hidden_layers", default=36)
    heads = cfg.get_int("num_attention_heads", default=64)
    kv = kv_heads(cfg, heads, 8)
    head_dim = cfg.opt_int("head_dim") or 64
    experts = cfg.get_int("num_local_experts", default=128)
    top_k = cfg.get_int("num_experts_per_tok", "experts_per_token", default=4)
    bias = cfg.get_bool("attention_bias", default=True)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    b.add(f"{LAYER}.self_attn.sinks", (heads,), Role.OTHER, Kind.OTHER, repeat=layers)
    attention_linears(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    router(b, f"{LAYER}.mlp.router", experts, hidden, repeat=layers, bias=True)
    fused_experts(b, f"{LAYER}.mlp.experts", experts, hidden, inter, repeat=layers, transposed=True, bias=True)
    layer_norms(b, hidden, layers, PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 128
    shape = decoder_shape(cfg, architecture="GptOssForCausalLM", no_split="GptOssDecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=131072, activation=cfg.get_str("hidden_act", default="silu"),
                   sliding_window=window, experts=experts, top_k=top_k)
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """gpt-oss's traits, pinned full and LoRA on the attention (not LoRA on the fused experts)."""
    kinds = cfg.get("layer_types")
    why = "gpt-oss with LoRA on its fused experts (peft target_parameters; only frozen experts are pinned)"
    return replace(base, norm_kind=NormKind.RMS_FP32_PRODUCT, attention=AttentionKind.SINKS, eager_only=True,
                   rotary=RotaryTables.HALF_HEAD_DIM, moe=MoeLayout.GROUPED_MM_CLAMPED,
                   eager_mask_kinds=len(set(kinds)) if isinstance(kinds, list) and kinds else 2,
                   activations_pinned=True, gaps=RecipeGaps(lora_on_experts=why))


FAMILY = Family("gpt_oss", traits, gpt_oss)
