"""GPT-2 (``model_type`` gpt2): inventory and traits.

Pre-LN blocks with fused ``Conv1D`` projections, learned positions, a gelu_new MLP, a tied LM head.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder, NotPureFamilyError
from fitcheck.families.layernorm_blocks import dropout_prob, layernorm_shape
from fitcheck.spec import Dropout, FamilyTraits, LayerRecipe, NormKind, Role


def gpt2(cfg: ConfigView) -> Inventory:
    """GPT2LMHeadModel: learned positions, Conv1D projections (weights stored ``(in, out)``), tied head."""
    if cfg.get_bool("add_cross_attention", default=False):
        raise NotPureFamilyError("gpt2 with add_cross_attention")
    vocab = cfg.get_int("vocab_size", default=50257)
    hidden = cfg.get_int("n_embd", "hidden_size", default=768)
    layers = cfg.get_int("n_layer", "num_hidden_layers", default=12)
    heads = cfg.get_int("n_head", "num_attention_heads", default=12)
    positions = cfg.get_int("n_positions", "max_position_embeddings", default=1024)
    inter = cfg.opt_int("n_inner") or 4 * hidden
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    lay = "transformer.h.*"
    b = InventoryBuilder()
    b.embedding("transformer.wte", vocab, hidden)
    b.embedding("transformer.wpe", positions, hidden, Role.POSITION)
    b.norm(f"{lay}.ln_1", hidden, bias=True, repeat=layers)
    b.conv1d(f"{lay}.attn.c_attn", hidden, 3 * hidden, Role.ATTENTION, repeat=layers)
    b.conv1d(f"{lay}.attn.c_proj", hidden, hidden, Role.ATTENTION, repeat=layers)
    b.norm(f"{lay}.ln_2", hidden, bias=True, repeat=layers)
    b.conv1d(f"{lay}.mlp.c_fc", hidden, inter, Role.MLP, repeat=layers)
    b.conv1d(f"{lay}.mlp.c_proj", inter, hidden, Role.MLP, repeat=layers)
    b.norm("transformer.ln_f", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied)
    shape = layernorm_shape(
        cfg,
        architecture="GPT2LMHeadModel",
        no_split="GPT2Block",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=heads,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos=positions,
        activation=cfg.get_str("activation_function", default="gelu_new"),
    )
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """GPT-2's traits: its own block recipe (GPT2Config dropout defaults 0.1)."""
    dropout = Dropout(attention=dropout_prob(cfg, "attn_pdrop", 0.1), hidden=dropout_prob(cfg, "resid_pdrop", 0.1),
                      embedding=dropout_prob(cfg, "embd_pdrop", 0.1))
    return replace(base, recipe=LayerRecipe.GPT2_BLOCK, norm_kind=NormKind.LAYERNORM, dropout=dropout,
                   activations_pinned=True)


FAMILY = Family("gpt2", traits, gpt2)
