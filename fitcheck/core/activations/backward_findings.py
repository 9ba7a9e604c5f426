"""Whether the during-backward working set of a run is pinned to a trace: the ``backward-not-pinned`` finding
(pure). Split out of ``backward.py``, whose moments it describes."""

from __future__ import annotations

from fitcheck.core.activations.moe_expert_loop import expert_loop_applies
from fitcheck.core.activations.recipe_gaps import trace_fix
from fitcheck.findings import Finding, Severity
from fitcheck.spec import AttnImpl, TrainingSpec


def _moe_moments_traced(spec: TrainingSpec) -> bool:
    """i12moe: Qwen3-MoE and DeepSeek-V3, full or LoRA, 16-bit, SDPA, no checkpointing: the backward moments
    (ParamWrapper's top MoE layer, DeepSeek's attention) are within 0.8 % of traces (benchmarks/moe_mla_vs_trace.py)."""
    return (spec.model.shape.traits.moe_backward_traced and spec.quant is None and spec.freeze is None
            and not spec.activations.checkpointing and spec.activations.attn_implementation is AttnImpl.SDPA
            and spec.precision.load_dtype.is_half and spec.precision.mixed_precision.value == "no")


def _eager_modelled(spec: TrainingSpec) -> bool:
    """Whether a layer's eager softmax backward is a moment of ``backward_moments`` (``eager.eager_moments``;
    not under activation offloading)."""
    from fitcheck.core.activations.eager import eager_moments
    from fitcheck.core.kernels import offload_applies

    return eager_moments(spec) is not None and not offload_applies(spec)


def backward_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """An INFO finding where the during-backward working set is not pinned to a trace for this config."""
    from fitcheck.core.activations.lora_recompute import lora_recompute_applies

    sh = spec.model.shape
    why = ""
    if _moe_moments_traced(spec):
        return ()
    # the MLP backward working set (+2·e·I per token) is pinned by tests/test_backward_phase.py per family
    if not sh.traits.backward_pinned or sh.num_experts:
        why = f"model_type {sh.family!r}"
    elif spec.activations.attn_implementation is AttnImpl.EAGER and not _eager_modelled(spec):
        why = "eager attention (its softmax backward, not the MLP's, sets the layer's working set)"
    elif ((spec.lora is not None or spec.quant is not None) and spec.activations.checkpointing
          and not lora_recompute_applies(spec)):
        # checkpointed LoRA / k-bit QLoRA on the Llama layer: traced moments (activations/lora_recompute.py);
        # without checkpointing no layer is recomputed: the kinds' range rows check it (envelope_ranges.json)
        why = "LoRA/quantized bases (adapter input casts in the recomputed layer)"
    if not why:
        return ()
    # transformers 4.x's Mixtral loop: one expert's tokens at a time (moe_expert_loop.py, measured on one block)
    recipe = "per-expert MoE loop's" if expert_loop_applies(spec) else "Llama-recipe MLP"
    return (
        Finding(
            "backward-not-pinned",
            Severity.INFO,
            f"the peak during backward uses the {recipe} working set; not pinned to a trace for {why}",
            trace_fix(spec, "run `fitcheck estimate --trace` for a measured number"),
        ),
    )
