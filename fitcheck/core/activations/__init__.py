"""Saved activations, logits and loss, and the backward working set of one step, per phase.

- :mod:`.decoder`: the decoder-layer formulas (Llama-style families), the logits/loss term, checkpointing,
  the autocast weight cache, and the components the report shows;
- :mod:`.layer_saved`: what one decoder layer (and the model outside its layers) saves per token, the logits;
- :mod:`.families`: per-family tables for the other architectures (GPT-2, BERT, Phi-2, Falcon, BLOOM);
- :mod:`.dora`: DoRA's extra saved tensors and transients (and other LoRA extras);
- :mod:`.qlora`: layers over bitsandbytes 4-bit bases (what ``prepare_model_for_kbit_training`` changes);
- :mod:`.backward`: the worst moment during backward beyond the gradients;
- :mod:`.recent`: the 2025 families (Qwen3 q/k norms; what is not pinned);
- :mod:`.olmo2_gpt_oss`: what OLMo-2 and gpt-oss layers keep beyond the Llama recipe;
- :mod:`.versions`: what older library versions change (transformers 4.x loss path) and version findings.
- :mod:`.freeze`: partial training by layers (which layers save what);
- :mod:`.envelope`: which kinds of run the formulas were checked for against traces;
- :mod:`.cuda`: the CUDA-vs-CPU differences not modelled (docs/cuda-vs-cpu.md) that apply to a run.

Where a new model family goes: a formula pinned to a fake-tensor trace in :mod:`.families` (or
:mod:`.decoder` when it is a Llama-style decoder), with a test against the tracer.
"""

from fitcheck.core.activations.backward import cuda_embedding_backward
from fitcheck.core.activations.decoder import activation_components, activation_findings
from fitcheck.core.activations.envelope import CHECKED, envelope_key, in_envelope, not_pinned_finding
from fitcheck.core.activations.layer_saved import layer_saved_per_token
from fitcheck.core.activations.layernorm_blocks import layernorm_block_saved
from fitcheck.core.activations.versions import versions_findings

__all__ = [
    "CHECKED",
    "activation_components",
    "activation_findings",
    "cuda_embedding_backward",
    "envelope_key",
    "in_envelope",
    "layer_saved_per_token",
    "layernorm_block_saved",
    "not_pinned_finding",
    "versions_findings",
]
