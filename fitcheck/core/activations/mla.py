"""Saved activations of DeepSeek-V3: latent attention (MLA), dense and MoE layers (pure: no torch).

Read in transformers 5.23 ``models/deepseek_v3/modeling_deepseek_v3.py`` (cited by class below) and pinned
by fake-tensor traces at real widths (tests/test_activations_moe_mla.py; benchmarks/moe_mla_vs_trace.py). Bytes
per token per layer; e activation bytes, h hidden, a heads, dq = qk_nope + qk_rope, dv = v_head_dim,
qr = q_lora_rank, kr = kv_lora_rank, I the dense MLP width, Im the expert width, Is = Im·n_shared_experts,
E routed experts, k top-k.

``DeepseekV3Attention.forward``:
- ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` and ``kv_a_layernorm`` on the first kr features of
  ``kv_a_proj_with_mqa(x)``: each ``DeepseekV3RMSNorm`` keeps what a hidden-size RMSNorm keeps, at its width
  (fp32 input 4w, rsqrt 4, the 16-bit normalised tensor 2w for a trained weight); the norms' outputs are the
  inputs of q_b_proj / kv_b_proj (kept for their weight gradients, or cast to fp32 by their LoRA adapters).
- rotary on the 64-wide q_rot / k_rot slices (``apply_rotary_pos_emb_interleave``): products with cos / sin
  that need no gradient, so only the tables are kept (counted outside the layers).
- ``query_states`` (cat of q_pass and q_rot) and ``key_states`` (``new_empty`` + copies) are dq wide per head,
  ``value_states`` a dv-wide view of ``kv_b_proj``'s output. SDPA: the head dims differ (192 vs 128), which the
  flash kernels refuse (aten ``sdp_utils.cpp`` ``check_head_dim_size_flash``: q, k, v head dims equal). On CPU
  the math path runs (trace: q and k scaled in fp32 4·a·dq each, v in fp32 4·a·dv, the fp32 softmax 4·a per
  key position, then ``transpose(1, 2).contiguous()`` of the output, o_proj's input e·a·dv). On CUDA the
  memory-efficient kernel accepts dq ≠ dv (``check_head_dim_size_mem_efficient``): it keeps q, k, the value
  view (the whole kv_b_proj output, e·a·(nope + dv)), its output (o_proj's input) and an fp32 logsumexp per
  head; no s² tensor (from the kernel's contract, not traced: no GPU here).

``DeepseekV3MoE.forward`` (layers from ``first_k_dense_replace`` on; the first ones run ``DeepseekV3MLP``):
- ``DeepseekV3TopkRouter``: ``F.linear(x.type(fp32), weight.type(fp32))`` keeps the fp32 input 4h (when the
  router weight is trained or LoRA-wrapped) and the fp32 weight copy 4·E·h per layer (the input needs a
  gradient); ``sigmoid`` output 4E; top-k ids, normalised weights, sort / permutation (int64) and the gathered
  fp32 routing weights: 40·k + 4 (trace).
- routed experts (``grouped_mm``, integrations/moe.py): as Mixtral's recipe, k·e·(2h + 4·Im) when trained or
  LoRA-wrapped (peft ParamWrapper: activations/param_wrapper.py), k·e·(h + 3·Im) when frozen.
- ``shared_experts`` (``DeepseekV3MLP`` of width Is) on the same norm output: e·h + 4·e·Is trained,
  3·e·Is frozen. peft's MoE rewrite maps every ``gate_proj`` / ``up_proj`` / ``down_proj`` target to the fused
  expert parameters (peft 0.21.2 utils/transformers_weight_conversion.py ``_convert_peft_config_moe``), so under
  LoRA the shared experts and the dense layers' MLPs carry no adapter (fitcheck.core.states.plan_lora).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fitcheck.spec import AttnImpl, DeviceType, Kind, MlaConfig, TrainingSpec

# A spec without MLA traits (never a DeepSeek-V3 shape: its family always fills them) reads zero widths
_NO_MLA = MlaConfig(0, 0, 0, 0, 0, 0, 0, 0)

@dataclass(frozen=True)
class MlaDims:
    """The widths of one DeepSeek-V3 layer (see the module docstring for the letters)."""

    q_rank: int  # 0: no q low-rank path (q_proj reads the hidden state)
    kv_rank: int
    dq: int
    dv: int
    nope: int
    dense_inter: int
    shared_inter: int
    n_dense: int  # dense layers among spec.model.shape.num_layers


def mla_dims(spec: TrainingSpec) -> MlaDims:
    """MLA and MLP widths from the DeepSeek-V3 traits (config.json with DeepseekV3Config's defaults)."""
    sh = spec.model.shape
    cfg = sh.traits.mla if sh.traits.mla is not None else _NO_MLA
    moe_inter = sh.intermediate_size  # the per-expert width (fitcheck/families/deepseek_v3.py)
    return MlaDims(
        q_rank=cfg.q_rank, kv_rank=cfg.kv_rank, dq=cfg.nope + cfg.rope,
        dv=cfg.v_head_dim, nope=cfg.nope, dense_inter=cfg.dense_intermediate,
        shared_inter=moe_inter * cfg.shared_experts,
        n_dense=min(max(cfg.first_dense, 0), sh.num_layers),
    )


@dataclass(frozen=True)
class MlaMode:
    """How the step stores tensors (from ``fitcheck.core.activations.activation_mode.ActivationMode``)."""

    e: int  # activation element bytes
    half_model: bool
    full: bool  # every weight trained
    adapter: Callable[[int], int]  # bytes one LoRA adapter keeps for an input of that width
    reads_itself: bool  # fp32 LoRA adapters without dropout read their input tensor itself


def _adapted(spec: TrainingSpec) -> tuple[frozenset[str], frozenset[str]]:
    """(attention linears, MLP linears as ``dense.<name>`` / ``shared.<name>``) that carry a LoRA adapter."""
    from fitcheck.core.states import plan_lora

    if spec.lora is None:
        return frozenset(), frozenset()
    attn: set[str] = set()
    mlp: set[str] = set()
    for t in plan_lora(spec).targets:
        if t.via_param_wrapper or t.entry.kind is not Kind.LINEAR:
            continue
        parts = t.entry.name.split(".")
        module = parts[-2] if len(parts) >= 2 else ""
        if ".self_attn." in t.entry.name:
            attn.add(module)
        elif ".mlp.shared_experts." in t.entry.name:
            mlp.add("shared." + module)
        elif ".mlp." in t.entry.name:
            mlp.add("dense." + module)
    return frozenset(attn), frozenset(mlp)


def _rms(width: int, m: MlaMode) -> int:
    """One RMSNorm over ``width`` features (decoder ``_norm_saved``'s recipe at another width)."""
    normed = (2 if m.half_model else 4) * width if m.full else 0
    return 4 * width + 4 + normed


def _reads(m: MlaMode, adapted: frozenset[str], names: tuple[str, ...], width: int) -> int:
    """What the linears ``names`` reading one tensor of ``width`` features keep of it."""
    if m.full:
        return m.e * width
    hit = [n for n in names if n in adapted]
    total = sum(m.adapter(width) for _ in hit)
    if hit and m.reads_itself:
        total += 4 * width  # fp32 adapters without dropout save the input tensor itself, once
    return total


def mla_attention(spec: TrainingSpec, m: MlaMode, d: MlaDims) -> tuple[int, int]:
    """(bytes per token, bytes per token per key position) of one layer's norms and attention."""
    sh = spec.model.shape
    h, a = sh.hidden_size, sh.num_heads
    attn, _ = _adapted(spec)
    total = 2 * _rms(h, m)  # input_layernorm, post_attention_layernorm
    if d.q_rank:
        total += _reads(m, attn, ("q_a_proj", "kv_a_proj_with_mqa"), h)
        total += _rms(d.q_rank, m) + _reads(m, attn, ("q_b_proj",), d.q_rank)
    else:
        total += _reads(m, attn, ("q_proj", "kv_a_proj_with_mqa"), h)
    total += _rms(d.kv_rank, m) + _reads(m, attn, ("kv_b_proj",), d.kv_rank)
    o_in = a * d.dv
    o_kept = m.full or ("o_proj" in attn and m.reads_itself)  # o_proj's weight (or an fp32 adapter) reads it
    kv_out = m.e * a * (d.nope + d.dv)  # kv_b_proj's output, of which value_states is a view
    if spec.activations.attn_implementation is AttnImpl.EAGER:
        # matmul(q, kᵀ) keeps q and key_states, matmul(p, v) the 16-bit probabilities and the value view;
        # softmax(dtype=fp32) its output; transpose(1, 2).contiguous() is o_proj's input
        total += 2 * m.e * a * d.dq + kv_out + (m.e * o_in if o_kept else 0)
        s2 = 4 * a + (2 * a if m.e == 2 else 0)
    elif spec.hardware.device_type is DeviceType.CPU:
        # math path: q·scale and k·scale in fp32, v in fp32 (its own view in an fp32 model), fp32 softmax
        total += 8 * a * d.dq + (4 * a * d.dv if m.e == 2 else kv_out) + (m.e * o_in if o_kept else 0)
        s2 = 4 * a
    else:
        # memory-efficient kernel: q, k, the value view, the output (o_proj's input), fp32 logsumexp
        total += 2 * m.e * a * d.dq + kv_out + m.e * o_in + 4 * a
        s2 = 0
    total += _reads(m, attn, ("o_proj",), o_in) if not m.full else 0
    return total, s2


def _gated_mlp(m: MlaMode, adapted: frozenset[str], prefix: str, h: int, inter: int) -> int:
    """A ``DeepseekV3MLP`` of width ``inter``: gate/up outputs and act(gate) (3·e·I), and what its linears keep."""
    total = 3 * m.e * inter
    if m.full:
        return total + m.e * h + m.e * inter  # input, act(gate)·up (down_proj's input)
    return (total + _reads(m, adapted, (prefix + "gate_proj", prefix + "up_proj"), h)
            + _reads(m, adapted, (prefix + "down_proj",), inter))


def mla_mlp(spec: TrainingSpec, m: MlaMode, d: MlaDims, *, moe: bool, experts_trained: bool,
            router_trained: bool) -> int:
    """Bytes per token of one layer's MLP: the dense ``DeepseekV3MLP`` or the MoE block."""
    sh = spec.model.shape
    h, k, n_exp, inter = sh.hidden_size, sh.experts_per_token, sh.num_experts, sh.intermediate_size
    _, mlp = _adapted(spec)
    if not moe:
        return _gated_mlp(m, mlp, "dense.", h, d.dense_inter)
    router = (4 * h if router_trained else 0) + 4 * n_exp + 40 * k + 4
    routed = k * m.e * ((2 * h + 4 * inter) if experts_trained else (h + 3 * inter))
    return router + routed + _gated_mlp(m, mlp, "shared.", h, d.shared_inter)


def mla_outside(spec: TrainingSpec, m: MlaMode, d: MlaDims, *, experts_trained: bool,
                router_trained: bool) -> int:
    """Per micro-batch bytes the per-layer recipe (a MoE layer) misses: the dense layers' MLPs in place of the
    MoE block, and each MoE layer's fp32 router weight copy (4·E·h, not per token)."""
    sh = spec.model.shape
    bs = spec.batch.micro_batch * spec.batch.seq_len
    dense = mla_mlp(spec, m, d, moe=False, experts_trained=experts_trained, router_trained=router_trained)
    sparse = mla_mlp(spec, m, d, moe=True, experts_trained=experts_trained, router_trained=router_trained)
    n_moe = sh.num_layers - d.n_dense
    # decoder._outside_saved counts the expert offsets (cumsum int32, 4E) for every layer: dense ones have none
    return d.n_dense * ((dense - sparse) * bs - 4 * sh.num_experts) + n_moe * 4 * sh.num_experts * sh.hidden_size


def _produced_grads(spec: TrainingSpec, top: int) -> int:
    """Gradient bytes that exist when the top layer's attention backward runs: the head and final norm, the top
    layer's MLP block, post-attention norm and o_proj (full); their fp32 adapters (LoRA: peft adapters are fp32)."""
    from fitcheck.core.states import plan_lora

    def top_part(name: str) -> bool:
        top_mlp = name.startswith(f"model.layers.{top}.mlp.") or name.startswith("model.layers.*.mlp.")
        return top_mlp or (name.startswith("model.layers.*.") and (".o_proj." in name
                                                                    or ".post_attention_layernorm." in name))

    if spec.lora is not None:
        return 4 * sum(t.params_each for t in plan_lora(spec).targets if top_part(t.entry.name))
    produced = 0
    for p in spec.model.params:
        if top_part(p.name):
            produced += p.numel_each
        elif not p.name.startswith("model.layers.") and not p.name.startswith("model.embed_tokens"):
            produced += p.numel  # LM head and final norm
    return produced * spec.precision.load_dtype.nbytes


def mla_attention_backward(spec: TrainingSpec, m: MlaMode, d: MlaDims, layers_saved: int, *,
                           experts_trained: bool, router_trained: bool, wrapped_per_layer: int) -> int | None:
    """Bytes alive besides parameters, optimizer states and the gradients not produced yet, when the top layer's
    CPU math attention runs its backward (16-bit model, SDPA on CPU, no checkpointing).

    Traced (DeepSeek-V3, 2 and 4 layers, 2048 tokens, full): the peak of backward is the top layer's softmax
    backward in aten ``_scaled_dot_product_attention_math``: the gradient of the probabilities (``bmm``) and of
    the scores (``_softmax_backward_data``), fp32 a·s² each, and the fp32 gradient of v (4·a·dv per token), next
    to every layer's saved tensors except what the top layer's backward has already released (its MLP block,
    post-attention norm, router weight copy, merged LoRA expert stacks, o_proj's input and the fp32 v) and the
    residual-stream gradients (3·e·h per token). The gradients of the head, the final norm, the top MLP block,
    its post-attention norm and o_proj (or their adapters') exist by then; ``backward.backward_moments``
    subtracts all gradients, so the produced ones are added back here.

    Args:
        spec: The training spec.
        m: Storage mode.
        d: Widths.
        layers_saved: Saved bytes of all decoder layers (``activation_components``).
        experts_trained: Routed experts trained or LoRA-wrapped.
        router_trained: Router weight trained or LoRA-wrapped.
        wrapped_per_layer: Bytes of one MoE layer's ParamWrapper tensors (activations/param_wrapper.py).

    Returns:
        None where this moment is not modelled (another kind of run).
    """
    sh = spec.model.shape
    cpu_math = spec.hardware.device_type is DeviceType.CPU and spec.activations.attn_implementation is AttnImpl.SDPA
    if not (m.half_model and cpu_math) or spec.activations.checkpointing or spec.freeze is not None:
        return None
    from fitcheck.core.states import gradients_held_from_start

    if gradients_held_from_start(spec) or spec.quant is not None:
        return None  # every gradient exists already / a quantized base: not traced
    bs, s = spec.batch.micro_batch * spec.batch.seq_len, spec.batch.seq_len
    h, a, top = sh.hidden_size, sh.num_heads, sh.num_layers - 1
    moe = top >= d.n_dense
    block = mla_mlp(spec, m, d, moe=moe, experts_trained=experts_trained, router_trained=router_trained)
    attn, _ = _adapted(spec)
    o_in = m.e * a * d.dv if m.full else _reads(m, attn, ("o_proj",), a * d.dv)
    released = (block + _rms(h, m) + o_in + 4 * a * d.dv) * bs
    if moe:
        released += 4 * sh.num_experts * h + wrapped_per_layer
    work = 8 * a * s * bs + (4 * a * d.dv + 3 * m.e * h) * bs
    rot = max(1, round(sh.head_dim * sh.partial_rotary_factor))
    static = 2 * s * rot * 2  # cos / sin tables
    return static + layers_saved - released + work + _produced_grads(spec, top)
