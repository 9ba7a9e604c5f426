"""What peft's ``lora.ParamWrapper`` keeps for backward on fused MoE experts and routers (pure: no torch).

transformers 5 stores MoE experts as 3-D parameters (``gate_up_proj`` (E, 2I, h), ``down_proj`` (E, h, I));
peft 0.21.2 rewrites ``all-linear`` (and v4 expert names) into ``target_parameters`` on them and on the router
weight (``utils/transformers_weight_conversion.py`` ``_convert_peft_config_moe``; which targets, with which rank:
``fitcheck.core.states.plan_lora``). Read in peft 0.21.2 ``tuners/lora/layer.py`` and transformers 5.23
``integrations/moe.py``, and pinned by fake-tensor traces (tests/test_activations_moe_mla.py;
benchmarks/moe_mla_vs_trace.py):

- ``ParamWrapper.forward`` runs the experts inside ``_activate_lora``, which registers a parametrization of the
  wrapped parameter. With one adapter on a 3-D (E > 1) non-fp8 parameter it is ``_LoraFactorsProxy``:
  ``torch.baddbmm(W, lhs, rhs, alpha=scaling)`` — a new tensor the size of the whole expert stack, in the
  parameter's dtype (layer.py ``_LoraFactorsProxy.forward``). The experts' ``grouped_mm`` saves its weight for
  backward (integrations/moe.py ``_grouped_mm``: ``torch.nn.functional.grouped_mm``, or the fallback whose
  ``_grouped_mm_fallback_setup_context`` calls ``ctx.save_for_backward(input, weight)``): the merged stack
  stays alive until backward, E·d1·d2 elements per wrapped parameter per MoE layer, whatever the tokens.
- ``get_delta_factors`` reshapes ``lora_A`` / ``lora_B`` (views) and casts them with ``.to(param.dtype)``;
  the adapters are fp32 (``get_peft_model(autocast_adapter_dtype=True)``), so on a 16-bit model both factors
  are new 16-bit tensors, E·r·(d1 + d2) elements, kept by ``baddbmm`` for the gradients of lhs and rhs.
- A 2-D parameter (the router, E = 1) goes through ``get_delta_weight`` and ``_LoraParameterProxy``:
  ``W + delta`` in the parameter's dtype, kept by the router's ``F.linear`` (Qwen3-MoE, Mixtral: e·E·h per
  layer). DeepSeek-V3's router casts the merged weight to fp32 first (``weight.type(torch.float32)``,
  modeling_deepseek_v3.py ``DeepseekV3TopkRouter.forward``): that fp32 copy is what is kept, in full
  fine-tuning too (fitcheck.core.activations.mla), so nothing is added here for it.

Under activation checkpointing the merged tensors of a checkpointed layer are not kept between forward and
backward; that case is not traced here and not in the checked envelope.
"""

from __future__ import annotations

from fitcheck.spec import Kind, MoeLayout, TrainingSpec

# DeepseekV3TopkRouter: weight.type(torch.float32)
_ROUTER_CASTS_TO_FP32 = MoeLayout.SHARED_FP32_ROUTER


def wrapped_router(spec: TrainingSpec) -> bool:
    """Whether peft wraps the MoE router weight (``mlp.gate.weight``) with a ParamWrapper."""
    from fitcheck.core.states import plan_lora

    if spec.lora is None:
        return False
    return any(t.via_param_wrapper and t.entry.kind is not Kind.FUSED_EXPERTS for t in plan_lora(spec).targets)


def param_wrapper_saved(spec: TrainingSpec) -> int:
    """Bytes kept until backward by every ParamWrapper of the model (not per token; see the module docstring).

    Args:
        spec: The training spec (LoRA with ``target_parameters``, explicit or rewritten by peft).

    Returns:
        0 without LoRA, under activation checkpointing (not modelled), or without wrapped parameters.
    """
    from fitcheck.core.states import plan_lora

    if spec.lora is None or spec.activations.checkpointing:
        return 0
    param_bytes = spec.precision.load_dtype.nbytes
    # peft autocast_adapter_dtype: fp32 adapters, cast to the parameter dtype by get_delta_factors
    casts = param_bytes < 4
    total = 0
    for t in plan_lora(spec).targets:
        if not t.via_param_wrapper:
            continue
        e = t.entry
        if e.kind is Kind.FUSED_EXPERTS and len(e.shape) == 3:
            experts, d1, d2 = e.shape
            each = param_bytes * experts * d1 * d2  # baddbmm(W, lhs, rhs): the merged expert stack
            if casts:
                each += param_bytes * experts * t.rank * (d1 + d2)  # lhs / rhs .to(param.dtype)
        elif spec.model.shape.traits.moe is _ROUTER_CASTS_TO_FP32:
            each = 0  # the fp32 copy of W + delta is the one kept (activations/mla.py)
        else:
            each = param_bytes * e.numel_each  # W + delta (_LoraParameterProxy), kept by F.linear
        total += each * t.layers
    return total


def param_wrapper_backward(spec: TrainingSpec, e: int, r: int) -> int:
    """Bytes the top MoE layer's backward adds to everything saved, at its worst moment (0 without wrappers).

    Traced (Qwen3-30B-A3B LoRA, 2 layers): the peak during backward is the experts' down projection backward
    of the top layer: its ``grouped_mm`` produces the gradient of the whole merged ``down_proj`` stack
    (E·h·I in the parameter's dtype: integrations/moe.py ``_grouped_mm_fallback_bwd`` /
    ``grouped_mm``'s autograd: ``grad_weight`` like ``weight``), next to the gradient of the routed outputs
    (k·h per token), the down projection's input gradient (k·I per token) and the residual-stream gradient
    (h per token). The gate_up backward that follows frees the merged down stack first, so it is no higher.
    Where the stack is small against the tokens (tiny widths), the moment just before it is higher.

    Args:
        spec: The training spec.
        e: Element bytes of activations.
        r: Element bytes of the residual stream.
    """
    from fitcheck.core.states import plan_lora

    if spec.lora is None or spec.activations.checkpointing:
        return 0
    downs = [t for t in plan_lora(spec).targets
             if t.via_param_wrapper and t.entry.kind is Kind.FUSED_EXPERTS and t.entry.name.endswith("down_proj")]
    if not downs:
        return 0
    sh = spec.model.shape
    bs = spec.batch.micro_batch * spec.batch.seq_len
    k, h, inter = sh.experts_per_token, sh.hidden_size, sh.intermediate_size
    stack = spec.precision.load_dtype.nbytes * downs[0].entry.numel_each
    down = stack + (k * e * (h + inter) + r * h) * bs
    # just before: the backward of ``proj_out * sample_weights_g`` and of ``weighted_out[inv_perm]``
    # (integrations/moe.py grouped_mm_experts_forward): index_put and two products of (k·tokens, h) in the routing
    # weights' dtype (fp32 for DeepSeek-V3, whose router returns fp32 weights; traced at tiny widths), the
    # product's cast back to the activations' dtype, and two residual-stream gradients
    w = 4 if sh.traits.moe is _ROUTER_CASTS_TO_FP32 else e
    weighting = (3 * w * k * h + (e * k * h if w != e else 0) + 2 * e * h) * bs
    return max(down, weighting)
