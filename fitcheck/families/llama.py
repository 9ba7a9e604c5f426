"""Llama (``model_type`` llama): inventory and traits.

The reference decoder: RMSNorm before attention and MLP, rotary GQA attention, SwiGLU MLP. Its activation
recipe (``fitcheck.core.activations.layer_saved``) was read off traces of this family; so were the backward
MLP working set, the QLoRA / LLM.int8 layers, and Liger-Kernel patches it (liger_kernel 0.8.5
``transformers/monkey_patch.py`` ``MODEL_TYPE_TO_APPLY_LIGER_FN``).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory
from fitcheck.families.decoder_blocks import PRE_POST, llama_like
from fitcheck.families.tp_plans import ATTN_MLP
from fitcheck.spec import FamilyTraits


def llama(cfg: ConfigView, prefix: str = "Llama") -> Inventory:
    """LlamaForCausalLM (configuration_llama.py defaults; attention_bias / mlp_bias flags); ``prefix`` names a
    family whose config class has the same parameters and defaults (GraniteConfig)."""
    attention_bias = cfg.get_bool("attention_bias", default=False)
    return llama_like(
        cfg,
        prefix=prefix,
        vocab_default=32000,
        hidden_default=4096,
        inter_default=11008,
        layers_default=32,
        heads_default=32,
        kv_default=None,
        head_dim_default=None,
        max_pos_default=2048,
        tie_default=False,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=cfg.get_bool("mlp_bias", default=False),
        norms=PRE_POST,
    )


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Llama's traits: the reference recipe, traced in every mode."""
    return replace(base, activations_pinned=True, backward_pinned=True, kbit_pinned=True, liger_patched=True,
                   tp_plan=ATTN_MLP)


FAMILY = Family("llama", traits, llama)
