"""Activation, logits/loss and autocast-cache memory of one training step, per phase (pure: no torch).

Every constant below was read off a fake-tensor trace of the real transformers 5.23 model
(``fitcheck.torch_adapters.tracer``; per-op listings of the tensors alive at the end of forward, 2-layer minus
1-layer) and is pinned by ``tests/test_activations_vs_trace.py``. Notation: b micro-batch, s sequence, h hidden,
kv = num_kv_heads·head_dim, q = num_heads·head_dim, I intermediate, a heads, V vocab, r LoRA rank, k top-k.
Bytes per token per layer, HF Llama bf16 SDPA (trace ``llama bf16 sdpa``): 20h + 4kv + 8I + 4a + 8, not
Korthikanti's 34h (design note 04).

Phase semantics (``fitcheck.report.Phase``), to be summed with ``fitcheck.core.states.model_states``:
FORWARD_END = saved activations + the peak of the loss computation (logits, fp32 upcast, log-softmax);
BACKWARD_START = saved activations + log-softmax output, its gradient and the logits gradient (no parameter
gradient exists yet); BACKWARD = what is left besides every gradient at the end of backward (the gradient of the
embedding output), or one recomputed layer under checkpointing; OPTIMIZER_STEP = the input ids only.
"""

from __future__ import annotations

import math

from fitcheck.core.activations.activation_mode import ActivationMode, activation_mode
from fitcheck.core.activations.backward import (
    BackwardInputs,
    backward_moments,
    backward_transient,
    grads_unmade,
)
from fitcheck.core.activations.backward_findings import backward_findings
from fitcheck.core.activations.backward_grads import casts_after_attention
from fitcheck.core.activations.bnb_kept_inputs import (
    inputs_kept,
    kept_first_layer_less,
    kept_layer_extra,
    kept_layer_inputs,
    kept_through_checkpoint,
    old_bnb_4bit,
)
from fitcheck.core.activations.cuda import cuda_gap_findings
from fitcheck.core.activations.dora import (
    DoraMode,
    RecomputeInputs,
    dora_phases,
    dora_recompute_excess,
    lora_extras_unpinned,
)
from fitcheck.core.activations.eager import eager_moments
from fitcheck.core.activations.embedding import scaled_embedding_leaf
from fitcheck.core.activations.freeze import frozen_layers
from fitcheck.core.activations.fsdp1_reentrant import held_input_grads
from fitcheck.core.activations.heads import (
    bert_layer_alias,
)
from fitcheck.core.activations.int8 import SOURCE as SOURCE_INT8
from fitcheck.core.activations.int8 import (
    int8_checkpointed_inputs,
    int8_ctx_through_checkpoint,
    int8_formula_applies,
    int8_forward_temporary,
    int8_layer_extra,
    int8_recompute_dequantizes_16bit,
)
from fitcheck.core.activations.layer_saved import (
    _ATTN_LINEARS,
    _TRACE,
    _attn_impl,
    _mla_attention_moment,
    _mla_outside,
    _norm_saved,
    _outside_saved,
    layer_saved_per_token,
)
from fitcheck.core.activations.layernorm_outside import (
    layernorm_findings_text,
    layernorm_top_residual,
)
from fitcheck.core.activations.logits import head_backward_logits, loss_logits
from fitcheck.core.activations.lora_recompute import (
    dora_recompute_applies,
    layer_grads,
    lora_recompute_applies,
    top_layer_forward_tokens,
)
from fitcheck.core.activations.norms import (
    embedding_cast_cached,
)
from fitcheck.core.activations.qlora import (
    four_bit_lora,
    kbit_fp32_lora,
    lora_layer_params,
    qlora_backward_working_set,
    qlora_cache_after_forward,
    qlora_formula_applies,
)
from fitcheck.core.activations.qlora16 import qlora16_applies, qlora16_backward_working_set
from fitcheck.core.activations.qlora_base_mlp import bare_mlp_backward
from fitcheck.core.activations.recipe_gaps import recipe_gap_findings, sliding_window_findings
from fitcheck.core.activations.vision import vision_components, vision_findings
from fitcheck.core.kernels import (
    activation_view,
    fsdp_adapters_16bit,
    fused_loss,
    lever_findings,
    liger_applies,
    offload_applies,
    offload_split,
)
from fitcheck.core.trainers import step_runs_fused_head
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import AttnImpl, DeviceType, LayerRecipe, NormKind, TrainingSpec


def activation_components(spec: TrainingSpec, fsdp_moments: bool = True) -> tuple[Component, ...]:
    """Saved activations, logits/loss tensors and autocast weight caches of one step, per phase.

    Args:
        spec: The training spec.
        fsdp_moments: ``backward.backward_moments``' flag (False: an FSDP run's backward moments as the plain
            run's).

    Returns:
        Components ``activations.saved``, ``activations.attention_scores`` (eager s² term),
        ``activations.autocast_weight_cache``, ``logits.forward`` / ``logits.backward`` and ``inputs``.
    """
    spec = bert_layer_alias(spec)  # RoBERTa-like encoders run BERT's layer (activations/heads.py)
    sh = spec.model.shape
    spec = activation_view(spec)  # DeepSpeed fp16/bf16 runs a 16-bit module (kernels/module_cast.py)
    m = activation_mode(spec)
    b, s, layers = spec.batch.micro_batch, spec.batch.seq_len, sh.num_layers
    per_token, s2 = layer_saved_per_token(spec)
    layer = per_token * b * s
    scores = s2 * b * s * s
    act = spec.activations
    n_ckpt = 0
    if act.checkpointing:
        n_ckpt = math.ceil(layers / max(1, act.checkpoint_every_n_layers))
    kept = (layers - n_ckpt) * (layer + scores) + n_ckpt * m.r * sh.hidden_size * b * s
    first_less, norm_less = _promoted_first_less(spec, m, n_ckpt) if m.embed16 else (0, 0)
    first_less, norm_less = first_less * b * s, norm_less * b * s
    kept -= first_less
    # fp32 residual past layer 0 (layernorm_blocks.BlockCtx.res); only where it is wider than the checkpoint's element
    # (a k-bit run's checkpoints are already m.r wide: prepare_model_for_kbit_training's fp32 norms)
    if n_ckpt > 1 and sh.traits.recipe.layernorm_block and layernorm_top_residual(spec) > m.r:
        kept += (n_ckpt - 1) * (layernorm_top_residual(spec) - m.r) * sh.hidden_size * b * s
    if n_ckpt and int8_ctx_through_checkpoint(spec):  # MatMul8bitFp/Lt keep ctx.A through checkpointing (int8.py)
        kept += n_ckpt * int8_checkpointed_inputs(spec) * b * s
    if n_ckpt and kept_through_checkpoint(spec):  # bitsandbytes <= 0.43.1: ctx.tensors = (A, B) (bnb_kept_inputs.py)
        kept += (n_ckpt * kept_layer_inputs(spec) - kept_first_layer_less(spec, all_kept=True)) * b * s
    frozen = frozen_layers(spec)
    layers_saved = -1
    if frozen is not None:  # partial fine-tune by layers (freeze.py)
        f_token, f_s2 = layer_saved_per_token(spec, trainable=False)
        if act.checkpointing:  # a checkpointed layer keeps its input only if a gradient flows through it
            kept = (layers - frozen.no_grad) * m.r * sh.hidden_size * b * s
        else:
            kept = frozen.trained * (layer + scores) + frozen.frozen_grad * (f_token * b * s + f_s2 * b * s * s)
            layers_saved = kept
    elif sh.traits.recipe is LayerRecipe.LATENT_MOE and not act.checkpointing:
        layers_saved = kept + _mla_outside(spec, m)  # dense and MoE layers differ (activations/mla.py)
    kept += _outside_saved(spec)
    fwd_logits, bwd_logits = loss_logits(spec)
    end = m.r * sh.hidden_size * b * s if (spec.lora is None or act.checkpointing) else 0
    end += scaled_embedding_leaf(spec, m.r)  # Granite: the leaf's gradient meets the scaled copy's (embedding.py)
    host = 0
    if offload_applies(spec):  # TRL activation offloading: saved tensors in pinned host memory (kernels/offloading.py)
        head_in = m.r * sh.hidden_size * b * s if spec.lora is None and spec.quant is None and not m.autocast else 0
        device_kept, host = offload_split(spec, kept, head_in, m.e)
        kept = device_kept
    # worst moment during backward besides every gradient (activations_backward.py, tests/test_backward_phase.py)
    int8_ckpt = int8_checkpointed_inputs(spec) if int8_ctx_through_checkpoint(spec) else 0
    int8_ckpt += kept_layer_inputs(spec) if kept_through_checkpoint(spec) else 0  # bnb <= 0.43.1 (bnb_kept_inputs.py)
    ckpt_input = (m.r * sh.hidden_size + int8_ckpt) * b * s
    recomputed = layer
    if n_ckpt and int8_ctx_through_checkpoint(spec):  # the recomputed layer keeps no ctx.A-only input (int8.py)
        recomputed -= int8_layer_extra(spec, _attn_impl(spec) is AttnImpl.EAGER, ctx_only=True) * b * s
    if n_ckpt and kept_through_checkpoint(spec):  # the recomputed nodes die at once (bnb_kept_inputs.py)
        recomputed -= kept_layer_extra(spec) * b * s
    eager = None if host else eager_moments(spec)  # eager attention's worst ops (eager.py)
    eager_kw = {} if eager is None else {"eager_backward": eager.backward, "eager_made": eager.made,
                                         "ckpt_mask": eager.mask}
    bq = BackwardInputs(recomputed + scores, kept, ckpt_input if n_ckpt else 0, n_ckpt, m.e, m.r,
                        m.autocast, m.half_model, end, layers_saved, offloaded=bool(host), promoted=m.embed16,
                        first_less=first_less, first_norm_less=norm_less,
                        attention_moment=_mla_attention_moment(spec, m, layers_saved), **_int8_backward(spec, b * s),
                        **eager_kw)
    # TRL's fused LM head (fitcheck.core.trainers) runs its whole backward before any other gradient exists
    # (Phase.BACKWARD_START): no vocabulary-sized gradient is left for the head moment of this phase
    # (which trainers: the registry's fused-head column, fitcheck.core.trainers.registry)
    head = 0 if step_runs_fused_head(spec) else head_backward_logits(spec, m)
    recompute, moment = backward_transient(spec, bq, head, fsdp_moments)
    # FSDP1 + reentrant checkpointing on transformers < 4.52: at the bottom layer every checkpoint is still held
    # and so is each layer's input gradient (fsdp1_reentrant.py; 0 elsewhere): the k-bit moments below are there
    held = held_input_grads(spec, 0, ckpt_input) if n_ckpt else 0
    recomputed_moment = "bottom recomputed layer" if held else "first recomputed layer"
    if n_ckpt and (qlora_formula_applies(spec) or qlora16_applies(spec)) and not lora_recompute_applies(spec):
        # peak in the first recomputed layer: every checkpoint still held (qlora.py; 16-bit working set: qlora16.py),
        # unless the LM head's backward is worse (k-bit prep's fp32 head: autocast's saved 16-bit cast of it)
        ws = qlora_backward_working_set(spec) if qlora_formula_applies(spec) else qlora16_backward_working_set(spec)
        ws *= b * s
        bare = bare_mlp_backward(spec)  # no adapter on the MLP (peft's default targets): qlora_base_mlp.py
        ws = ws if bare is None else bare
        if eager is not None and eager.backward > ws:  # the layer's eager softmax backward (eager.py)
            ws = eager.backward
        if moment != "head" or kept + recomputed + scores + ws + held >= end + recompute:
            end, recompute, moment = kept, recomputed + scores + ws + held, recomputed_moment
    elif n_ckpt and int8_formula_applies(spec) and moment != "embedding":
        # 8-bit: the QLoRA rule (its MLP backward runs the same fp32 input gradient) on the recomputed layer
        # without its ctx.A-only inputs; every checkpoint and ctx.A still held (differential check, int8 cells)
        first = kept + bq.layer + qlora_backward_working_set(spec) * b * s + held
        # the model states count every gradient; by then only this top layer's down_proj adapter made its own
        # (backward.py's 8-bit moments; a later micro-step holds them all: grads_unmade 0). Not under CPU
        # autocast, whose recompute dequantizes each MLP weight with F.linear's 16-bit casts (int8.py): that
        # moment is not modelled, and these moments were range-checked counting every gradient
        # (benchmarks/envelope_ranges.py qwen2/gemma int8 ckpt autocast; Llama-2-7b 1 x 576: -7.6 % without them)
        if not int8_recompute_dequantizes_16bit(spec):
            first -= max(0, grads_unmade(spec) - layer_grads(spec)[1])
        if first >= recompute + end:
            end, recompute, moment = kept, first - kept, recomputed_moment
    ids = b * s * 8
    detail = f"{per_token} B/token/layer x {b}x{s} tokens x {layers - n_ckpt} layers"
    fused = fused_loss(spec, act_bytes=m.e, residual_bytes=m.r, autocast=m.autocast)
    comps = [
        Component(
            "activations.saved",
            Category.ACTIVATIONS,
            Location.DEVICE,
            {Phase.FORWARD_END: kept, Phase.BACKWARD_START: kept, Phase.BACKWARD: end + recompute},
            _TRACE + ("; Liger-Kernel 0.8.5 kernels (fitcheck/core/kernels/liger.py)" if liger_applies(spec) else ""),
            detail + (f" + {n_ckpt} checkpointed layer inputs" if n_ckpt else "")
            + (f"; during backward: worst at the {moment}" if moment else "")
            + ("; offloaded to host except the LM head input and 5 in-flight tensors" if host else ""),
        ),
        Component(
            "logits.loss",
            Category.LOGITS,
            Location.DEVICE,
            {Phase.FORWARD_END: fwd_logits, Phase.BACKWARD_START: bwd_logits},
            "library source (fitcheck/core/kernels)" if fused is not None
            else _TRACE + "; transformers loss_utils.ForCausalLMLoss upcasts logits to fp32",
            fused.detail if fused is not None
            else f"{b}x{s}x{sh.vocab_size} logits: bf16/fp32 logits, fp32 upcast, log-softmax; its gradient pair",
        ),
        Component.persistent("inputs.ids", Category.ACTIVATIONS, ids, _TRACE, "input ids int64"),
    ]
    dequantized = int8_forward_temporary(spec) if int8_formula_applies(spec) else 0
    top_mlp = top_layer_forward_tokens(spec) * b * s  # fp32 LoRA + checkpointing: up_proj's sum (lora_recompute.py)
    if top_mlp and eager is not None:  # its MLP runs with the eager attention weights still held (eager.py)
        top_mlp += eager.weights
    top_attn = eager.forward if eager is not None else 0  # the top layer's eager softmax (eager.py)
    if top_attn and m.autocast and spec.lora is None and spec.quant is None and spec.freeze is None:
        # full fine-tune under autocast: the cache counted at the end of forward holds every layer's casts, but
        # at the top layer's softmax its o_proj and MLP weights are not cast yet (autocast_mode.cpp cached_cast
        # casts at the op). Probe Mistral-7B full eager autocast ckpt 1 x 2304 (seed 2204): +2.29 % without it
        top_attn -= casts_after_attention(spec)
    if max(top_mlp, top_attn) > fwd_logits:
        attn_top = top_attn > top_mlp
        comps.append(Component(
            "temporaries.top_layer_forward", Category.TEMPORARIES, Location.DEVICE,
            {Phase.FORWARD_END: max(top_mlp, top_attn) - fwd_logits},
            _TRACE + ("; transformers 5.23 eager_attention_forward" if attn_top
                      else "; peft 0.21.2 tuners/lora/layer.py Linear.forward"),
            "the top layer's eager attention softmax (s² scores), above the logits" if attn_top
            else "the top checkpointed layer's no-grad MLP forward (up_proj's LoRA sum), above the logits",
        ))
    if dequantized > fwd_logits:  # the forward peak inside the largest 8-bit linear (activations/int8.py)
        comps.append(Component(
            "temporaries.int8_dequantized_weight", Category.TEMPORARIES, Location.DEVICE,
            {Phase.FORWARD_END: dequantized - fwd_logits}, SOURCE_INT8 + "; MatMul8bitFp.forward: CB.to(A.dtype)",
            "the largest 8-bit weight dequantized for F.linear, above the logits of the end of forward",
        ))
    if host:
        comps.append(Component(
            "activations.offloaded", Category.ACTIVATIONS, Location.HOST,
            {Phase.FORWARD_END: host, Phase.BACKWARD_START: host},
            "trl 1.16 models/activation_offloading.py OffloadActivations (pinned host copies)",
            "saved activations offloaded by TRL activation_offloading",
        ))
    if spec.lora is not None and spec.lora.use_dora and not spec.quant:
        comps.append(_dora_component(spec, m, layers - n_ckpt, fwd_logits, (bq, head, end + recompute)))
    comps.extend(vision_components(spec, bq, head))  # image-text-to-text (activations/vision.py)
    # LoRA over FSDP's 16-bit copies: no fp32 adapter to cast (kernels.fsdp_adapters_16bit)
    if m.autocast or (m.amp and spec.lora is not None and not fsdp_adapters_16bit(spec)):
        cache, cache_bwd = _autocast_cache_phases(spec, m)
        cache += embedding_cast_cached(spec, m.autocast)  # OLMo-2 + LoRA + checkpointing (norms.py)
        comps.append(
            Component(
                "activations.autocast_weight_cache",
                Category.ACTIVATIONS,
                Location.DEVICE,
                {Phase.FORWARD_END: cache, Phase.BACKWARD_START: cache_bwd},
                _TRACE + "; torch autocast caches 16-bit casts of fp32 leaf weights until backward",
                "+2 B per layer weight cast to 16-bit under autocast",
            )
        )
    return tuple(comps)


def _promoted_first_less(spec: TrainingSpec, m: ActivationMode, n_ckpt: int) -> tuple[int, int]:
    """Bytes per token the bottom layer keeps less than the fp32-residual layers above it, for a 16-bit embedding
    output below an fp32 residual (``ActivationMode.embed16``: 16-bit weights under the other 16-bit autocast, or
    TRL's bf16 embedding over a k-bit prepared model), and what its first norm keeps less for a trained weight:
    (saved less, norm less).

    Checkpointed, its input is the 16-bit embedding output, (r - 2)·h less. Its first norm copies that input to
    fp32 (an fp32 residual is saved by the norm itself) and, for a trained weight, keeps the 16-bit normalised
    input (LlamaRMSNorm.forward ``self.weight * hidden_states.to(input_dtype)``), not the fp32 product: 2·h less
    (Gemma / OLMo-2 multiply the fp32 product, ``NormKind``: nothing less). Not checkpointed, that 2·h is all it
    keeps less (its fp32 copy stands in for the fp32 residual the norms above save). Fake-tensor traces, Llama-2,
    Mistral, Qwen2, Gemma at width 256, 2 x 256 and 1 x 512, 4 layers, float16 under bf16 and bfloat16 under fp16:
    the float32 config's bytes less this and the 16-bit rotary tables (LoRA, full fine-tune; checkpointed or
    not). TRL's cast: ``tests/test_trl_old_casts.py`` (QLoRA, checkpointed or not, against the trace)."""
    h = spec.model.shape.hidden_size
    trained = spec.lora is None and spec.quant is None and spec.freeze is None
    norm = 2 * h if trained and spec.model.shape.traits.norm_kind is NormKind.RMS else 0
    return ((m.r - 2) * h if n_ckpt else norm), norm


def _int8_backward(spec: TrainingSpec, tokens: int) -> dict[str, int]:
    """8-bit LoRA: the ctx.A inputs each layer keeps after its backward (the graph lives until the step ends,
    activations/int8.py). The dequantized weight of the backward matmul never sets the peak in the traced grid
    (benchmarks/formula_vs_trace.py int8 cells): it is not added."""
    if old_bnb_4bit(spec) or inputs_kept(spec):  # bnb <= 0.43.1, or int8 under DeepSpeed: every linear's input
        through = not spec.activations.checkpointing or kept_through_checkpoint(spec)
        return {"retained": kept_layer_inputs(spec) * tokens} if through else {}
    if not int8_formula_applies(spec) or (spec.activations.checkpointing and not int8_ctx_through_checkpoint(spec)):
        return {}
    return {"retained": int8_checkpointed_inputs(spec) * tokens}


def _dora_component(spec: TrainingSpec, m: ActivationMode, kept_layers: int, fwd_logits: int,
                    bwd: tuple[BackwardInputs, int, int]) -> Component:
    """DoRA's norm vectors and weight copies, and its per-forward weight-norm transient (activations_lora.py)."""
    sh = spec.model.shape
    dm = DoraMode(m.e, m.r, m.half_model, m.amp)
    fixed, excess = dora_phases(spec, dm, _norm_saved(sh, m, False), kept_layers, fwd_logits,
                                dora_recompute_applies(spec))
    bq, head, chosen = bwd
    during = fixed
    if not kept_layers:
        from fitcheck.core.activations import lora_recompute as lr
        from fitcheck.core.activations.backward import grads_unmade

        stop = lr.recompute_tokens(spec, m.e, m.r, m.half_model) if lr.dora_recompute_applies(spec) else None
        rec_in = RecomputeInputs(stop, grads_unmade(spec), lr.layer_grads(spec)[0])
        during = dora_recompute_excess(spec, dm, backward_moments(spec, bq, head), chosen, rec_in)
    return Component(
        "activations.dora",
        Category.ACTIVATIONS,
        Location.DEVICE,
        {Phase.FORWARD_END: fixed + excess, Phase.BACKWARD_START: fixed, Phase.BACKWARD: during},
        _TRACE + "; peft tuners/lora/dora.py DoraLinearLayer.forward / get_weight_norm",
        "DoRA weight norms (+ weight copies with dropout); forward: W + s·BA built in fp32 per wrapped linear",
    )


def _autocast_cache_phases(spec: TrainingSpec, m: ActivationMode) -> tuple[int, int]:
    """16-bit weight casts alive at the end of forward and at the start of backward."""
    from fitcheck.core.states import plan_lora
    from fitcheck.spec import Kind

    cache = _autocast_cache(spec)
    if spec.lora is None and spec.quant is None and spec.activations.checkpointing:
        # full fine-tune: leaving autocast clears its cache; a cast survives only where an autograd node saved
        # it, and a checkpointed layer saves nothing (differential check "llama full ckpt autocast", Llama-3-8B:
        # 13 GiB of casts at the end of forward, none at the start of backward)
        if m.promoted:  # 16-bit weights: autocast caches only casts of fp32 leaves (autocast_mode.cpp cached_cast:
            return 0, 0  # arg.scalar_type() == at::kFloat); float16 config, trace: no cast left at end of forward
        frozen = frozen_layers(spec)
        if frozen is not None:
            # autocast caches only casts of leaves that require grad (aten/src/ATen/autocast_mode.cpp
            # cached_cast: arg.requires_grad() && arg.is_leaf()): frozen layers' casts die with their op
            cache = cache * frozen.trained // max(1, spec.model.shape.num_layers)
        return cache, qlora_cache_after_forward(spec, cache, any_base=True)
    # a pre-quantized GPTQ/AWQ/FP8 base is a frozen 16-bit base to autocast (its matmuls are the kernels' own)
    if spec.lora is None or (spec.quant is not None and spec.quant.method == "bitsandbytes"):
        # an 8-bit base: the same rule as 4-bit (trace "llama int8 ckpt autocast": no cast left at backward start)
        return cache, qlora_cache_after_forward(spec, cache, any_base=int8_formula_applies(spec))
    # LoRA: autocast caches the casts of the fp32 adapters (leaves needing a gradient) until it exits; the frozen
    # fp32 base weights' casts are not cached, only saved by F.linear; a checkpointed layer saves neither
    # (trace "llama lora autocast": _to_copy (r, h) bf16 per adapter, (out, in) bf16 per base linear)
    magnitude = sum(t.magnitude * t.layers for t in plan_lora(spec).targets if t.entry.per_layer)
    adapters = 2 * (lora_layer_params(spec) - magnitude)  # DoRA's magnitude feeds a div: never cast (trace)
    base = 0 if m.half_model else cache
    layers = spec.model.shape.num_layers
    act = spec.activations
    keep = layers - math.ceil(layers / max(1, act.checkpoint_every_n_layers)) if act.checkpointing else layers
    fwd, bwd = adapters + base * keep // layers, (adapters + base) * keep // layers
    if not act.checkpointing:
        # layer 0's q/k/v input needs no gradient: F.linear saves neither their base casts nor their lora_A
        # casts, which die when autocast clears its cache (trace "llama lora autocast", 1 layer)
        first = {*_ATTN_LINEARS, "qkv_proj"}
        base0 = 0 if m.half_model else 2 * sum(
            p.numel_each for p in spec.model.params if p.per_layer and p.module in first and p.kind is Kind.LINEAR
        )
        lora_a0 = 2 * sum(math.prod(t.lora_a_shape) for t in plan_lora(spec).targets
                          if t.entry.per_layer and t.entry.module in first)
        fwd, bwd = fwd - base0, bwd - base0 - lora_a0
    return fwd, bwd


def _autocast_cache(spec: TrainingSpec) -> int:
    """bf16 copies of every layer linear weight made by autocast, kept for backward (+2 B/param)."""
    from fitcheck.spec import Kind

    if four_bit_lora(spec):  # 4-bit matmuls are no autocast ops: only the LoRA weights are cached
        from fitcheck.core.states import trl_bf16_trainables

        # TRL's bf16 adapters: a cast to their own dtype is a no-op, nothing cached (core/states/trl_adapters.py)
        return 0 if trl_bf16_trainables(spec) else 2 * lora_layer_params(spec)
    if spec.quant is not None and spec.quant.bits == 8 and spec.lora is not None:
        # bitsandbytes 0.50.2 nn/modules.py Linear8bitLt.forward -> bnb.matmul -> MatMul8bitLt (autograd/
        # _functions.py): a custom Function running int8 ops, no autocast op: int8 weights are never cast
        return 2 * lora_layer_params(spec)
    kinds = (Kind.LINEAR, Kind.FUSED_EXPERTS)
    layer_linear = sum(p.numel for p in spec.model.params if p.per_layer and p.kind in kinds)
    return 2 * layer_linear


def activation_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """What the user should know about activations (unpinned family, forced eager, CPU-only paths)."""
    spec = activation_view(bert_layer_alias(spec))
    out: list[Finding] = list(lever_findings(spec))
    recent = recipe_gap_findings(spec)  # what each family's recipe was not traced for (recipe_gaps.py)
    out.extend(recent)
    out.extend(sliding_window_findings(spec))  # the banded mask from the window on (recipe_gaps.py)
    fam = spec.model.shape.family
    traits = spec.model.shape.traits
    if not traits.activations_pinned and not recent:
        out.append(
            Finding(
                "activations-not-pinned",
                Severity.WARNING,
                f"activation formula for model_type {fam!r} is the Llama-style recipe, not pinned to a trace",
                "run `fitcheck estimate --trace` to measure the real model's step on fake tensors",
            )
        )
    why = layernorm_findings_text(spec) if traits.recipe.layernorm_block else None
    if why:
        out.append(Finding("activations-not-pinned", Severity.INFO, why, "run `fitcheck estimate --trace`"))
    # LoRA dropout, DoRA, fp32/autocast adapters: pinned for the Llama-like families (tests/
    # test_activations_lora_extras.py); what is left is listed by lora_extras_unpinned
    extras = lora_extras_unpinned(spec, traits.recipe.layernorm_block) if spec.quant is None else None
    if extras:
        out.append(Finding("activations-not-pinned", Severity.INFO, extras, "run `fitcheck estimate --trace`"))
    int8 = int8_formula_applies(spec)  # LLM.int8 LoRA: activations/int8.py
    # Phi-3's fused layer over a k-bit-prepared 4-bit base: the LoRA recipe with fp32 base outputs
    # (layer_saved.ActivationMode.fp32_out; envelope_ranges.json phi3/qlora/*/sdpa/{bf16,fp32,autocast} within 1.7 %)
    phi3_kbit = kbit_fp32_lora(spec) and spec.model.shape.traits.fused_projections
    lora_unpinned = spec.quant is not None and not qlora_formula_applies(spec) and not int8 and not phi3_kbit
    if spec.quant is not None and spec.quant.bits == 8 and not int8 and inputs_kept(spec):
        out.append(
            Finding(
                "activations-not-pinned",
                Severity.INFO,
                "LLM.int8 base under DeepSpeed's 16-bit module cast: the 16-bit LoRA recipe plus the input each "
                "8-bit linear keeps (bnb_kept_inputs.py), checked on the real engine at a tiny width only "
                "(benchmarks/deepspeed_cpu.py --cases)",
                "run `fitcheck estimate --trace` for a measured number (8-bit bases are traced on CPU)",
            )
        )
    elif spec.quant is not None and spec.quant.bits == 8 and not int8:
        out.append(
            Finding(
                "activations-not-pinned",
                Severity.WARNING,
                "LLM.int8 base outside the traced recipe (LoRA after prepare_model_for_kbit_training on a "
                "Llama/Mistral/Qwen2/Gemma layer): the saved activations use the LoRA recipe, which does not "
                "count the input bitsandbytes' MatMul8bitFp/MatMul8bitLt keeps for each 8-bit linear",
                "treat the activations as a lower bound; run `fitcheck estimate --trace` (8-bit bases are traced)",
            )
        )
    elif lora_unpinned:  # no k-bit preparation, DoRA or an untraced family on a quantized base
        out.append(
            Finding(
                "activations-not-pinned",
                Severity.INFO,
                "activations of this quantized base use the LoRA recipe; traces differ by up to ~6 %",
                "run `fitcheck estimate --trace` for a measured number (4-bit bases are traced on an emulated base)",
            )
        )
    if not qlora_formula_applies(spec) and not int8:  # QLoRA's backward working set: activations_qlora.py
        out.extend(backward_findings(spec))
    if traits.eager_only and spec.activations.attn_implementation is AttnImpl.SDPA:
        out.append(
            Finding(
                "attention-eager-forced",
                Severity.INFO,
                f"transformers has no SDPA path for {fam}: eager attention (s² scores) is what runs",
            )
        )
    out.extend(cuda_gap_findings(spec))  # docs/cuda-vs-cpu.md: what a CUDA step runs that was not traced
    flash = spec.activations.attn_implementation is AttnImpl.FLASH_ATTENTION_2
    if flash and spec.hardware.device_type is DeviceType.CPU:
        out.append(Finding("flash-attention-cpu", Severity.WARNING, "flash_attention_2 needs CUDA; modelled as SDPA"))
    out.extend(vision_findings(spec))
    return tuple(out)
