"""How a run stores its activations: element bytes of the saved tensors and of the residual stream, autocast, the
LoRA dropout masks' bytes (:class:`ActivationMode`), read by every per-token recipe (``layer_saved``, ``logits``,
``decoder``), and what one LoRA adapter saves for its input (:func:`adapter_input_bytes`: the Llama-style layer's
and the LayerNorm blocks'). Pure, no torch; split out of ``layer_saved.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.activations.promoted import kbit_upcast, promoted_residual
from fitcheck.core.activations.qlora import kbit_fp32_lora, lora_dropout_mask_bytes
from fitcheck.core.states import trl_module_cast
from fitcheck.spec import LoraSpec, MixedPrecision, TrainingSpec


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
    # 16-bit weights under the other 16-bit autocast dtype on the Llama-style layer (:func:`other_half_autocast`):
    # every layer above the bottom one runs as fp32 weights under autocast (``autocast``, r = 4); the embedding
    # output, the bottom layer's checkpoint and the rotary tables stay in the weights' 16 bits
    promoted: bool = False
    # the LoRA adapters are the 16-bit model's dtype (DeepSpeed's module cast, PrecisionSpec.module_cast): peft's
    # _cast_input_dtype has nothing to cast, the branch runs on the 16-bit input as an fp32 model's does on its own
    a16: bool = False
    # the bottom layer reads a 16-bit embedding output below an fp32 residual stream: ``promoted``, or a k-bit
    # prepared run whose embedding TRL 0.7.5-0.25.1's SFTTrainer cast back to bf16 (core/states/trl_adapters.py):
    # 16-bit rotary tables (``cos.to(x.dtype)``) and a 16-bit bottom checkpoint (decoder._promoted_first_less)
    embed16: bool = False


def activation_mode(spec: TrainingSpec) -> ActivationMode:
    """How ``spec``'s activations are stored (element bytes, autocast, LoRA dropout masks)."""
    # peft's prepare_model_for_kbit_training casts every non-quantized parameter to fp32 (activations_qlora.py)
    half = spec.precision.load_dtype.is_half and not kbit_upcast(spec)
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    # the Llama-style layer above the bottom one, fp16 weights under bf16 autocast (or bf16 under fp16): its input
    # is the fp32 residual, so its norms (LlamaRMSNorm.forward: ``self.weight * hidden_states.to(input_dtype)``,
    # input_dtype float32) return fp32 and autocast casts them and the 16-bit weights (not kFloat: never cached,
    # torch 2.13 autocast_mode.cpp ``cached_cast``) for each matmul, as over fp32 weights. Fake-tensor traces of
    # Llama-2 at width 256, 2 x 256, 4 and 5 layers, bf16 autocast, checkpointed LoRA / QLoRA: during backward the
    # float16 config holds the float32 config's bytes less its 16-bit embedding output and rotary tables
    # (327,680 B less); the LayerNorm blocks model it in layernorm_blocks.BlockCtx.res
    promoted = promoted_residual(spec)
    if promoted:
        half = False
    autocast = not half and amp
    a16 = half and spec.precision.module_cast and spec.lora is not None
    dm = lora_dropout_mask_bytes(spec)  # aten Dropout.cpp: CUDA native_dropout's bool mask, CPU fp32 noise
    if a16 and dm > 1:  # CPU: empty_like(input).bernoulli_() noise in the 16-bit input's dtype
        dm = spec.precision.load_dtype.nbytes
    embed16 = promoted or (autocast and trl_module_cast(spec))
    return ActivationMode(e=2 if half or autocast else 4, r=2 if half else 4, autocast=autocast, half_model=half,
                          amp=amp, dm=dm, fp32_out=autocast and kbit_fp32_lora(spec), promoted=promoted, a16=a16,
                          embed16=embed16)


def adapter_input_bytes(m: ActivationMode, lora: LoraSpec, width: int) -> int:
    """Bytes per token one peft ``lora.Linear`` adapter saves for an input of ``width`` features.

    peft 0.21 ``lora.Linear.forward``: ``x = _cast_input_dtype(x, fp32)``, then ``lora_B(lora_A(dropout(x)))``;
    each wrapped module has its own dropout, so q/k/v reading one tensor keep three masks (trace: 3 empty_like).
    """
    drop = lora.dropout > 0
    total = m.dm * width if drop else 0  # dropout noise of the fp32 input (trace: empty_like fp32; CUDA bool)
    if m.a16:  # 16-bit adapters on the 16-bit input: its dropout output and lora_A's output, both 16-bit
        return total + (m.e * width if drop else 0) + m.e * lora.r
    if m.amp:
        total += 2 * width  # autocast's 16-bit cast of lora_A's input, one per adapter (trace: _to_copy bf16)
    elif drop or m.half_model:
        total += 4 * width  # fp32 dropout output, or the fp32 copy of a 16-bit input (trace: mul / _to_copy)
    return total + (2 if m.amp else 4) * lora.r  # lora_A output, kept by lora_B (trace: mm (b·s, r))
