"""Saved activations, logits and loss, and the backward working set of one step, per phase.

- :mod:`.decoder`: the decoder-layer formulas (Llama-style families), the logits/loss term, checkpointing,
  the autocast weight cache, and the components the report shows;
- :mod:`.layer_saved`: what one decoder layer (and the model outside its layers) saves per token;
  :mod:`.activation_mode`: how a run stores its activations; :mod:`.logits`: the loss's logits, the head's backward;
- :mod:`.layernorm_blocks`: the LayerNorm blocks (GPT-2, BERT, Phi-2, Falcon, BLOOM), chosen by ``traits.recipe``
  (:mod:`.layernorm_outside`: what they keep outside their layers);
- :mod:`.norms`: fp32-product RMSNorms, q/k norms, post-norm-only layers; :mod:`.attention_variants`: attention
  sinks and their eager softmax, the rotary tables; :mod:`.moe_grouped_mm`: grouped_mm clamped-SwiGLU experts;
  :mod:`.moe_expert_loop`: transformers 4.x's per-expert ``nn.Linear`` Mixtral loop;
  :mod:`.mla`: latent attention and DeepSeek's dense/MoE layers; :mod:`.param_wrapper`: peft's MoE adapters;
- :mod:`.heads`: classifier heads (and the BERT layer a RoBERTa-like classifier runs); :mod:`.vision`: the tower;
- :mod:`.dora`: DoRA's extra saved tensors and transients (and other LoRA extras);
- :mod:`.qlora`, :mod:`.qlora16`, :mod:`.int8`: layers over bitsandbytes 4-/8-bit bases; :mod:`.int8_outliers`:
  what LLM.int8's outlier columns add on CUDA (data-dependent) and its bound;
- :mod:`.backward`: the worst moment during backward beyond the gradients (:mod:`.backward_grads`: the gradients
  and weight casts it counts; :mod:`.backward_zero2`: DeepSpeed ZeRO-2's gradient partition in it and, for traced
  activations, ``zero2_traced_component``; FSDP2's gradients at its moments for traced activations:
  :mod:`.fsdp_traced`);
- :mod:`.eager`: eager attention's working set (the top layer's forward softmax, each layer's softmax backward,
  the mask checkpointed layers hold);
- :mod:`.recipe_gaps`: what each family's recipe was not checked for (the ``activations-not-pinned`` warning);
- :mod:`.versions`: what older library versions change (transformers 4.x loss path) and version findings;
  :mod:`.bnb_kept_inputs`: the inputs bitsandbytes <= 0.43.1 keeps in every 4-bit linear.
- :mod:`.freeze`: partial training by layers (which layers save what);
- :mod:`.envelope`: which kinds of run the formulas were checked for against traces;
- :mod:`.cuda`: the CUDA-vs-CPU differences not modelled (docs/cuda-vs-cpu.md) that apply to a run.

The formulas read ``ModelShape.traits`` (:mod:`fitcheck.families`), never a ``model_type``. Where a new model
family goes: its module in :mod:`fitcheck.families` declaring its traits; a new mechanism (a norm, an attention
variant, an MoE layout) here, in the module of that mechanism, selected by a new trait, with a test against the
tracer.
"""

from fitcheck.core.activations.backward_grads import cuda_embedding_backward
from fitcheck.core.activations.backward_zero2 import zero2_traced_component
from fitcheck.core.activations.bnb_kept_inputs import old_bnb_4bit
from fitcheck.core.activations.decoder import activation_components, activation_findings
from fitcheck.core.activations.envelope import CHECKED, TOLERANCE, envelope_key, in_envelope, not_pinned_finding
from fitcheck.core.activations.envelope_range import DEFAULT_TARGETS, range_label, recipe_suffix
from fitcheck.core.activations.fsdp1_reentrant import held_checkpoint_inputs
from fitcheck.core.activations.fsdp_traced import fsdp_traced_backward
from fitcheck.core.activations.int8_outliers import (
    Int8Outliers,
    int8_outlier_bound,
    int8_outlier_bytes,
    int8_outlier_findings,
)
from fitcheck.core.activations.layer_saved import layer_saved_per_token, lm_head_input_saved
from fitcheck.core.activations.layernorm_blocks import layernorm_block_saved, legacy_softmax_input_added
from fitcheck.core.activations.logits import traced_legacy_logits
from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.moe_expert_loop import expert_loop_applies
from fitcheck.core.activations.norm_backward import RMS_BACKWARD_TEMPS
from fitcheck.core.activations.promoted import other_half_autocast
from fitcheck.core.activations.qlora import lora_dropout_mask_bytes
from fitcheck.core.activations.qlora16 import qlora16_backward_working_set
from fitcheck.core.activations.versions import legacy_bnb_kept_inputs, versions_findings

__all__ = [
    "CHECKED",
    "DEFAULT_TARGETS",
    "RMS_BACKWARD_TEMPS",
    "TOLERANCE",
    "Int8Outliers",
    "activation_components",
    "activation_findings",
    "cuda_embedding_backward",
    "envelope_key",
    "expert_loop_applies",
    "fsdp_traced_backward",
    "held_checkpoint_inputs",
    "in_envelope",
    "int8_outlier_bound",
    "int8_outlier_bytes",
    "int8_outlier_findings",
    "layer_saved_per_token",
    "layernorm_block_saved",
    "legacy_bnb_kept_inputs",
    "legacy_softmax_input_added",
    "lm_head_input_saved",
    "lora_dropout_mask_bytes",
    "not_pinned_finding",
    "old_bnb_4bit",
    "other_half_autocast",
    "qlora16_backward_working_set",
    "range_label",
    "recipe_suffix",
    "traced_legacy_logits",
    "versions_findings",
    "wrapped_linears",
    "zero2_traced_component",
]
