"""The "load in bf16" lever: for a model estimated in float32 only because no dtype was passed (pure).

Happens when config.json names no dtype (gpt-oss, older GPT-2/BERT files) or on transformers 4.x, whose
``from_pretrained`` loads float32 without ``torch_dtype`` (fitcheck.readers.checkpoint_dtype). Loading the
weights in bf16 halves them, their gradients and Adam's states in a full fine-tune.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.spec import Dtype, TrainingSpec


def load_bf16(spec: TrainingSpec) -> TrainingSpec:
    """The spec with the weights loaded in bf16."""
    return replace(spec, precision=replace(spec.precision, load_dtype=Dtype.BFLOAT16))


def wants_bf16_lever(spec: TrainingSpec) -> bool:
    """True when the estimate is float32 although the checkpoint is not known to be float32.

    Not offered when the user passed a dtype (``provenance`` has it), for a quantized base (its compute dtype
    decides), or when config.json itself says float32 (the checkpoint's own dtype).
    """
    if spec.precision.load_dtype is not Dtype.FLOAT32 or spec.quant is not None:
        return False
    if any(key in spec.provenance for key in ("dtype", "torch_dtype")):
        return False
    config_dtype = spec.model.shape.config_dtype
    return config_dtype is None or config_dtype.is_half
