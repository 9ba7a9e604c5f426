"""Granite (``model_type`` granite: IBM Granite 3.x dense): inventory and traits.

``GraniteForCausalLM`` (transformers 5.23 ``models/granite/modeling_granite.py``) is the Llama decoder (same
modules, same ``GraniteConfig`` defaults as ``LlamaConfig``) plus four µP scalars from config.json:
``embedding_multiplier`` (``GraniteModel.forward``: ``inputs_embeds = inputs_embeds * self.embedding_multiplier``),
``residual_multiplier`` (``residual + hidden_states * self.residual_multiplier``, twice per layer),
``attention_multiplier`` (the softmax scale) and ``logits_scaling`` (``logits = logits / logits_scaling``).
A product or quotient by a Python scalar saves nothing for backward, so the layers, the logits and the loss keep
what Llama's keep (fake-tensor traces of granite-3.3-8b-instruct at 2 layers: byte-equal to the same widths built
as ``LlamaForCausalLM`` in every full fine-tune cell and every LoRA cell without checkpointing).

The one difference that shows is where the embedding is scaled: outside ``get_input_embeddings()``. With
checkpointing and a frozen embedding, ``enable_input_require_grads`` (transformers 5.23 modeling_utils.py) makes
the embedding module's output a leaf that requires a gradient; Granite then multiplies it into a new tensor, so
that leaf is not the first layer's input and its ``AccumulateGrad`` node holds it until backward ends (one
``b x s x h`` tensor in the embedding dtype more than Llama: trace, LoRA + checkpointing, +2 MiB bf16 / +4 MiB
fp32 at 1 x 256 x 4096). Gemma scales inside its embedding module (``GemmaScaledWordEmbedding``) and keeps no
such tensor. The trait is :attr:`fitcheck.spec.FamilyTraits.embedding_scaled_outside`.

Liger-Kernel patches granite, but with its own defaults (liger_kernel ``apply_liger_kernel_to_granite``:
``cross_entropy=True``, ``fused_linear_cross_entropy=False`` -- the logits scaling keeps the logits), which the
Liger model of ``fitcheck.core.kernels`` (Llama's fused linear cross-entropy) does not describe:
``liger_patched`` stays False. QLoRA and LLM.int8 bases trace as Llama's plus that one tensor
(``kbit_pinned``).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory
from fitcheck.families.llama import llama
from fitcheck.families.tp_plans import ATTN_MLP
from fitcheck.spec import FamilyTraits


def granite(cfg: ConfigView) -> Inventory:
    """GraniteForCausalLM: configuration_granite.py has Llama's parameters and defaults (``attention_bias`` on
    q/k/v/o, ``mlp_bias``); the multipliers change no tensor."""
    return llama(cfg, prefix="Granite")


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Granite's traits: Llama's recipe (traced for full and LoRA), the embedding scaled outside its module."""
    return replace(base, activations_pinned=True, backward_pinned=True, kbit_pinned=True,
                   embedding_scaled_outside=True, tp_plan=ATTN_MLP)


FAMILY = Family("granite", traits, granite)
