"""Activations of the 2025 families: what is pinned, and the q/k RMSNorms of Qwen3 / Qwen3-MoE (pure: no torch).

Pinned against fake-tensor traces (tests/test_activations_recent.py; real widths in
benchmarks/families_vs_trace.py): Qwen3 in every mode; Qwen3-MoE for full fine-tuning, and under LoRA on
its fused experts without checkpointing (activations/param_wrapper.py); DeepSeek-V3 without checkpointing
(activations/mla.py, benchmarks/moe_mla_vs_trace.py); Gemma-3 text (q/k norms
with Gemma's fp32 ``(1 + weight)``, four norms per layer as Gemma-2; within 0.73 % at real widths, where the CPU
trace of a sliding-window layer with s > window keeps ~e·(q + 3·kv) B per token more, not modelled); OLMo-2
and gpt-oss, full and LoRA (``fitcheck.core.activations.olmo2_gpt_oss``: full-width q/k norms, post-norms, fp32
norm products, attention sinks, clamped-SwiGLU grouped_mm experts); Qwen3-MoE LoRA and DeepSeek-V3 without
checkpointing or freezing (``param_wrapper``, ``mla``). Not pinned, with a warning finding that points at
``--trace``: Qwen3-MoE LoRA and DeepSeek-V3 under checkpointing or freezing, gpt-oss with LoRA on its fused
experts, Gemma-3 image-text models.

``Qwen3Attention.forward`` (transformers 5.23 models/qwen3/modeling_qwen3.py) runs ``q_norm`` / ``k_norm``
(``Qwen3RMSNorm`` over ``head_dim``) on the q / k projections before rotary. Each norm keeps what any
``*RMSNorm`` keeps (fitcheck.core.activations.decoder ``_norm_saved``) with one ``rsqrt`` per head instead of
per token: the fp32 input 4·w, rsqrt 4 per row, and, for a trained weight, the normalised tensor (2·w when the
activations are 16-bit: a 16-bit model or fp32 weights under autocast; 4·w in plain fp32). The q_proj /
k_proj outputs themselves are no longer kept: rotary reads the norm outputs, counted in their place. Read off
fake-tensor traces (``fitcheck.torch_adapters.tracer``) and pinned by tests/test_activations_recent.py:
6·(q+kv) + 4·(a+kv_heads) bytes per token per layer, bf16 full.
"""

from __future__ import annotations

from fitcheck.core.activations.olmo2_gpt_oss import olmo2_qk_norms
from fitcheck.findings import Finding, Severity
from fitcheck.spec import AttentionKind, ModelShape, NormKind, QkNorm, TrainingSpec


def _gemma_qk(shape: ModelShape) -> bool:
    """Gemma3RMSNorm q/k norms (modeling_gemma3.py) compute in fp32 and scale by (1 + weight.float()): a trained
    weight keeps the fp32 normalised tensor (4·w, not a 16-bit copy), and (1 + weight) is an fp32 (head_dim,)
    tensor per norm."""
    return shape.traits.qk_norm is QkNorm.PER_HEAD and shape.traits.norm_kind is NormKind.RMS_ONE_PLUS


def qk_norm_saved(shape: ModelShape, half_activations: bool, trainable_weight: bool) -> int:
    """Bytes per token per layer the q_norm and k_norm of one attention layer keep.

    Args:
        shape: The model's shape (heads, kv heads, head_dim).
        half_activations: The projections' outputs are 16-bit (16-bit weights, or autocast); otherwise fp32.
        trainable_weight: The norm weights are trained (full fine-tuning): the normalised tensor is kept.

    Returns:
        0 for families without per-head q/k norms; OLMo-2's full-width q/k norms (olmo2_gpt_oss.py).
    """
    if shape.traits.qk_norm is QkNorm.FULL_WIDTH:
        return olmo2_qk_norms(shape, trainable_weight)
    if shape.traits.qk_norm is not QkNorm.PER_HEAD:
        return 0
    total = 0
    for heads in (shape.num_heads, shape.num_kv_heads):
        width = heads * shape.head_dim
        total += 4 * width + 4 * heads
        if trainable_weight:
            total += (2 if half_activations and not _gemma_qk(shape) else 4) * width
    return total


def qk_norm_outside(shape: ModelShape) -> int:
    """Bytes outside the per-token terms: Gemma-3's fp32 ``(1 + weight)`` of each q/k norm, per layer."""
    return 4 * shape.head_dim * 2 * shape.num_layers if _gemma_qk(shape) else 0


def eager_scores(shape: ModelShape, e: int, llama: int) -> int:
    """Bytes per score (per token per key position) the eager attention of one layer keeps.

    gpt-oss has no SDPA path (``GptOssPreTrainedModel._supports_sdpa = False``: the per-head sink logit is
    concatenated to the scores), so eager attention runs; its ``eager_attention_forward`` (modeling_gpt_oss.py)
    takes the softmax in the logits' own dtype (``dtype=combined_logits.dtype``), and only those probabilities
    are kept (``matmul`` with V reads a view of them): e·a, not Llama's fp32 softmax plus its 16-bit cast.

    Args:
        shape: The model's shape.
        e: Element bytes of the attention logits.
        llama: The Llama-recipe value, returned for every other family.
    """
    return e * shape.num_heads if shape.traits.attention is AttentionKind.SINKS else llama




def recent_family_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """Warnings for the 2025 families (or modes) whose activations the formula does not match.

    Returns:
        One ``activations-not-pinned`` warning naming what is not modelled, or nothing.
    """
    gaps = spec.model.shape.traits.gaps  # what each family's recipe was not traced for (fitcheck.families)
    why = gaps.always
    if why is None and gaps.lora_on_experts and _experts_adapted(spec):
        why = gaps.lora_on_experts
    # i12moe: Qwen3-MoE LoRA (peft ParamWrapper, activations/param_wrapper.py) and DeepSeek-V3 (activations/mla.py)
    # are pinned without activation checkpointing or partial freezing, where the layers were traced
    ckpt_or_freeze = spec.activations.checkpointing or spec.freeze is not None
    if why is None and spec.lora is not None and ckpt_or_freeze:
        why = gaps.lora_ckpt_or_freeze
    if why is None and ckpt_or_freeze:
        why = gaps.ckpt_or_freeze
    if why is None:
        return ()
    return (
        Finding(
            "activations-not-pinned",
            Severity.WARNING,
            f"activations of {why} are not modelled: the Llama-style recipe is used and differs from a trace "
            "by more than 2 %",
            "run `fitcheck estimate --trace` to measure the real model's step on fake tensors",
        ),
    )


def _experts_adapted(spec: TrainingSpec) -> bool:
    """Whether LoRA wraps fused MoE expert tensors (peft ``target_parameters``), as decoder._experts_adapted."""
    from fitcheck.core.states import plan_lora
    from fitcheck.spec import Kind

    return spec.lora is not None and any(t.entry.kind is Kind.FUSED_EXPERTS for t in plan_lora(spec).targets)
