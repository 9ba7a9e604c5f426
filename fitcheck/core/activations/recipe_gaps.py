"""Which families (and modes) the activation recipes were not checked for: the ``activations-not-pinned`` warning.

Each family declares its gaps (``ModelShape.traits.gaps``, :mod:`fitcheck.families`); this module turns the ones
that apply to a spec into a finding (pure: no torch).

Pinned against fake-tensor traces (tests/test_activations_recent.py; real widths in
benchmarks/families_vs_trace.py): Qwen3 in every mode; Qwen3-MoE for full fine-tuning, and under LoRA on
its fused experts without checkpointing (activations/param_wrapper.py); DeepSeek-V3 without checkpointing
(activations/mla.py, benchmarks/moe_mla_vs_trace.py); Gemma-3 text (q/k norms
with Gemma's fp32 ``(1 + weight)``, four norms per layer as Gemma-2; within 0.73 % at real widths, where the CPU
trace of a sliding-window layer with s > window keeps ~e·(q + 3·kv) B per token more, not modelled); OLMo-2
and gpt-oss, full and LoRA (full-width q/k norms, post-norms, fp32 norm products: :mod:`.norms`; attention
sinks: :mod:`.attention_variants`; clamped-SwiGLU grouped_mm experts: :mod:`.moe_grouped_mm`); Qwen3-MoE LoRA
and DeepSeek-V3 without checkpointing or freezing (``param_wrapper``, ``mla``). Not pinned, with a warning
finding that points at ``--trace``: Qwen3-MoE LoRA and DeepSeek-V3 under checkpointing or freezing, gpt-oss
with LoRA on its fused experts, Gemma-3 image-text models.
"""

from __future__ import annotations

from fitcheck.findings import Finding, Severity
from fitcheck.spec import AttnImpl, TrainingSpec


def recipe_gap_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """Warnings for the families (or modes) whose activations the formula does not match.

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
            trace_fix(spec, "run `fitcheck estimate --trace` to measure the real model's step on fake tensors"),
        ),
    )


def trace_fix(spec: TrainingSpec, fix: str) -> str:
    """A "run --trace" fix, or what to run instead where ``--trace`` refuses the run: the tracer feeds images to
    the vision-language families whose tower was traced (``traits.vision_pinned``: Qwen2.5-VL,
    torch_adapters/trace_inputs_vlm.py) only; for another family (Gemma-3) it traces the text step."""
    sh = spec.model.shape
    if sh.task == "image-text-to-text" and sh.image_tokens > 0 and not sh.traits.vision_pinned:
        return ("`--trace` feeds images to Qwen2.5-VL only and refuses this run; `fitcheck estimate --trace "
                "--image_tokens 0` measures the text step without images (the vision tower's activations are "
                "then not counted)")
    return fix


def _experts_adapted(spec: TrainingSpec) -> bool:
    """Whether LoRA wraps fused MoE expert tensors (peft ``target_parameters``), as decoder._experts_adapted."""
    from fitcheck.core.states import plan_lora
    from fitcheck.spec import Kind

    return spec.lora is not None and any(t.entry.kind is Kind.FUSED_EXPERTS for t in plan_lora(spec).targets)


def sliding_window_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """The sliding-window mask under SDPA at a sequence of at least the window: not modelled.

    transformers 5.23 ``masking_utils._ignore_causal_mask_sdpa`` skips the mask (SDPA's ``is_causal``) only while
    ``kv_length < local_attention_size``; from the window on, ``sdpa_mask`` materialises the banded boolean mask
    and every layer's SDPA runs with it (the CPU flash kernel with an ``attn_mask``), which the formula does not
    count. Measured against fake-tensor traces (``benchmarks/envelope_ranges.py``, Mistral-7B-v0.1,
    ``sliding_window`` 4096): exact at 512, full fine-tune with checkpointing -15.6 % during backward at 1 x 4096
    and -30.1 % at 1 x 32768, LoRA without checkpointing -14.5 % at 32768; Mistral-Small-24B (no window) exact.
    """
    sh = spec.model.shape
    window = sh.sliding_window
    if window is None or not sh.traits.banded_sliding_mask or spec.batch.seq_len < window:
        return ()
    if spec.activations.attn_implementation is not AttnImpl.SDPA or sh.traits.eager_only:
        return ()
    return (
        Finding(
            "activations-not-pinned",
            Severity.WARNING,
            f"sliding-window attention ({window} tokens) at sequence {spec.batch.seq_len} >= the window: "
            "transformers builds the banded mask and SDPA runs with it; that mask and its backward are not "
            "modelled (Mistral-7B-v0.1: -15.6 % of the activations during backward at 1 x 4096)",
            trace_fix(spec, "run `fitcheck estimate --trace` to measure the real model's step on fake tensors"),
        ),
    )
