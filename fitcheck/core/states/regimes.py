"""Which precision regime applies, and what the user should know about the model states."""

from __future__ import annotations

from fitcheck.core.optimizers import canonical_optimizer
from fitcheck.core.states.fsdp_upcast import SOURCE as SOURCE_UPCAST
from fitcheck.core.states.fsdp_upcast import fsdp_fp32_upcast
from fitcheck.core.states.layout import (
    Layout,
    all_trainable,
    build_layout,
    ds_mixed_dtype,
    has_master,
    total_bytes,
)
from fitcheck.core.states.quantization import SOURCE_KBIT
from fitcheck.findings import Finding, Severity
from fitcheck.spec import Dtype, Kind, MixedPrecision, TrainingSpec
from fitcheck.units import format_bytes


def describe_regime(spec: TrainingSpec) -> str:
    """One sentence saying which precision regime applies.

    Args:
        spec: The training spec.

    Returns:
        The regime, in words.
    """
    layout = build_layout(spec)
    groups = all_trainable(layout)
    mp = spec.precision.mixed_precision
    load = spec.precision.load_dtype.value
    cast = ds_mixed_dtype(spec)
    if cast is not None:
        return (
            f"DeepSpeed {cast.value} (ZeRO-{spec.sharding.zero_stage or 0}): 16-bit parameters and gradients, "
            f"fp32 master "
            "weights and fp32 optimizer states" + (" (partitioned)" if (spec.sharding.zero_stage or 0) >= 1 else "")
        )
    if has_master(spec):
        return "DeepSpeed ZeRO fp32: fp32 parameters, gradients and states, plus ZeRO's fp32 partition copy"
    dtypes = {g.dtype for g in groups}
    if not groups:
        return "no trainable parameters: forward/backward only"
    base = ""
    if spec.lora is not None:
        base = f"LoRA on a frozen {'quantized ' if spec.quant else ''}{load} base, "
    if dtypes <= {Dtype.BFLOAT16, Dtype.FLOAT16}:
        return (
            base + f"{'/'.join(sorted(d.value for d in dtypes))} parameters with a plain torch optimizer: "
            "gradients and optimizer states in the same 16-bit dtype, no fp32 master copy"
        )
    if dtypes == {Dtype.FLOAT32}:
        if fsdp_fp32_upcast(spec):
            return base + (
                f"FSDP {mp.value} mixed precision: fp32 trainable shards, gradients and optimizer states "
                f"(accelerate upcasts trainable low-precision parameters to fp32), {mp.value} gathered "
                "parameters for compute"
            )
        if mp is MixedPrecision.BF16:
            return base + "fp32 trainable parameters under bf16 autocast: fp32 gradients and optimizer states"
        if mp is MixedPrecision.FP16:
            return (
                base
                + "fp32 trainable parameters under fp16 autocast (AMP + GradScaler): fp32 gradients and states"
            )
        return base + "fp32 parameters, gradients and optimizer states (no autocast)"
    return (
        base
        + "mixed trainable dtypes: "
        + ", ".join(sorted(d.value for d in dtypes))
        + "; gradients and states follow each parameter's dtype"
    )


def model_state_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """What the user should know about the model states (quantization gaps, refused configs, paged memory).

    Args:
        spec: The training spec.

    Returns:
        Findings, worst first is not guaranteed (the estimate sorts them).
    """
    out: list[Finding] = []
    layout = build_layout(spec)
    _, renamed = canonical_optimizer(spec.optimizer.name, spec.stack.release("transformers"))
    if renamed is not None and not any(f.code == renamed.code for f in spec.findings):
        out.append(renamed)
    out.extend(_quant_findings(spec, layout))
    out.extend(_trainable_findings(spec, layout))
    out.extend(_optimizer_findings(spec))
    out.extend(_upcast_findings(spec, layout))
    groups = all_trainable(layout)
    if groups and all(g.dtype.is_half for g in groups) and ds_mixed_dtype(spec) is None and spec.lora is None:
        out.append(
            Finding(
                "pure-16bit-training",
                Severity.INFO,
                "parameters, gradients and optimizer states are all 16-bit (no fp32 master copy): "
                "memory-lean, but "
                "updates smaller than the 16-bit resolution of a weight are lost",
            )
        )
    return tuple(out)


def _trainable_findings(spec: TrainingSpec, layout: Layout) -> list[Finding]:
    """What peft or the Trainer refuses about what is trained (no LoRA target, quantized full fine-tune,
    fp16 AMP on fp16 weights)."""
    out: list[Finding] = []
    if layout.plan is not None:
        for message, hint in layout.plan.problems:
            out.append(Finding("peft-refuses-config", Severity.ERROR, message, hint))
        if not layout.plan.targets and not layout.plan.saved:
            out.append(
                Finding(
                    "lora-no-targets",
                    Severity.ERROR,
                    "the LoRA target modules match no module of this model (peft raises 'Target modules ... "
                    "not found')",
                    "check --lora_target_modules against the module names, or use all-linear",
                )
            )
    groups = all_trainable(layout)
    if spec.lora is None and spec.freeze is None and spec.quant is not None:
        out.append(
            Finding(
                "quantized-full-finetune",
                Severity.ERROR,
                "a bitsandbytes-quantized model cannot be fully fine-tuned: the Trainer raises 'You cannot "
                "perform "
                "fine-tuning on purely quantized models' (estimated with only the unquantized parameters "
                "trainable)",
                "add LoRA (--use_peft --lora_target_modules all-linear) or drop "
                "--load_in_4bit/--load_in_8bit",
            )
        )
    fp16_trainable = any(g.dtype is Dtype.FLOAT16 for g in groups)
    if (
        fp16_trainable
        and spec.precision.mixed_precision is MixedPrecision.FP16
        and ds_mixed_dtype(spec) is None
    ):
        out.append(
            Finding(
                "fp16-gradscaler",
                Severity.ERROR,
                "fp16 AMP with fp16 trainable parameters: torch's GradScaler raises 'Attempting to unscale "
                "FP16 "
                "gradients'",
                "load the model in float32 (--dtype float32) for --fp16, or use --bf16 with bfloat16 weights",
            )
        )
    return out


def _optimizer_findings(spec: TrainingSpec) -> list[Finding]:
    """Paged optimizers, and what the layer-wise GaLore variants refuse."""
    out: list[Finding] = []
    name, _ = canonical_optimizer(spec.optimizer.name)
    if name.startswith("paged_"):
        out.append(
            Finding(
                "paged-optimizer",
                Severity.INFO,
                f"{name} keeps large optimizer states in CUDA managed memory: outside torch's allocator "
                f"(not in "
                "max_memory_allocated) and evicted to host RAM under memory pressure, at a speed cost",
            )
        )
    if name.endswith("_layerwise") and spec.batch.grad_accum != 1:
        out.append(
            Finding(
                "layerwise-grad-accum",
                Severity.ERROR,
                f"{name} raises 'Layerwise ... does not support gradient accumulation!' "
                f"(gradient_accumulation_steps="
                f"{spec.batch.grad_accum})",
                "set --gradient_accumulation_steps 1 or use the non-layerwise variant",
            )
        )
    if name.endswith("_layerwise") and spec.data_parallel_size > 1:
        out.append(
            Finding(
                "layerwise-distributed",
                Severity.ERROR,
                f"{name}: transformers raises 'Layer-wise ... does not support DDP at this time' for "
                f"multi-GPU runs",
                "use the non-layerwise variant for multi-GPU runs",
            )
        )
    return out


def _quant_findings(spec: TrainingSpec, layout: Layout) -> list[Finding]:
    quant = spec.quant
    if quant is None:
        return []
    out: list[Finding] = []
    total = layout.quant_params + layout.unquantized_params
    left = layout.unquantized_params
    if total and left > layout.quant_params:
        experts = sum(e.numel for e in spec.model.params if e.kind is Kind.FUSED_EXPERTS)
        why = (
            f" — {experts:,} of them are fused 3-D MoE expert tensors, which bitsandbytes does not quantize "
            "(it replaces nn.Linear modules only)"
            if experts
            else ""
        )
        resident = layout.frozen_bytes + total_bytes(layout.trainable)
        out.append(
            Finding(
                "quantization-mostly-skipped",
                Severity.WARNING,
                f"this {quant.bits}-bit config leaves {left:,} of {total:,} parameters ({left / total:.0%}) "
                f"unquantized{why}; they take {format_bytes(resident)} per replica",
                "count the unquantized parameters in the budget; quantized MoE experts need a checkpoint or "
                "kernel "
                "that quantizes 3-D expert tensors",
            )
        )
    if layout.upcast_params:
        out.append(
            Finding(
                "kbit-fp32-upcast",
                Severity.WARNING if layout.upcast_params > total // 10 else Severity.INFO,
                f"prepare_model_for_kbit_training casts {layout.upcast_params:,} non-quantized 16-bit "
                f"parameters "
                f"(embeddings, LM head, norms{', MoE experts' if layout.frozen_experts_bytes else ''}) to "
                f"fp32: "
                f"+{format_bytes(2 * layout.upcast_params)} over keeping them 16-bit ({SOURCE_KBIT})",
            )
        )
    return out


def _upcast_findings(spec: TrainingSpec, layout: Layout) -> list[Finding]:
    """accelerate's fp32 upcast under FSDP mixed precision, when the model was loaded in 16 bits."""
    if not fsdp_fp32_upcast(spec) or not spec.precision.load_dtype.is_half:
        return []
    n = sum(g.numel_each * g.repeat for g in all_trainable(layout))
    if not n:
        return []
    return [
        Finding(
            "fsdp-fp32-upcast",
            Severity.INFO,
            f"accelerate upcasts the {n:,} trainable {spec.precision.load_dtype.value} parameters to fp32 "
            f"before FSDP shards them (mixed_precision={spec.precision.mixed_precision.value}): trainable "
            f"shards, gradients and optimizer states are fp32, as if the model were loaded in float32 "
            f"({SOURCE_UPCAST})",
        )
    ]
