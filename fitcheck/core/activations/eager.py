"""Eager attention's working set: the s² tensors alive at its worst ops, forward and backward (pure, no torch).

What a layer *saves* for eager attention (the fp32 softmax and its 16-bit cast, ``layer_saved``; gpt-oss's sinks,
``attention_variants.eager_scores``) is not all it holds: the top layer's forward softmax and every layer's softmax
backward hold more s² tensors for a moment, and under checkpointing every layer holds the 4-D causal mask. This
module is where those moments are written (:func:`eager_working_set` per score position, :func:`eager_moments` per
micro-batch); ``decoder`` turns them into the end-of-forward peak and ``backward`` into each layer's attention
moment. Before them the formula was -46 .. -85 % at 32k tokens on Llama-3.1-8B with checkpointing
(``benchmarks/envelope_ranges.py --attn eager``) and -94.7 % during backward on Mistral-7B-v0.1 without
(its small vocabulary lets the bottom layer's softmax backward, not the embedding's, set the phase).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.activations.layer_saved import eager_layer_terms, layer_saved_per_token
from fitcheck.core.kernels import activation_view
from fitcheck.spec import AttentionKind, DeviceType, Dtype, ModelShape, Role, TrainingSpec


def eager_working_set(shape: ModelShape, e: int, half_model: bool,
                      half_softmax: bool = False) -> tuple[int, int] | None:
    """Bytes per score position (b·s² of them) alive at the worst op of one layer's eager attention.

    transformers 5.23 ``eager_attention_forward`` (modeling_llama.py l.180-202, copied by Mistral, Qwen2/3, Gemma,
    Phi-3, Granite, OLMo-2): ``matmul(q, k^T) * scaling``, ``+ attention_mask``, ``softmax(dtype=float32)
    .to(query.dtype)``, ``dropout`` (the identity at ``attention_dropout`` 0.0, every catalog config:
    aten/src/ATen/native/Dropout.cpp ``_dropout_impl`` returns its input for p == 0), ``matmul(weights, v)``.

    - Forward, at ``_softmax``: a 16-bit model's masked scores (e), aten ``softmax``'s fp32 copy of them
      (aten/src/ATen/native/SoftMax.cpp ``softmax``: ``input_.toType(dtype)``, skipped only for a CUDA fp16 input,
      which takes ``_softmax(half_to_float=True)``) and the fp32 output: 10·a. An fp32 model: the scaled scores and
      their masked sum, 8·a (no copy). Autocast: the 16-bit scores plus the fp32 mask promote to fp32, so the
      softmax makes no copy: the sum and the output, 8·a.
    - Backward, at ``_softmax_backward_data`` (torch/csrc/autograd/generated: ``_softmax`` saves its result): the
      saved fp32 probabilities, the fp32 gradient of them (``_to_copy`` backward of the 16-bit cast, or the
      matmul's gradient in fp32) and the fp32 gradient of the scores: 12·a; the 16-bit cast the ``matmul`` with V
      saved is freed once that matmul's backward ran. A CUDA fp16 softmax's gradient is fp16: 10·a.

    Traced (``fitcheck.torch_adapters.tracer``, per-op listings of a 2-layer Llama, 4 heads, 1024 tokens): bf16
    10·a / 12·a, fp32 8·a / 12·a, fp32 under bf16 autocast 8·a / 12·a, checkpointed or not; the (b, 1, s, s) mask
    comes on top (``layer_saved``).

    Args:
        shape: The model's shape.
        e: Element bytes of the attention scores (2 under a 16-bit model or autocast).
        half_model: Whether the model (and so its additive mask) is 16-bit.
        half_softmax: A CUDA fp16 model (no fp32 copy in forward, fp16 score gradient in backward).

    Returns:
        (forward, backward) bytes per score position, or None for the variants whose eager softmax differs
        (soft-capping, sinks, ALiBi, latent attention): not modelled.
    """
    if shape.traits.attention is not AttentionKind.STANDARD:
        return None
    a = shape.num_heads
    converts = e == 2 and half_model and not half_softmax
    return (10 if converts else 8) * a, (10 if half_softmax else 12) * a


@dataclass(frozen=True)
class EagerMoments:
    """Eager attention's worst ops (:func:`eager_working_set`), in bytes of one micro-batch.

    Attributes:
        forward: Alive at the top layer's forward softmax beyond ``activations.saved`` at the end of forward.
        backward: Alive at a layer's softmax backward beyond that layer's MLP-backward moment, gradients apart
            (``backward.backward_moments``): the s² working set less the layer's saved s² terms, less what the
            layer saved after its attention (freed by then), plus the residual-stream gradient.
        mask: The 4-D causal mask every checkpointed layer holds as an argument (0 without checkpointing).
        made: Gradient bytes one layer has made before its attention's backward (o_proj, the MLP, post norms) in
            a full fine-tune, 0 otherwise.
        weights: The attention weights the top checkpointed layer still holds during its MLP forward: the decoder
            layer unpacks ``hidden_states, _ = self.self_attn(...)`` (modeling_llama.py l.297), so the returned
            ``attn_weights`` (the probabilities in the query's dtype) live until the layer returns (0 without
            checkpointing, where they are saved anyway).
    """

    forward: int
    backward: int
    mask: int
    made: int
    weights: int


def eager_moments(spec: TrainingSpec) -> EagerMoments | None:
    """Eager attention's forward and backward working set (Llama-recipe layers, 4-bit QLoRA included); None where
    it is not modelled (SDPA, the LayerNorm blocks, latent attention, soft-capping, sinks, quantized bases other
    than 4-bit QLoRA with k-bit preparation: ``layer_saved.eager_layer_terms``).

    Traced on a 2-layer Llama (:func:`eager_working_set`); checked on the real widths by
    ``benchmarks/envelope_ranges.py --attn eager`` and ``tests/test_eager_working_set.py``.
    """
    spec = activation_view(spec)
    sh = spec.model.shape
    m = eager_layer_terms(spec)
    if m is None:
        return None
    fp16_cuda = spec.hardware.device_type is DeviceType.CUDA and (
        spec.precision.load_dtype is Dtype.FLOAT16 and m.half_model)
    ws = eager_working_set(sh, m.e, m.half_model, fp16_cuda)
    if ws is None:
        return None
    fwd, bwd = ws
    b, s, h = spec.batch.micro_batch, spec.batch.seq_len, sh.hidden_size
    q, kv = sh.num_heads * sh.head_dim, sh.num_kv_heads * sh.head_dim
    _, s2 = layer_saved_per_token(spec)
    full = spec.lora is None and spec.quant is None
    after = m.after
    mask = b * s * s * (2 if m.half_model else 4) * sh.traits.eager_mask_kinds  # (b, 1, s, s), model dtype
    ckpt = spec.activations.checkpointing
    # activations.saved holds the final norm's saved tensors and the LM head's input, not made yet (trace)
    forward = -m.final_norm * b * s
    if ckpt:
        # the top layer recomputes nothing yet: besides every checkpoint, its norm output, q, the repeat_kv clones
        # of K and V and the rotary K / projected V they came from (trace: mul, add, clone x 2, add, mm); under
        # autocast q and k leave the rotary in fp32 (bf16 x fp32 cos/sin), v stays bf16
        qk = 4 if m.autocast else m.e
        clones = (qk + m.e) * q if kv != q else 0
        forward += fwd * b * s * s + (m.r * h + qk * (q + kv) + m.e * kv + clones) * b * s
    else:
        # the top layer's saved s² terms and what it saves after its attention are in activations.saved
        forward += (fwd - s2) * b * s * s + mask - after * b * s
    made = 0
    if full and spec.freeze is None:
        own = ("q_proj", "k_proj", "v_proj", "qkv_proj", "input_layernorm", "q_norm", "k_norm")
        made = sum(p.numel_each for p in spec.model.params
                   if p.per_layer and p.role is not Role.EMBEDDING and p.module not in own
                   and "visual" not in p.name and "vision" not in p.name) * spec.precision.load_dtype.nbytes
    # the layer moments count every layer below as saving q.layer: the first one saves less (LoRA, no checkpointing)
    backward = (bwd - s2) * b * s * s + (m.r * h - after - m.first_unsaved) * b * s
    weights = (2 if m.half_model else 4) * sh.num_heads * b * s * s if ckpt else 0  # query dtype (trace)
    return EagerMoments(forward, backward, mask if ckpt else 0, made, weights)
