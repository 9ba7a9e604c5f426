"""What a pre-quantized base adds to a step: the per-layer dequantized weight, and its findings.

Kept apart from :mod:`.prequant` (the byte math, read by :mod:`.quantization`) so that neither imports the other.
"""

from __future__ import annotations

from fitcheck.core.states.mxfp4 import mxfp4_findings
from fitcheck.core.states.prequant import PREQUANT_METHODS, SOURCE
from fitcheck.core.states.quantization import is_quantized
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import TrainingSpec


def _largest_quantized_linear(spec: TrainingSpec) -> int:
    sizes = [p.numel_each for p in spec.model.params if is_quantized(spec, p)]
    return max(sizes, default=0)


def prequant_components(spec: TrainingSpec) -> tuple[Component, ...]:
    """The per-layer dequantized weight of a pre-quantized base, a transient of forward and backward.

    gptqmodel's torch/triton ``TorchQuantLinear.forward`` (and the AWQ torch path) rebuild the fp16 weight of
    the layer (``dequantize_weight``) and multiply by it; transformers' ``FP8Linear`` backward calls
    ``_dequantize_fp8_weight`` for the input gradient. One layer's weight at a time: the largest quantized
    linear, in the compute dtype (2 bytes), at the end of forward and during backward.
    """
    quant = spec.quant
    if quant is None or quant.method not in PREQUANT_METHODS:
        return ()
    numel = _largest_quantized_linear(spec)
    if not numel:
        return ()
    phases = {Phase.BACKWARD: 2 * numel}
    if quant.method != "fp8":  # FP8Linear's forward runs the fp8 GEMM on the packed weight
        phases[Phase.FORWARD_END] = 2 * numel
    return (
        Component(
            "temporaries.dequantized_weight",
            Category.TEMPORARIES,
            Location.DEVICE,
            phases,
            SOURCE[quant.method] + "; dequantized per layer for the matmul (one layer at a time)",
            f"largest quantized linear ({numel:,} values) rebuilt in 16-bit",
        ),
    )


def prequant_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """What a pre-quantized checkpoint means for the run: the scheme read, load-time behaviour, MXFP4."""
    quant = spec.quant
    if quant is None or not quant.pre_quantized or quant.method == "bitsandbytes":
        return ()
    if quant.method == "mxfp4":
        return mxfp4_findings(spec.model, spec.precision.load_dtype)
    group = "per-row" if quant.group_size <= 0 else f"group size {quant.group_size}"
    what = f"{quant.bits}-bit, {group}" if quant.method in ("gptq", "awq") else "fp8 weights"
    return (
        Finding(
            "pre-quantized-base",
            Severity.INFO,
            f"pre-quantized {quant.method} checkpoint ({what}): weights load as stored (no dequantization at load, "
            "the load-time peak is the quantized weights plus one shard), stay frozen, and LoRA trains on top; "
            "kernel-specific repacking at post_init (Marlin/ExLlama workspaces) is not counted",
        ),
    )
