"""Mixtral (``model_type`` mixtral): inventory and traits.

The Mistral layer with a sparse MoE MLP: transformers 5 stores the experts as fused 3-D tensors
(``MixtralExperts``); transformers 4.x built them as ``nn.Linear`` (``fitcheck.readers.families_legacy``).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder
from fitcheck.families.decoder_blocks import LAYER, PRE_POST, attention_linears, decoder_shape, head_dim_of, layer_norms
from fitcheck.families.tp_plans import ATTN_ONLY, MOE_EXPERTS
from fitcheck.spec import FamilyTraits, Kind, MoeLayout, Role


def mixtral(cfg: ConfigView) -> Inventory:
    """MixtralForCausalLM with transformers 5 fused experts.

    ``mlp.gate`` is ``MixtralTopKRouter`` (a bare ``(E, h)`` parameter, not an ``nn.Linear``: bitsandbytes
    does not quantize it); ``mlp.experts`` is ``MixtralExperts`` with 3-D ``gate_up_proj (E, 2I, h)`` and
    ``down_proj (E, h, I)`` (modeling_mixtral.py). ``in_features``/``out_features`` of the expert tensors are
    those of one expert's matmul, as peft's ``ParamWrapper`` reads them.
    """
    vocab = cfg.get_int("vocab_size", default=32000)
    hidden = cfg.get_int("hidden_size", default=4096)
    inter = cfg.get_int("intermediate_size", default=14336)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv_present = cfg.present("num_key_value_heads")
    kv = cfg.opt_int("num_key_value_heads") or (heads if kv_present else 8)
    head_dim = head_dim_of(cfg, hidden, heads)
    experts = cfg.get_int("num_local_experts", "num_experts", default=8)
    top_k = cfg.get_int("num_experts_per_tok", default=2)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    attention_linears(b, hidden, heads, kv, head_dim, layers, qkv_bias=False, o_bias=False)
    b.add(
        f"{LAYER}.mlp.gate.weight",
        (experts, hidden),
        Role.ROUTER,
        Kind.OTHER,
        repeat=layers,
        in_features=hidden,
        out_features=experts,
    )
    b.add(
        f"{LAYER}.mlp.experts.gate_up_proj",
        (experts, 2 * inter, hidden),
        Role.EXPERTS,
        Kind.FUSED_EXPERTS,
        repeat=layers,
        in_features=hidden,
        out_features=2 * inter,
    )
    b.add(
        f"{LAYER}.mlp.experts.down_proj",
        (experts, hidden, inter),
        Role.EXPERTS,
        Kind.FUSED_EXPERTS,
        repeat=layers,
        in_features=inter,
        out_features=hidden,
    )
    layer_norms(b, hidden, layers, PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = decoder_shape(
        cfg,
        architecture="MixtralForCausalLM",
        no_split="MixtralDecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos_default=131072,
        activation=cfg.get_str("hidden_act", default="silu"),
        sliding_window=cfg.opt_int("sliding_window"),
        experts=experts,
        top_k=top_k,
    )
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Mixtral's traits: fused experts with a softmax router, traced for the layer recipe."""
    return replace(base, moe=MoeLayout.FUSED_EXPERTS, v4_linear_experts=True, activations_pinned=True,
                   banded_sliding_mask=True, liger_patched=True, tp_plan=ATTN_ONLY + MOE_EXPERTS)


FAMILY = Family("mixtral", traits, mixtral)
