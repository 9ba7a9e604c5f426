"""Phi (``model_type`` phi: phi-1/1.5/2): inventory and traits.

One LayerNorm per block, attention and a gelu_new MLP in parallel, partial rotary, a biased LM head.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.layernorm_blocks import dropout_prob, layernorm_shape
from fitcheck.spec import Dropout, FamilyTraits, LayerRecipe, NormKind, Role


def phi(cfg: ConfigView) -> Inventory:
    """PhiForCausalLM (phi-1/1.5/2): biased q/k/v/dense and fc1/fc2, one LayerNorm per parallel block,
    optional q/k LayerNorms, ``lm_head`` with a bias (modeling_phi.py)."""
    vocab = cfg.get_int("vocab_size", default=51200)
    hidden = cfg.get_int("hidden_size", default=2048)
    inter = cfg.get_int("intermediate_size", default=8192)
    layers = cfg.get_int("num_hidden_layers", default=24)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = cfg.opt_int("num_key_value_heads") or heads
    head_dim = cfg.opt_int("head_dim") or hidden // heads
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    lay = "model.layers.*"
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    b.linear(f"{lay}.self_attn.q_proj", hidden, heads * head_dim, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.self_attn.k_proj", hidden, kv * head_dim, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.self_attn.v_proj", hidden, kv * head_dim, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.self_attn.dense", heads * head_dim, hidden, Role.ATTENTION, bias=True, repeat=layers)
    if cfg.get_bool("qk_layernorm", default=False):
        # nn.LayerNorm(hidden_size // num_attention_heads) in PhiAttention, not head_dim.
        b.norm(f"{lay}.self_attn.q_layernorm", hidden // heads, bias=True, repeat=layers)
        b.norm(f"{lay}.self_attn.k_layernorm", hidden // heads, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.fc1", hidden, inter, Role.MLP, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.fc2", inter, hidden, Role.MLP, bias=True, repeat=layers)
    b.norm(f"{lay}.input_layernorm", hidden, bias=True, repeat=layers)
    b.norm("model.final_layernorm", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied, bias=True)
    shape = layernorm_shape(
        cfg,
        architecture="PhiForCausalLM",
        no_split="PhiDecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos=cfg.get_int("max_position_embeddings", default=2048),
        activation=cfg.get_str("hidden_act", default="gelu_new"),
        parallel_attn=True,
        partial_rotary=cfg.partial_rotary_factor(0.5),
        head_dim=head_dim,
    )
    return b.params, shape


# transformers 5.23 configuration_phi.py base_model_tp_plan
_TP_PLAN = (
    ("layers.*.self_attn.q_proj", "colwise"),
    ("layers.*.self_attn.k_proj", "colwise"),
    ("layers.*.self_attn.v_proj", "colwise"),
    ("layers.*.self_attn.dense", "rowwise"),
    ("layers.*.mlp.fc1", "colwise"),
    ("layers.*.mlp.fc2", "rowwise"),
)


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Phi's traits: its own parallel-block recipe (PhiConfig dropout defaults 0.0)."""
    dropout = Dropout(attention=dropout_prob(cfg, "attention_dropout", 0.0),
                      hidden=dropout_prob(cfg, "resid_pdrop", 0.0), embedding=dropout_prob(cfg, "embd_pdrop", 0.0),
                      functional=("attention",))  # modeling_phi.py PhiAttention: a float, not an nn.Dropout
    return replace(base, recipe=LayerRecipe.PHI_PARALLEL, norm_kind=NormKind.LAYERNORM, dropout=dropout,
                   activations_pinned=True, tp_plan=_TP_PLAN)


FAMILY = Family("phi", traits, phi)
