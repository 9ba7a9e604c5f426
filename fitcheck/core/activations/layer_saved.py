"""What one decoder layer (and the model outside its layers) saves for backward, per token: pure, no torch. The per-
token recipes behind ``fitcheck.core.activations.decoder.activation_components``: the Llama-like layer (norms,
attention, MLP, adapters' inputs), MLA (DeepSeek-V3), the model outside its layers. How the activations are stored
is :mod:`.activation_mode`'s; the logits of the loss and the head's backward are :mod:`.logits`'. Every term was
read off fake-tensor traces of the transformers 5.23 models (``fitcheck.torch_adapters.tracer``) and is pinned by
the tests named where it is used; split out of ``decoder.py`` unchanged."""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.activations.activation_mode import ActivationMode, activation_mode, adapter_input_bytes
from fitcheck.core.activations.attention_variants import eager_scores, rotary_tables, sink_attention_extra
from fitcheck.core.activations.bnb_kept_inputs import kept_first_layer_less, kept_layer_extra
from fitcheck.core.activations.dora import (
    dora_per_token,
)
from fitcheck.core.activations.embedding import scaled_embedding_leaf
from fitcheck.core.activations.int8 import (
    int8_first_layer_unsaved,
    int8_formula_applies,
    int8_layer_saved_per_token,
)
from fitcheck.core.activations.layernorm_blocks import layernorm_block_saved
from fitcheck.core.activations.layernorm_outside import layernorm_head_input, layernorm_outside_saved
from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.mla import (
    MlaMode,
    mla_attention,
    mla_attention_backward,
    mla_dims,
    mla_mlp,
    mla_outside,
)
from fitcheck.core.activations.moe_expert_loop import expert_linears_bytes, expert_loop_applies, expert_loop_saved
from fitcheck.core.activations.moe_grouped_mm import gpt_oss_moe_saved
from fitcheck.core.activations.norms import qk_norm_outside, qk_norm_saved
from fitcheck.core.activations.param_wrapper import param_wrapper_saved, wrapped_router
from fitcheck.core.activations.qlora import (
    qlora_formula_applies,
    qlora_layer_saved_per_token,
)
from fitcheck.core.kernels import (
    activation_view,
    fused_loss,
    liger_applies,
    liger_mlp_delta,
    liger_norm_saved,
)
from fitcheck.spec import (
    AttentionKind,
    AttnImpl,
    LayerRecipe,
    LoraSpec,
    ModelShape,
    MoeLayout,
    NormKind,
    NormPlacement,
    TrainingSpec,
)

_TRACE = "fake-tensor trace of the transformers 5.23 model (fitcheck.torch_adapters.tracer)"
_ATTN_LINEARS = ("q_proj", "k_proj", "v_proj")
_MLP_IN_LINEARS = ("gate_proj", "up_proj")




def _lora_targets(spec: TrainingSpec) -> frozenset[str]:
    names: tuple[str, ...] = (*_ATTN_LINEARS, "o_proj", *_MLP_IN_LINEARS, "down_proj")
    if spec.model.shape.traits.fused_projections:
        names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # modeling_phi3.py: fused linears
    return wrapped_linears(spec.lora, names)


def _attn_impl(spec: TrainingSpec) -> AttnImpl:
    impl = spec.activations.attn_implementation
    # transformers refuses SDPA for these configs (soft-capping, ALiBi, sinks): eager is what runs
    if spec.model.shape.traits.eager_only and impl is AttnImpl.SDPA:
        return AttnImpl.EAGER
    return impl


def _norm_saved(shape: ModelShape, m: ActivationMode, trainable_weight: bool, pre: bool = True) -> int:
    """Bytes per token one RMSNorm saves (trace: rsqrt fp32 per token, fp32 upcast of the input)."""
    h = shape.hidden_size
    # OLMo-2 / gpt-oss multiply the fp32 normalised tensor by the weight, as Gemma does (norms.py)
    gemma = shape.traits.norm_kind in (NormKind.RMS_ONE_PLUS, NormKind.RMS_FP32_PRODUCT)
    if m.half_model:
        # x.to(fp32) 4h + rsqrt 4 (+ normed.to(bf16) 2h kept for the weight gradient; Gemma keeps x*rsqrt fp32 4h)
        if gemma:
            # x.float(), rsqrt, x*rsqrt fp32 (kept by `* (1 + weight.float())` only for a trained weight:
            # trace "gemma lora"); the type_as output is the next input
            return 4 * h + 4 + (4 * h if trainable_weight else 0)
        return 4 * h + 4 + (2 * h if trainable_weight else 0)
    # fp32 weights (with or without autocast): the input itself 4h, rsqrt 4, x*rsqrt 4h (weight gradient)
    return 4 * h + 4 + (4 * h if trainable_weight else 0)


def _linear_inputs(shape: ModelShape, m: ActivationMode, full: bool, targets: frozenset[str], lora: LoraSpec | None,
                   consumers: tuple[str, ...], width: int, fused: bool, kept: bool = False) -> int:
    """Bytes per token saved for the linears that read one tensor of ``width`` features (``kept``: saved anyway)."""
    total = 0
    if full:
        if m.autocast:
            total += 2 * width * (1 if fused else len(consumers))  # one bf16 cast per consumer (trace: to_copy)
        else:
            total += m.e * width  # the shared input tensor
    hit = [c for c in consumers if c in targets]
    if hit and lora is not None:
        total += len(hit) * adapter_input_bytes(m, lora, width)
        if lora.dropout == 0 and not (((m.amp or m.half_model) and not m.a16) or full or kept):
            # fp32 model (or 16-bit adapters on a 16-bit model, under autocast too: FSDP2's 16-bit copies, real
            # Trainer benchmarks/fsdp_kinds_cpu.py): the adapters read the input itself, once (trace: mul, norm
            # output)
            total += m.e * width
    return total


def _experts_adapted(spec: TrainingSpec) -> bool:
    """Whether LoRA wraps the fused MoE expert tensors (peft ``target_parameters``)."""
    from fitcheck.core.states import plan_lora
    from fitcheck.spec import Kind

    return spec.lora is not None and any(t.entry.kind is Kind.FUSED_EXPERTS for t in plan_lora(spec).targets)


def _reads_input_itself(spec: TrainingSpec, m: ActivationMode, targets: frozenset[str], name: str) -> bool:
    """Whether the LoRA adapter on ``name`` saves its input tensor itself (fp32 model, no dropout, no autocast)."""
    lora = spec.lora
    return name in targets and lora is not None and lora.dropout == 0 and not ((m.amp or m.half_model) and not m.a16)


def lora_reads_input_itself(spec: TrainingSpec) -> bool:
    """Whether peft's ``lora_A`` saves the tensor it reads itself (fp32 model, no dropout, no autocast)."""
    return _reads_input_itself(spec, activation_mode(spec), _lora_targets(spec), "down_proj")


def down_adapter_saved(spec: TrainingSpec) -> int:
    """Bytes per token down_proj's LoRA adapter saves (its input copies, dropout mask, ``lora_A`` output; an fp32
    model without dropout: the input itself), all freed once its backward has run (``lora_recompute.py``)."""
    lora, m = spec.lora, activation_mode(spec)
    if lora is None or "down_proj" not in _lora_targets(spec):
        return 0
    inter = spec.model.shape.intermediate_size
    itself = m.e * inter if _reads_input_itself(spec, m, _lora_targets(spec), "down_proj") else 0
    return adapter_input_bytes(m, lora, inter) + itself


def adapter_mlp_saved(spec: TrainingSpec) -> int:
    """Bytes per token the MLP of one adapter-wrapped (LoRA / QLoRA) layer saves: its linears' adapter inputs,
    the gate/up outputs, act(gate) and down_proj's adapter tensors, all freed by the time the MLP's input
    projection runs its backward (``lora_recompute.base_backward``)."""
    return _mlp_saved(spec, activation_mode(spec), False, _lora_targets(spec))


def layer_saved_per_token(spec: TrainingSpec, trainable: bool | None = None) -> tuple[int, int]:
    """(bytes per token, bytes per token per position of the s² term) saved by one decoder layer.

    ``trainable=False``: a frozen layer of a partial fine-tune whose input needs a gradient
    (``fitcheck.core.activations.freeze``); None: as the spec says (full fine-tune, LoRA or quantized base).
    """
    spec = activation_view(spec)  # DeepSpeed fp16/bf16 runs a 16-bit module (kernels/module_cast.py)
    per_token, s2 = _layer_saved(spec, trainable)
    per_token += kept_layer_extra(spec)  # bitsandbytes <= 0.43.1 keeps each 4-bit linear's input (bnb_kept_inputs.py)
    liger = liger_applies(spec)
    if liger is None:
        return per_token, s2
    # Liger-Kernel kernels (fitcheck/core/kernels/liger.py): RMSNorm keeps its input + fp32 rstd, the gated MLP
    # no act(gate) output
    m, sh = activation_mode(spec), spec.model.shape
    if liger.rms_norm:
        norms = 4 if sh.traits.norm_placement is NormPlacement.PRE_AND_POST else 2
        full = spec.lora is None and spec.quant is None
        per_token -= norms * (_norm_saved(sh, m, full) - liger_norm_saved(sh.hidden_size, m.r))
    # QLoRA: Linear4bit casts back to the (fp32) input dtype, so act(gate) is fp32 (activations/qlora.py)
    return per_token - liger_mlp_delta(spec, 4 if qlora_formula_applies(spec) else m.e), s2


def _layer_saved(spec: TrainingSpec, trainable: bool | None = None) -> tuple[int, int]:
    sh = spec.model.shape
    if sh.traits.recipe.layernorm_block:
        return layernorm_block_saved(spec)  # GPT-2, BERT, Phi, Falcon, BLOOM (activations_families.py)
    if qlora_formula_applies(spec):  # 4-bit base + LoRA, traced on real bitsandbytes (activations_qlora.py)
        return qlora_layer_saved_per_token(spec, _attn_impl(spec) is AttnImpl.EAGER)
    if int8_formula_applies(spec):  # LLM.int8 base + LoRA, traced on real bitsandbytes (activations/int8.py)
        return int8_layer_saved_per_token(spec, _attn_impl(spec) is AttnImpl.EAGER)
    m = activation_mode(spec)
    full = spec.lora is None and spec.quant is None if trainable is None else trainable
    targets = _lora_targets(spec)
    h, a = sh.hidden_size, sh.num_heads
    kv, q = sh.num_kv_heads * sh.head_dim, sh.num_heads * sh.head_dim
    if sh.traits.recipe is LayerRecipe.LATENT_MOE:  # DeepSeek-V3: latent attention, MoE layer (activations/mla.py)
        return _mla_layer(spec, m, full)
    fused = sh.traits.fused_projections
    eager = _attn_impl(spec) is AttnImpl.EAGER
    total = _norm_saved(sh, m, full)  # input_layernorm; the others: _after_attention
    # attention inputs (q/k/v or fused qkv_proj)
    if fused:
        total += _linear_inputs(sh, m, full, targets, spec.lora, ("qkv_proj",), h, True)
        if not m.fp32_out:  # under autocast over an fp32 output, q, k, v are cast: the fused output is not kept
            total += m.e * (q + 2 * kv)  # fused qkv output kept (v is a view of it; trace phi3: mm (b·s, q+2kv))
    else:
        total += _linear_inputs(sh, m, full, targets, spec.lora, _ATTN_LINEARS, h, False)
    total += qk_norm_saved(sh, m.e == 2, full)  # Qwen3 per-head q/k RMSNorms (norms.py)
    # the o_proj input copy (eager transpose(1,2).contiguous(), phi3 SDPA reshape) lives only if o_proj's weight
    # or its fp32 lora_A reads it: a dropout or 16-bit adapter input is a new tensor (trace "llama lora eager")
    o_copy = q if full or _reads_input_itself(spec, m, targets, "o_proj") else 0
    if eager:
        # q, repeat_kv clones of K and V, transpose(1,2).contiguous() of the output (trace: clone ops);
        # phi3 without GQA: repeat_kv is the identity, K is the rotary cat and V a view of the fused qkv output
        total += m.e * (3 * q + o_copy) if not (fused and kv == q) or m.fp32_out else m.e * (q + kv + o_copy)
        s2 = 4 * a + (2 * a if m.e == 2 else 0)  # fp32 softmax + its 16-bit cast
        if sh.traits.attention is AttentionKind.SOFTCAPPED:
            s2 += m.e * a  # tanh of the soft-capped scores
        s2 = eager_scores(sh, m.e, s2)  # gpt-oss: softmax with sinks in the logits dtype (attention_variants.py)
        total += sink_attention_extra(sh, m.e)  # gpt-oss: sink column, max indices (attention_variants.py)
        # fused qkv (phi3) keeps the qkv output already counted; rotary q and k are separate cats
    else:
        # k after rotary + v (phi3: v is a view of qkv; fp32_out: SDPA's 16-bit casts of q, k, v)
        kv_saved = 2 * kv if not fused or m.fp32_out else kv
        total += m.e * (q + kv_saved) + m.e * q + 4 * a  # rotary q, k, v, SDPA out + logsumexp fp32
        if fused:
            total += m.e * o_copy  # o_proj input: transpose(1,2).reshape copy (trace: clone)
        s2 = 0
    total += _after_attention(spec, m, full, targets)
    total += dora_per_token(spec, m.e, m.amp, m.half_model)  # DoRA: base and LoRA outputs (activations_lora)
    return total, s2


def full_saved_after_attention(spec: TrainingSpec) -> int:
    """Bytes per token a full fine-tune's Llama-recipe layer saves after its attention's output (norm_backward.py)."""
    return _after_attention(spec, activation_mode(spec), True, frozenset())


def full_mlp_saved(spec: TrainingSpec) -> int:
    """Bytes per token a full fine-tune's Llama-recipe MLP saves (``freeze.autocast_layer_cast``)."""
    return _mlp_saved(spec, activation_mode(spec), True, frozenset())


def _after_attention(spec: TrainingSpec, m: ActivationMode, full: bool, targets: frozenset[str]) -> int:
    """Bytes per token a Llama-recipe layer saves after its attention's output: o_proj's adapter input, the
    post-attention norm(s), the MLP; all freed before the attention's own backward runs (``eager.eager_moments``)."""
    sh = spec.model.shape
    q = sh.num_heads * sh.head_dim
    # o_proj reads the attention output (a view of SDPA's output or the eager/phi3 copy), saved already (trace)
    total = _linear_inputs(sh, m, False, targets, spec.lora, ("o_proj",), q, False, kept=True)
    total += _norm_saved(sh, m, full)  # post_attention_layernorm
    if sh.traits.norm_placement is NormPlacement.PRE_AND_POST:
        total += 2 * _norm_saved(sh, m, full, pre=False)  # post-attention / post-feedforward norms
    return total + _mlp_saved(spec, m, full, targets)


@dataclass(frozen=True)
class EagerLayerTerms:
    """What eager attention's working set (``activations/eager.py``) reads of a layer's recipe.

    Attributes:
        e: Element bytes of activations; r: of the residual stream; autocast; half_model: as ``ActivationMode``.
        after: Bytes per token the layer saves after its attention's output (o_proj's input and adapters, the
            post-attention norm(s), the MLP), freed before the attention's own backward runs.
        final_norm: Bytes per token of the final norm's saved tensors and the LM head's input.
        first_unsaved: Bytes per token the first layer saves less than the others (LoRA without checkpointing).
    """

    e: int
    r: int
    autocast: bool
    half_model: bool
    after: int
    final_norm: int
    first_unsaved: int


def eager_layer_terms(spec: TrainingSpec) -> EagerLayerTerms | None:
    """The recipe terms eager attention's working set needs, or None where the layer does not run the Llama
    recipe's eager attention (SDPA, the LayerNorm blocks, latent attention, MoE layers, partial training by
    layers), or a quantized base other than 4-bit
    QLoRA with k-bit preparation (8-bit, no k-bit preparation, pre-quantized: their layers' backward was not traced
    at the attention; a 4-bit base without preparation came out +1.6 .. +2.4 % during backward, Llama-3.1-8B and
    OLMo-2-7B at 2048-4096 tokens)."""
    from fitcheck.core.activations.qlora import qlora_saved_after_attention

    sh = spec.model.shape
    if (_attn_impl(spec) is not AttnImpl.EAGER or sh.traits.recipe.layernorm_block
            or sh.traits.recipe is LayerRecipe.LATENT_MOE or sh.num_experts or spec.freeze is not None
            or (spec.quant is not None and not qlora_formula_applies(spec))):
        return None  # MoE layers and partial training by layers: the attention moment not traced yet
    m = activation_mode(spec)
    full = spec.lora is None and spec.quant is None
    targets = _lora_targets(spec)
    if qlora_formula_applies(spec):
        after = qlora_saved_after_attention(spec)
    else:
        after = _after_attention(spec, m, full, targets)
        if full or _reads_input_itself(spec, m, targets, "o_proj"):
            # the o_proj input copy (transpose(1,2).contiguous()), read by its weight gradient
            after += m.e * sh.num_heads * sh.head_dim
    final = _norm_saved(sh, m, full) + (m.r * sh.hidden_size if full and not m.autocast else 0)
    liger = liger_applies(spec)
    first = _first_layer_unsaved(spec, m, liger is not None and liger.rms_norm)
    return EagerLayerTerms(m.e, m.r, m.autocast, m.half_model, after, final, first)


def _mla_mode(spec: TrainingSpec, m: ActivationMode, full: bool) -> MlaMode:
    lora = spec.lora
    reads = lora is not None and lora.dropout == 0 and not (m.amp or m.half_model)
    return MlaMode(m.e, m.half_model, full, lambda w: adapter_input_bytes(m, lora, w) if lora is not None else 0, reads)


def _mla_layer(spec: TrainingSpec, m: ActivationMode, full: bool) -> tuple[int, int]:
    """One DeepSeek-V3 MoE layer (the dense ones: ``mla_outside``), activations/mla.py."""
    mode, dims = _mla_mode(spec, m, full), mla_dims(spec)
    per_token, s2 = mla_attention(spec, mode, dims)
    per_token += mla_mlp(spec, mode, dims, moe=True, experts_trained=full or _experts_adapted(spec),
                         router_trained=full or wrapped_router(spec))
    return per_token, s2


def _mla_outside(spec: TrainingSpec, m: ActivationMode) -> int:
    """What DeepSeek-V3's layers keep beyond L x the MoE-layer recipe (0 for other families, or when not modelled)."""
    latent = spec.model.shape.traits.recipe is LayerRecipe.LATENT_MOE
    if not latent or spec.activations.checkpointing or spec.freeze is not None:
        return 0
    full = spec.lora is None and spec.quant is None
    return mla_outside(spec, _mla_mode(spec, m, full), mla_dims(spec), experts_trained=full or _experts_adapted(spec),
                       router_trained=full or wrapped_router(spec))


def _mla_attention_moment(spec: TrainingSpec, m: ActivationMode, layers_saved: int) -> int | None:
    """DeepSeek-V3's top-layer attention backward on CPU (activations/mla.py), or None."""
    if spec.model.shape.traits.recipe is not LayerRecipe.LATENT_MOE or layers_saved < 0:
        return None
    full, dims = spec.lora is None and spec.quant is None, mla_dims(spec)
    n_moe = spec.model.shape.num_layers - dims.n_dense
    return mla_attention_backward(spec, _mla_mode(spec, m, full), dims, layers_saved,
                                  experts_trained=full or _experts_adapted(spec),
                                  router_trained=full or wrapped_router(spec),
                                  wrapped_per_layer=param_wrapper_saved(spec) // max(1, n_moe))


def _mlp_saved(spec: TrainingSpec, m: ActivationMode, full: bool, targets: frozenset[str]) -> int:
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    if sh.num_experts and sh.traits.moe is MoeLayout.GROUPED_MM_CLAMPED and not _experts_adapted(spec):
        return gpt_oss_moe_saved(sh, m.e, full)  # clamped-SwiGLU grouped_mm experts (moe_grouped_mm.py)
    if expert_loop_applies(spec):  # transformers 4.x's per-expert nn.Linear loop (moe_expert_loop.py)
        return expert_loop_saved(sh, e=m.e, r=m.r, linears_out=expert_linears_bytes(spec, m.e, m.r), full=full,
                                 autocast=m.autocast)
    if sh.num_experts:
        k, n_exp = sh.experts_per_token, sh.num_experts
        # trace "mixtral bf16": router softmax fp32 (4E) + top-k ids/weights/sort/perm (40k) + sum (4)
        # + per routed copy: permuted input h, gate_up 2I, silu I, product I, down output h
        # the trained router keeps its input (the norm output); so does a LoRA-wrapped one (W + delta needs a
        # gradient: activations/param_wrapper.py)
        router_in = m.e * h if full or wrapped_router(spec) else 0
        routed = 2 * h + 4 * inter
        if not full and not _experts_adapted(spec):
            routed = h + 3 * inter  # frozen experts keep no permuted input nor product (trace "mixtral lora")
        return router_in + 4 * n_exp + 40 * k + 4 + m.e * k * routed
    fused = sh.traits.fused_projections
    total = _linear_inputs(sh, m, full, targets, spec.lora, ("gate_up_proj",) if fused else _MLP_IN_LINEARS, h, fused)
    # gate out, up out, act(gate) out (trace: mm, mm, silu/gelu; fp32_out: Phi-3-mini QLoRA autocast, fp32 add, silu)
    total += 3 * (4 if m.fp32_out else m.e) * inter
    if full:
        total += m.e * inter  # act*up, the down_proj input
    total += _linear_inputs(sh, m, False, targets, spec.lora, ("down_proj",), inter, False)
    return total


def _head_input_per_token(spec: TrainingSpec, m: ActivationMode) -> int:
    """Bytes per token of the final norm's output kept by the LM head (Llama-style models): a trained head saves
    its input; a frozen one (LoRA, QLoRA) does not, autocast over an fp32 model casts it instead, and a fused loss
    (``fitcheck/core/kernels``) saves none."""
    sh = spec.model.shape
    full = spec.lora is None and spec.quant is None
    fused = fused_loss(spec, act_bytes=m.e, residual_bytes=m.r, autocast=m.autocast) is not None
    if not full or m.autocast or fused:
        return 0
    gemma_half = sh.traits.norm_kind is NormKind.RMS_ONE_PLUS and m.half_model
    return (2 if gemma_half else m.r) * sh.hidden_size


def lm_head_input_saved(spec: TrainingSpec) -> int:
    """Bytes per micro-batch of the LM head's input that ``activations.saved`` counts (the final norm's output,
    kept by a trained head; none for a frozen one). TRL's fused LM head replaces that head
    (``core/trainers/steps.py``): what it takes away from the saved total is this, not the whole backbone output.
    Read under the same view the saved total is (``decoder.activation_components``: DeepSpeed fp16/bf16 runs a
    16-bit module, ``kernels.deepspeed_module_view``), so an fp32-loaded model under DeepSpeed bf16 keeps a 16-bit
    head input, not the autocast run's none."""
    spec = activation_view(spec)
    sh = spec.model.shape
    per_token = (layernorm_head_input(spec) if sh.traits.recipe.layernorm_block
                 else _head_input_per_token(spec, activation_mode(spec)))
    return per_token * spec.batch.micro_batch * spec.batch.seq_len


def _outside_saved(spec: TrainingSpec) -> int:
    """Saved bytes outside the layers (final norm, rotary tables), per micro-batch."""
    sh = spec.model.shape
    if sh.traits.recipe.layernorm_block:
        return layernorm_outside_saved(spec)
    m = activation_mode(spec)
    b, s, h = spec.batch.micro_batch, spec.batch.seq_len, sh.hidden_size
    full = spec.lora is None and spec.quant is None
    # final norm; its output is the LM head input (kept when the head is trained; autocast casts it instead)
    liger = liger_applies(spec)
    liger_norm = liger is not None and liger.rms_norm
    per_token = liger_norm_saved(h, m.r) if liger_norm else _norm_saved(sh, m, full)
    per_token += _head_input_per_token(spec, m)
    total = per_token * b * s
    # cos and sin tables, shape (1, s, head_dim) in the model dtype (trace: to_copy / cos / sin, not per batch)
    # OLMo-2 fp32, gpt-oss head_dim / 2 (attention_variants.py); 16-bit under the other autocast (ActivationMode)
    total += rotary_tables(sh, s, m.half_model or m.embed16)
    if sh.traits.norm_kind is NormKind.RMS_ONE_PLUS:
        norms = 4 if sh.traits.norm_placement is NormPlacement.PRE_AND_POST else 2
        total += 4 * h * (norms * sh.num_layers + 1)  # (1 + weight) in fp32 per norm (trace: add (h,) fp32)
        total += qk_norm_outside(sh)  # Gemma-3 q/k norms' (1 + weight) (norms.py)
    if _attn_impl(spec) is AttnImpl.EAGER and spec.activations.checkpointing:
        # 4-D additive causal mask (b, 1, s, s), model dtype: no op saves it, so it outlives the decoder forward
        # only as an argument every checkpointed layer holds (trace "llama eager": absent without checkpointing)
        total += b * s * s * (2 if m.half_model else 4) * sh.traits.eager_mask_kinds  # gpt-oss: 2
    if sh.num_experts and not expert_loop_applies(spec):  # 4.x's loop has no offsets (moe_expert_loop.py)
        total += 4 * sh.num_experts * sh.num_layers  # expert offsets (trace: cumsum int32)
        total += param_wrapper_saved(spec)  # peft ParamWrapper merged experts (activations/param_wrapper.py)
    total += _mla_outside(spec, m)  # DeepSeek-V3's dense layers, router weight copies (activations/mla.py)
    total += scaled_embedding_leaf(spec, m.r)  # Granite: the embedding scaled outside its module (embedding.py)
    return total - _first_layer_unsaved(spec, m, liger_norm) * b * s


def first_layer_unsaved(spec: TrainingSpec) -> int:
    """Bytes per token the first decoder layer of a LoRA run without checkpointing saves less than
    ``layer_saved_per_token`` (0 elsewhere): a moment holding every layer's saved tensors holds this much less."""
    liger = liger_applies(spec)
    return _first_layer_unsaved(spec, activation_mode(spec), liger is not None and liger.rms_norm)


def _first_layer_unsaved(spec: TrainingSpec, m: ActivationMode, liger_norm: bool) -> int:
    """Bytes per token the first layer of a LoRA run without checkpointing saves less than the others."""
    lora, sh = spec.lora, spec.model.shape
    if lora is None or spec.activations.checkpointing:
        return 0
    total = 0
    # nothing needs the first norm's input gradient: embeddings frozen, no input grad hook (trace: LoRA);
    # OLMo-2 has no norm before its first attention (norms.py)
    if sh.traits.norm_placement is not NormPlacement.POST:
        total += liger_norm_saved(sh.hidden_size, m.r) if liger_norm else 4 * sh.hidden_size + 4
    if lora.dropout > 0:
        # layer 0's q/k/v adapters drop a tensor that needs no gradient: no mask kept (trace: 3 empty_like less)
        total += m.dm * sh.hidden_size * len(_lora_targets(spec) & {*_ATTN_LINEARS, "qkv_proj"})
    total += kept_first_layer_less(spec, all_kept=False)  # bitsandbytes <= 0.43.1: no q/k/v node in layer 0
    return total + int8_first_layer_unsaved(spec)  # LLM.int8: no q/k/v ctx.A in layer 0 (activations/int8.py)
