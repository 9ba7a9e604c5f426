"""DeepSeek-V3 (``model_type`` deepseek_v3): inventory and traits.

Multi-head latent attention (low-rank q and kv projections with their norms), ``first_k_dense_replace``
dense layers then MoE layers with a shared expert, a router whose weight is cast to fp32
(``DeepseekV3TopkRouter``: ``weight.type(torch.float32)``).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.decoder_blocks import (
    LAYER,
    PRE_POST,
    decoder_shape,
    fused_experts,
    kv_heads,
    layer_norms,
    router,
)
from fitcheck.spec import AttentionKind, FamilyTraits, LayerRecipe, MlaConfig, MoeLayout, RecipeGaps, Role


def deepseek_v3(cfg: ConfigView) -> Inventory:
    """DeepseekV3ForCausalLM: MLA attention, ``first_k_dense_replace`` dense layers then MoE layers with a router,
    fused routed experts and a shared-expert MLP (modeling_deepseek_v3.py). The multi-token-prediction layer of
    the checkpoint is not built by transformers and is not counted.

    ModelShape follows the transformers config: ``head_dim`` = ``qk_rope_head_dim``, ``intermediate_size`` = the
    per-expert width (the dense layers' width is in the inventory).
    """
    vocab = cfg.get_int("vocab_size", default=129280)
    hidden = cfg.get_int("hidden_size", default=7168)
    inter = cfg.get_int("intermediate_size", default=18432)
    moe_inter = cfg.get_int("moe_intermediate_size", default=2048)
    layers = cfg.get_int("num_hidden_layers", default=61)
    heads = cfg.get_int("num_attention_heads", default=128)
    kv = kv_heads(cfg, heads, 128)
    experts = cfg.get_int("n_routed_experts", default=256)
    shared = cfg.get_int("n_shared_experts", default=1)
    top_k = cfg.get_int("num_experts_per_tok", default=8)
    dense = cfg.get_int("first_k_dense_replace", default=3)
    kv_rank = cfg.get_int("kv_lora_rank", default=512)
    q_rank = cfg.opt_int("q_lora_rank") if cfg.present("q_lora_rank") else 1536
    rope = cfg.get_int("qk_rope_head_dim", default=64)
    nope = cfg.get_int("qk_nope_head_dim", default=128)
    v_dim = cfg.get_int("v_head_dim", default=128)
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    att = f"{LAYER}.self_attn"
    b.embedding("model.embed_tokens", vocab, hidden)
    if q_rank is None:
        b.linear(f"{att}.q_proj", hidden, heads * (nope + rope), Role.ATTENTION, bias=False, repeat=layers)
    else:
        b.linear(f"{att}.q_a_proj", hidden, q_rank, Role.ATTENTION, bias=bias, repeat=layers)
        b.norm(f"{att}.q_a_layernorm", q_rank, bias=False, repeat=layers)
        b.linear(f"{att}.q_b_proj", q_rank, heads * (nope + rope), Role.ATTENTION, bias=False, repeat=layers)
    b.linear(f"{att}.kv_a_proj_with_mqa", hidden, kv_rank + rope, Role.ATTENTION, bias=bias, repeat=layers)
    b.norm(f"{att}.kv_a_layernorm", kv_rank, bias=False, repeat=layers)
    b.linear(f"{att}.kv_b_proj", kv_rank, heads * (nope + v_dim), Role.ATTENTION, bias=False, repeat=layers)
    b.linear(f"{att}.o_proj", heads * v_dim, hidden, Role.ATTENTION, bias=bias, repeat=layers)
    n_dense = min(max(dense, 0), layers)
    dense_ids = ["*"] if n_dense == layers else [str(i) for i in range(n_dense)]
    moe_ids = ["*"] if n_dense == 0 else [str(i) for i in range(n_dense, layers)]
    for i in dense_ids if n_dense else []:
        r = layers if i == "*" else 1
        for name, (fin, fout) in (("gate_proj", (hidden, inter)), ("up_proj", (hidden, inter)),
                                  ("down_proj", (inter, hidden))):
            b.linear(f"model.layers.{i}.mlp.{name}", fin, fout, Role.MLP, bias=False, repeat=r)
    for i in moe_ids if n_dense < layers else []:
        r = layers if i == "*" else 1
        fused_experts(b, f"model.layers.{i}.mlp.experts", experts, hidden, moe_inter, repeat=r)
        router(b, f"model.layers.{i}.mlp.gate", experts, hidden, repeat=r)
        s_inter = moe_inter * shared
        for name, (fin, fout) in (("gate_proj", (hidden, s_inter)), ("up_proj", (hidden, s_inter)),
                                  ("down_proj", (s_inter, hidden))):
            b.linear(f"model.layers.{i}.mlp.shared_experts.{name}", fin, fout, Role.MLP, bias=False, repeat=r)
    layer_norms(b, hidden, layers, PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = decoder_shape(cfg, architecture="DeepseekV3ForCausalLM", no_split="DeepseekV3DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=rope, inter=moe_inter, vocab=vocab, tied=tied,
                   max_pos_default=4096, activation=cfg.get_str("hidden_act", default="silu"),
                   experts=experts, top_k=top_k)
    return b.params, shape


# DeepseekV3Config defaults (transformers 5.23 configuration_deepseek_v3.py) for keys config.json may omit
_MLA_DEFAULTS = {
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "intermediate_size": 18432, "n_shared_experts": 1, "first_k_dense_replace": 3,
}


def _mla_int(cfg: ConfigView, key: str) -> int:
    value = cfg.get(key, _MLA_DEFAULTS[key])
    if value is None:
        return 0  # q_lora_rank: null (DeepSeek-V2-Lite style q_proj)
    return int(value) if isinstance(value, (int, float)) else _MLA_DEFAULTS[key]


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """DeepSeek-V3's traits: its own latent-attention recipe, pinned without checkpointing or freezing."""
    mla = MlaConfig(
        q_rank=_mla_int(cfg, "q_lora_rank"), kv_rank=_mla_int(cfg, "kv_lora_rank"),
        rope=_mla_int(cfg, "qk_rope_head_dim"), nope=_mla_int(cfg, "qk_nope_head_dim"),
        v_head_dim=_mla_int(cfg, "v_head_dim"), dense_intermediate=_mla_int(cfg, "intermediate_size"),
        shared_experts=_mla_int(cfg, "n_shared_experts"), first_dense=_mla_int(cfg, "first_k_dense_replace"),
    )
    why = "DeepSeek-V3 with checkpointing or freezing (its dense and MoE layers differ)"
    return replace(base, recipe=LayerRecipe.LATENT_MOE, attention=AttentionKind.LATENT,
                   moe=MoeLayout.SHARED_FP32_ROUTER, mla=mla, activations_pinned=True, moe_backward_traced=True,
                   gaps=RecipeGaps(ckpt_or_freeze=why))


FAMILY = Family("deepseek_v3", traits, deepseek_v3)
