"""Known CUDA-vs-CPU gaps of the activation formulas for one run (docs/cuda-vs-cpu.md); pure.

The formulas are pinned to CPU traces; ``docs/cuda-vs-cpu.md`` lists every place where a CUDA step runs other
kernels and says which are modelled. The ones not modelled that apply to a run are returned here as one INFO
finding, so a ``--device_type cuda`` answer says what it could not see.
"""

from __future__ import annotations

from fitcheck.core.activations.int8_outliers import int8_outlier_gap, int8_outliers_apply
from fitcheck.findings import Finding, Severity
from fitcheck.spec import AttnImpl, DeviceType, MixedPrecision, TrainingSpec


def cuda_gaps(spec: TrainingSpec) -> tuple[str, ...]:
    """The unmodelled CUDA differences (docs/cuda-vs-cpu.md sections) that apply to ``spec``."""
    if spec.hardware.device_type is not DeviceType.CUDA:
        return ()
    out: list[str] = []
    autocast = spec.precision.mixed_precision is not MixedPrecision.NO
    # LayerNorm blocks (fitcheck.core.activations.layernorm_blocks): CUDA autocast runs layer_norm in fp32
    layernorm = spec.model.shape.traits.recipe.layernorm_block
    if autocast and not spec.precision.load_dtype.is_half and layernorm:
        # aten/src/ATen/autocast_mode.cpp: KERNEL_CUDA(layer_norm, fp32); the CPU list keeps it in bf16
        out.append("CUDA autocast runs layer_norm in fp32 (its output 4 B/element, CPU trace 2 B)")
    quant = spec.quant
    if quant is not None and quant.bits == 4 and spec.batch.micro_batch * spec.batch.seq_len <= 512:
        # bitsandbytes 0.50.2 backends/cuda/ops.py gemm_4bit: custom kernel (no dequantized temporary) for few rows
        out.append("bitsandbytes' CUDA gemm_4bit may skip the dequantized-weight temporary at this token count")
    if quant is not None and quant.bits == 8 and quant.method == "bitsandbytes":  # not FP8 / GPTQ bases
        # bitsandbytes 0.50.2 autograd/_functions.py matmul: training on CUDA runs MatMul8bitLt (int8 GEMM,
        # output in the input's dtype, ctx.tensors = (None, subA, A)); modelled from source in activations/int8.py
        # outliers: backends/cuda/ops.py int8_vectorwise_quant (columns with |A| >= threshold), backends/default/
        # ops.py int8_mixed_scaled_mm (subA = A[:, outlier_cols].contiguous(), kept in ctx.tensors)
        if quant.int8_threshold == 0:  # MatMul8bitLt.forward: int8_scaled_mm only, subA = None
            out.append("LLM.int8 layers run MatMul8bitLt on CUDA, modelled from its source (not traced: CPU runs "
                       "MatMul8bitFp); llm_int8_threshold 0: no outlier columns")
        else:
            out.append(int8_outlier_gap(spec) if int8_outliers_apply(spec) else
                       "LLM.int8 layers run MatMul8bitLt on CUDA, modelled from its source (not traced: CPU runs "
                       "MatMul8bitFp); the input columns with an outlier (|x| >= llm_int8_threshold) it copies and "
                       "keeps until the step ends (subA, the input's dtype) depend on the data and are not counted: "
                       "a few columns in a trained model, up to a full copy of each down_proj input (4 B x "
                       "intermediate_size per token per layer) with random weights")
    if spec.activations.attn_implementation is AttnImpl.FLASH_ATTENTION_2:
        out.append("flash_attention_2 (flash-attn package) is modelled as SDPA's flash backend, not traced")
    return tuple(out)


def cuda_gap_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """One INFO finding ``cuda-not-traced`` listing :func:`cuda_gaps` (none when nothing applies)."""
    gaps = cuda_gaps(spec)
    if not gaps:
        return ()
    return (
        Finding(
            "cuda-not-traced",
            Severity.INFO,
            "not modelled for CUDA (docs/cuda-vs-cpu.md): " + "; ".join(gaps),
            "measure one step on the GPU (benchmarks/gpu_truth.py) if the margin is small",
        ),
    )
