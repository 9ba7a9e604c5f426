"""Which runs keep an fp32 residual stream over 16-bit weights (pure, no torch): 16-bit weights under the other
16-bit autocast dtype (:func:`other_half_autocast`, :func:`promoted_residual`) and peft's k-bit preparation
(:func:`kbit_upcast`). Below :mod:`.activation_mode` and :mod:`.qlora`, which both read them.
"""

from __future__ import annotations

from fitcheck.spec import Dtype, TrainingSpec

# the 16-bit load dtype whose embedding output, added to the other 16-bit autocast dtype's layer output, is promoted
# to fp32 (torch 2.13 ``torch.promote_types(torch.float16, torch.bfloat16)`` is ``torch.float32``)
_OTHER_AUTOCAST = {"float16": "bf16", "bfloat16": "fp16"}


def other_half_autocast(load_dtype: str | None, mixed_precision: str | None) -> bool:
    """Whether the weights are 16-bit and autocast computes in the other 16-bit dtype (``float16`` weights under
    ``bf16``, ``bfloat16`` weights under ``fp16``: TRL's default for the Phi-2 and Llama-2 configs, whose
    ``torch_dtype`` is float16): the one home of that rule, read on dtype names by the formulas
    (:func:`activation_mode`, ``layernorm_blocks``) and by the depth extrapolation
    (``torch_adapters/tracer_depth.residual_promoted``).

    The embedding output is in the weights' dtype (``nn.Embedding`` is on no autocast list), the layers' matmul
    outputs in the autocast dtype, and the residual add (transformers 5.23 ``modeling_llama.py``
    ``LlamaDecoderLayer.forward``: ``hidden_states = residual + hidden_states``; ``modeling_phi.py``
    ``PhiDecoderLayer.forward``: ``attn_outputs + feed_forward_hidden_states + residual``) is on no autocast list,
    so type promotion makes it fp32: the bottom layer reads the 16-bit embedding, every layer above an fp32
    residual stream.

    Args:
        load_dtype: The weights' dtype name (``float32``, ``bfloat16``, ``float16``).
        mixed_precision: The autocast setting (``no``, ``bf16``, ``fp16``).
    """
    return load_dtype is not None and _OTHER_AUTOCAST.get(load_dtype) == mixed_precision


def kbit_upcast(spec: TrainingSpec) -> bool:
    """True when every non-quantized parameter, hence the activations, is fp32: peft's k-bit preparation ran, or
    the model was loaded in fp32 (then the preparation casts nothing: the same step). Never under DeepSpeed's
    module cast (``PrecisionSpec.module_cast``): ``deepspeed.initialize`` runs after the preparation and casts its
    fp32 norms, embeddings and head back to 16 bits (``core/kernels/module_cast.py``)."""
    quant = spec.quant
    if quant is None or spec.precision.module_cast:
        return False
    return quant.prepare_for_kbit_training or spec.precision.load_dtype is Dtype.FLOAT32


def promoted_residual(spec: TrainingSpec) -> bool:
    """16-bit weights under the other 16-bit autocast dtype on the Llama-style layer (``ActivationMode.promoted``):
    every layer above the bottom one reads an fp32 residual (:func:`other_half_autocast`). Not the LayerNorm blocks
    (``layernorm_blocks.BlockCtx.res``), not a k-bit prepared run (fp32 already), not a pre-quantized GPTQ / AWQ
    base (its kernels' own matmuls, whose output dtype was not traced)."""
    quant = spec.quant
    return (spec.precision.load_dtype.is_half and not kbit_upcast(spec)
            and not spec.model.shape.traits.recipe.layernorm_block
            and not (quant is not None and quant.pre_quantized)
            and other_half_autocast(spec.precision.load_dtype.value, spec.precision.mixed_precision.value))
