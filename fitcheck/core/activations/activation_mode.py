"""How a run stores its activations: element bytes of the saved tensors and of the residual stream, autocast, the
LoRA dropout masks' bytes (:class:`ActivationMode`), read by every per-token recipe (``layer_saved``, ``logits``,
``decoder``). Pure, no torch; split out of ``layer_saved.py`` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.activations.qlora import kbit_fp32_lora, kbit_upcast, lora_dropout_mask_bytes
from fitcheck.spec import MixedPrecision, TrainingSpec


@dataclass(frozen=True)
class ActivationMode:
    """How the activations are stored: element bytes of activations (e), of the residual stream (r)."""

    e: int  # matmul outputs / saved linear inputs
    r: int  # residual stream / norm inputs
    autocast: bool
    half_model: bool
    amp: bool = False  # autocast on, whatever the load dtype: LoRA's fp32 adapters run in 16-bit (lora extras)
    dm: int = 4  # LoRA dropout-mask bytes per element of its fp32 input: CPU fp32 noise, CUDA bool (lora extras)
    # autocast over fp32 base outputs (qlora.kbit_fp32_lora): fp32 MLP outputs; attention saves 16-bit casts of
    # q, k, v (eager: of q, k^T, v), not the fused qkv output
    fp32_out: bool = False


def activation_mode(spec: TrainingSpec) -> ActivationMode:
    """How ``spec``'s activations are stored (element bytes, autocast, LoRA dropout masks)."""
    # peft's prepare_model_for_kbit_training casts every non-quantized parameter to fp32 (activations_qlora.py)
    half = spec.precision.load_dtype.is_half and not kbit_upcast(spec)
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    autocast = not half and amp
    dm = lora_dropout_mask_bytes(spec)  # aten Dropout.cpp: CUDA native_dropout's bool mask, CPU fp32 noise
    return ActivationMode(e=2 if half or autocast else 4, r=2 if half else 4, autocast=autocast, half_model=half,
                          amp=amp, dm=dm, fp32_out=autocast and kbit_fp32_lora(spec))
