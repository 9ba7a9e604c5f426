"""Saved activations of a QLoRA step (bitsandbytes 4-bit base + LoRA after peft's k-bit preparation); pure.

What the real step does (traced with ``fitcheck.torch_adapters.tracer`` on real bitsandbytes 0.50.2
``Linear4bit`` layers and on the emulated fake base, fake == real to the byte, ``tests/test_tracer_qlora.py``):

* peft's ``prepare_model_for_kbit_training`` (utils/other.py) casts every 16-bit parameter that is not a
  ``Params4bit`` to fp32: embeddings, norms and the LM head. The residual stream, the norms and the logits are
  therefore fp32 whatever ``dtype`` the model was loaded in: the activations are those of an fp32 model.
* ``bnb.nn.Linear4bit.forward`` computes in ``bnb_4bit_compute_dtype`` (``x.to(compute_dtype)``) and casts its
  output back to the input dtype (``.to(inp_dtype)``): base linear outputs are fp32 even under autocast.
* ``MatMul4Bit`` (bitsandbytes/autograd/_functions.py) saves only the packed weight (``ctx.tensors = (None,
  B)``), never its input; in backward it dequantizes the whole weight into a temporary. So the frozen base
  saves nothing; the LoRA branches save their inputs.
* Under autocast (``bf16=True``) every ``lora_A`` casts its input to bf16 separately (autocast caches leaf
  weights, not activations) and the LoRA weights' bf16 casts stay cached until backward; SDPA saves bf16 casts
  of q, k and v.

* LoRA dropout keeps fp32 noise on CPU and a bool mask on CUDA (:func:`lora_dropout_mask_bytes`).

Per-layer bytes per token (trace ``llama qlora`` 2-layer minus 1-layer, h=512, I=1376, r=16: fp32 35816, +
dropout 61800, autocast 32890, autocast + dropout 50682; eager fp32 38856 + 4a·s, eager autocast 33370 +
6a·s, Qwen2 eager) are reproduced exactly by :func:`qlora_layer_saved_per_token` plus the autocast LoRA weight
cache. On CUDA specs the CUDA-emulating trace (``cuda_kernels``) is reproduced the same way
(``tests/test_tracer_cuda_dropout.py``; Llama-3.1-8B / Qwen2.5-7B width 1 x 512: 0.00 % per phase).
"""

from __future__ import annotations

from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.norms import qk_norm_saved
from fitcheck.core.activations.promoted import kbit_upcast as kbit_upcast  # its home; read from here too
from fitcheck.core.activations.promoted import promoted_residual
from fitcheck.spec import DeviceType, LoraSpec, MixedPrecision, TrainingSpec

# Families whose decoder layer is the Llama one (q/k/v/o, gate/up/down, RMSNorm) declare ``kbit_pinned``.
_QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")
_ALL = (*_QKV, "o_proj", *_GATE_UP, "down_proj")


def qlora_formula_applies(spec: TrainingSpec) -> bool:
    """A 4-bit base with LoRA, prepared for k-bit training, on a family whose layer was traced."""
    quant = spec.quant
    return (
        quant is not None
        and quant.bits == 4
        and (kbit_upcast(spec) or promoted_residual(spec))  # promoted: fp32 above layer 0, as k-bit prepared
        and spec.lora is not None
        and not spec.lora.use_dora
        and spec.model.shape.traits.kbit_pinned
    )


def four_bit_lora(spec: TrainingSpec) -> bool:
    """LoRA over a bitsandbytes 4-bit base, any family: its base matmuls are ``MatMul4Bit`` (no autocast op,
    bitsandbytes 0.50.2 autograd/_functions.py), so autocast casts and caches only the LoRA weights."""
    quant = spec.quant
    return quant is not None and quant.bits == 4 and spec.lora is not None


def kbit_fp32_lora(spec: TrainingSpec) -> bool:
    """LoRA (not DoRA) over a bitsandbytes 4-bit base whose other parameters are fp32 (peft's k-bit preparation, or
    an fp32 load): ``Linear4bit.forward`` casts its output back to the fp32 input's dtype (bitsandbytes 0.50.2
    ``nn/modules.py``), so every base linear output is fp32, under autocast too (``MatMul4Bit`` is no autocast op)."""
    lora = spec.lora
    fp32 = kbit_upcast(spec) or promoted_residual(spec)  # promoted: the fp32 residual above layer 0 is its input
    return four_bit_lora(spec) and fp32 and lora is not None and not lora.use_dora


def lora_dropout_mask_bytes(spec: TrainingSpec) -> int:
    """Bytes per input element the dropout of a LoRA branch keeps for backward: 1 on CUDA, 4 on CPU (fp32 input).

    peft 0.21.2 ``tuners/lora/bnb.py`` ``Linear4bit.forward`` / ``Linear8bitLt.forward`` (and ``layer.py``
    ``Linear.forward``) run ``lora_B(lora_A(dropout(x)))`` per adapter, each with its own ``nn.Dropout``. torch's
    ``at::dropout`` (aten/src/ATen/native/Dropout.cpp) takes ``native_dropout`` for a CUDA tensor with 0 < p < 1
    (``is_fused_kernel_acceptable``), which saves a bool mask (1 B per element); on CPU ``_dropout_impl`` keeps
    ``at::empty_like(input).bernoulli_()`` noise in the input's dtype (fp32 after k-bit preparation: 4 B). The
    dropout output is the same on both. Traces: ``tests/test_tracer_cuda_dropout.py`` (CUDA-emulating kernel).
    """
    return 1 if spec.hardware.device_type is DeviceType.CUDA else 4


def matmul4bit_backward_weight(spec: TrainingSpec, out_features: int, in_features: int) -> tuple[int, int, int]:
    """What ``MatMul4Bit.backward`` makes of one 4-bit weight (bitsandbytes 0.50.2 ``autograd/_functions.py``:
    ``dequantize_4bit(B, ctx.state).to(grad_output.dtype)``): the compute dtype's bytes per element, the cast
    weight's bytes and the load-dtype dequantized copy's (0 where the load dtype is the compute dtype:
    ``Tensor.to`` returns self).

    Args:
        spec: A run with a quantized base.
        out_features: The weight's rows.
        in_features: The weight's columns.

    Returns:
        ``(compute dtype bytes, cast weight bytes, dequantized copy bytes)``.
    """
    quant = spec.quant
    comp = 4 if quant is None or quant.compute_dtype is None else quant.compute_dtype.nbytes  # None: fp32
    load = spec.precision.load_dtype.nbytes
    return comp, comp * out_features * in_features, (load * out_features * in_features if load != comp else 0)


def _targets(lora: LoraSpec) -> frozenset[str]:
    return wrapped_linears(lora, _ALL)


def _adapters(lora: LoraSpec, hits: int, width: int, autocast: bool, input_kept: bool, mask: int) -> int:
    """Bytes per token the LoRA branches of ``hits`` targets reading one ``width``-wide fp32 tensor save
    (``mask``: :func:`lora_dropout_mask_bytes`)."""
    if not hits:
        return 0
    drop = lora.dropout > 0
    if drop:
        # dropout mask per adapter (CPU: fp32 empty_like noise; CUDA: bool); its fp32 output is saved by lora_A,
        # or its bf16 cast
        per_input = mask * width + (2 * width if autocast else 4 * width)
        total = hits * per_input
    elif autocast:
        total = hits * 2 * width  # each lora_A casts the input to bf16 (trace: _to_copy per adapter)
    else:
        total = 0 if input_kept else 4 * width  # the fp32 input itself, shared by the adapters reading it
    return total + hits * (2 if autocast else 4) * lora.r  # lora_A output, saved by lora_B


def qlora_layer_saved_per_token(spec: TrainingSpec, eager: bool) -> tuple[int, int]:
    """(bytes per token, bytes per token per position of the s² term) one QLoRA decoder layer saves.

    Args:
        spec: A spec for which :func:`qlora_formula_applies`.
        eager: Eager attention (else SDPA).

    Returns:
        The per-token bytes and the eager-attention s² coefficient.
    """
    lora = spec.lora
    if lora is None:
        return 0, 0
    sh = spec.model.shape
    autocast = spec.precision.mixed_precision is not MixedPrecision.NO
    t = _targets(lora)
    h, a = sh.hidden_size, sh.num_heads
    q, kv = sh.num_heads * sh.head_dim, sh.num_kv_heads * sh.head_dim
    e = 2 if autocast else 4  # dtype of what attention saves (autocast casts q, k, v to bf16)
    total = 2 * (4 * h + 4)  # each RMSNorm saves its fp32 input and rsqrt (trace: add, rsqrt)
    mask = lora_dropout_mask_bytes(spec)
    total += _adapters(lora, len(t & set(_QKV)), h, autocast, False, mask)
    if eager:
        # fp32: rotary q, repeat_kv clones of K and V, transpose(1,2).contiguous() of the output (4 x q);
        # autocast: bf16 casts of q and k^T and the bf16 output copy (trace "qwen2 qlora eager": 3 x q)
        # (the fp32 output copy is kept only by an o_proj adapter reading it itself: no dropout, no autocast;
        # MatMul4Bit saves no input)
        o_copy = 4 * q if "o_proj" in t and lora.dropout == 0 else 0
        total += 12 * q + o_copy if not autocast else 6 * q
        s2 = 4 * a + (2 * a if autocast else 0)  # fp32 softmax (+ its bf16 cast for the second matmul)
    else:
        total += e * (q + 2 * kv) + e * q + 4 * a  # rotary q, k, v (or their casts), SDPA out, logsumexp fp32
        s2 = 0
    total += qlora_saved_after_attention(spec) - (4 * h + 4)  # its post-attention norm counted above
    # Qwen3's per-head q/k RMSNorms read fp32 q and k (Linear4bit's output, + the LoRA branch): each keeps its
    # input and rsqrt; their frozen weights keep nothing (trace Qwen3-8B / Qwen3-32B, 1 x 512, checkpointed:
    # 4·(q + kv) + 4·(heads + kv heads) per token in the top recomputed layer, norms.py)
    total += qk_norm_saved(sh, False, False)
    return total, s2


def qlora_saved_after_attention(spec: TrainingSpec) -> int:
    """Bytes per token a QLoRA layer saves after its attention's output (o_proj's adapter, the post-attention norm,
    the MLP): all freed before the attention's own backward runs (the eager working set, ``layer_saved``)."""
    lora = spec.lora
    if lora is None:
        return 0
    sh = spec.model.shape
    autocast = spec.precision.mixed_precision is not MixedPrecision.NO
    t = _targets(lora)
    h, q, inter = sh.hidden_size, sh.num_heads * sh.head_dim, sh.intermediate_size
    total = 4 * h + 4  # the post-attention RMSNorm's fp32 input and rsqrt (trace: add, rsqrt)
    # o_proj reads the attention output, already saved by SDPA / the contiguous copy
    mask = lora_dropout_mask_bytes(spec)
    total += _adapters(lora, len(t & {"o_proj"}), q, autocast, True, mask)
    total += _adapters(lora, len(t & set(_GATE_UP)), h, autocast, False, mask)
    total += 3 * 4 * inter  # gate and up outputs (fp32: Linear4bit casts back to the input dtype), act(gate)
    return total + _adapters(lora, len(t & {"down_proj"}), inter, autocast, False, mask)  # act*up, down_proj in


def lora_layer_params(spec: TrainingSpec) -> int:
    """LoRA A and B parameters in the decoder layers (autocast caches their bf16 casts until backward)."""
    from fitcheck.core.states import plan_lora

    if spec.lora is None:
        return 0
    return sum(t.params for t in plan_lora(spec).targets if t.entry.per_layer)


def qlora_frozen_head(spec: TrainingSpec) -> bool:
    """QLoRA with the LM head frozen: autocast's bf16 cast of the head input is not saved for backward (traced on
    the families whose QLoRA layer is pinned, and measured on transformers 4.48's Mixtral, whose 4-bit experts are
    ``nn.Linear``: ``benchmarks/mixtral_old_moe.py``, its start of backward as Mistral's)."""
    from fitcheck.core.activations.moe_expert_loop import expert_loop_applies

    lora = spec.lora
    applies = qlora_formula_applies(spec) or (expert_loop_applies(spec) and four_bit_lora(spec) and kbit_upcast(spec))
    return applies and lora is not None and "lm_head" not in lora.modules_to_save


def qlora_cache_after_forward(spec: TrainingSpec, cache: int, *, any_base: bool = False) -> int:
    """Autocast LoRA-weight casts still alive at the start of backward.

    Leaving autocast clears its cache (torch/amp/autocast_mode.py ``__exit__``: ``clear_autocast_cache``); a cast
    survives only when an autograd node saved it. Inside a checkpointed layer nothing is saved, so under full
    checkpointing no cast is left (trace ``llama qlora ckpt autocast``: 5.129 MiB of activations at the start of
    backward, 1.098 MiB less than at the end of forward). ``any_base``: the same rule for an unquantized base.
    """
    act = spec.activations
    if not (any_base or four_bit_lora(spec)) or not act.checkpointing:
        return cache
    layers = spec.model.shape.num_layers
    kept = layers - -(-layers // max(1, act.checkpoint_every_n_layers))  # layers not checkpointed
    return cache * kept // layers


def qlora_backward_working_set(spec: TrainingSpec) -> int:
    """Bytes per token in flight during a recomputed QLoRA layer's backward, besides its saved tensors (under
    autocast; without it the traced moments of ``lora_recompute`` are used on the Llama layer).

    The peak is in the MLP of the last layer (the first one recomputed, every checkpoint still held): the fp32
    gradient of the down_proj input (``MatMul4Bit.backward`` matmul against the dequantized weight), its cast
    back through ``x.to(compute_dtype)`` and their sum with the LoRA branch's gradient, 3 x 4I, less the
    product freed once used (trace ``llama qlora ckpt`` 2-layer minus 1-layer: 10942 B/token at I=1376, 8I =
    11008; under autocast 13609 ≈ 10I, the bf16 LoRA gradients adding 2I).
    """
    autocast = spec.precision.mixed_precision is not MixedPrecision.NO
    return (10 if autocast else 8) * spec.model.shape.intermediate_size
