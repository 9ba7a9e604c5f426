"""Qwen3-MoE and Qwen2-MoE (``model_type`` qwen3_moe, qwen2_moe): inventory and traits.

Qwen3-MoE: Qwen3's attention with fused 3-D experts and a bare router; pinned for full fine-tuning, and
under LoRA without checkpointing or freezing. Qwen2-MoE has no pure inventory (meta device); its traits
give transformers' tp plan.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder, NotPureFamilyError
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
from fitcheck.families.tp_plans import ATTN_ONLY, MLP, MOE_EXPERTS, QK_NORM
from fitcheck.spec import FamilyTraits, MoeLayout, QkNorm, RecipeGaps


def qwen3_moe(cfg: ConfigView) -> Inventory:
    """Qwen3MoeForCausalLM: Qwen3 attention; every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``
    is a sparse block (router + fused experts of ``moe_intermediate_size``); ModelShape.intermediate_size is the
    per-expert width, as for Mixtral."""
    vocab = cfg.get_int("vocab_size", default=151936)
    hidden = cfg.get_int("hidden_size", default=2048)
    layers = cfg.get_int("num_hidden_layers", default=24)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = kv_heads(cfg, heads, 4)
    head_dim = cfg.opt_int("head_dim") or hidden // heads  # Qwen3MoeAttention: getattr(config, "head_dim", h/a)
    experts = cfg.get_int("num_experts", default=128)
    top_k = cfg.get_int("num_experts_per_tok", default=8)
    moe_inter = cfg.get_int("moe_intermediate_size", default=768)
    step = cfg.get_int("decoder_sparse_step", default=1)
    mlp_only = cfg.raw("mlp_only_layers")
    if (isinstance(mlp_only, list) and mlp_only) or step != 1 or experts <= 0:
        raise NotPureFamilyError("dense layers among sparse ones")  # meta keeps their layer indices
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    attention_linears(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    layer_norms(b, head_dim, layers, ("self_attn.q_norm", "self_attn.k_norm"))
    fused_experts(b, f"{LAYER}.mlp.experts", experts, hidden, moe_inter, repeat=layers)
    router(b, f"{LAYER}.mlp.gate", experts, hidden, repeat=layers)
    layer_norms(b, hidden, layers, PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    window = cfg.opt_int("sliding_window") if cfg.get_bool("use_sliding_window", default=False) else None
    shape = decoder_shape(cfg, architecture="Qwen3MoeForCausalLM", no_split="Qwen3MoeDecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=moe_inter, vocab=vocab, tied=tied,
                   max_pos_default=32768, activation=cfg.get_str("hidden_act", default="silu"),
                   sliding_window=window, experts=experts, top_k=top_k)
    return b.params, shape


def qwen3_moe_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Qwen3-MoE's traits."""
    why = "Qwen3-MoE under LoRA with checkpointing or freezing (peft's merged expert stacks per layer)"
    return replace(base, qk_norm=QkNorm.PER_HEAD, moe=MoeLayout.FUSED_EXPERTS, activations_pinned=True,
                   banded_sliding_mask=True, moe_backward_traced=True, gaps=RecipeGaps(lora_ckpt_or_freeze=why),
                   tp_plan=ATTN_ONLY + QK_NORM + MOE_EXPERTS + MLP)


def qwen2_moe_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Qwen2-MoE's traits (meta-device inventory; the Llama-style recipe, not pinned)."""
    return replace(base, banded_sliding_mask=True, moe=MoeLayout.FUSED_EXPERTS,
                   tp_plan=ATTN_ONLY + MOE_EXPERTS + MLP)


FAMILIES = (Family("qwen3_moe", qwen3_moe_traits, qwen3_moe), Family("qwen2_moe", qwen2_moe_traits))
