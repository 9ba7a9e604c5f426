"""What attention variants beyond the Llama recipe keep: sinks, their eager softmax, the rotary tables (pure).

Which variant a model runs is its ``ModelShape.traits`` (``attention``, ``rotary``; :mod:`fitcheck.families`).
Read off fake-tensor traces of the transformers 5.23 models (``fitcheck.torch_adapters.tracer``) and pinned by
``tests/test_activations_recent.py``. Notation as in the decoder module (a heads, e element bytes).

- gpt-oss eager attention (``eager_attention_forward`` l.227-255): the softmax runs over s + 1 columns (the
  per-head sink logit is concatenated, l.243-250), and ``combined_logits.max(dim=-1)`` keeps its int64
  indices for backward (b, a, s, 1). Its rotary tables are (1, s, head_dim / 2): ``emb = freqs``, no cat
  (``GptOssRotaryEmbedding.forward`` l.186-192), in the model dtype.
- Llama-recipe eager attention's working set (:func:`eager_working_set`): the s² tensors alive at the worst op of
  one layer's forward and of its backward, besides what the layer saves (``eager_scores``).
"""

from __future__ import annotations

from fitcheck.spec import AttentionKind, ModelShape, RotaryTables


def rotary_tables(shape: ModelShape, seq: int, half_model: bool) -> int:
    """Bytes of the cos and sin tables every layer reads, per micro-batch (shape (1, s, rot)).

    Llama recipe: rot = head_dim·partial_rotary_factor in the model dtype (``cos.to(x.dtype)``); OLMo-2: fp32
    tables; gpt-oss: rot = head_dim / 2 (see the module docstring).
    """
    if shape.traits.rotary is RotaryTables.HALF_HEAD_DIM:
        return 2 * seq * (shape.head_dim // 2) * (2 if half_model else 4)
    rot = max(1, round(shape.head_dim * shape.partial_rotary_factor))
    return 2 * seq * rot * (4 if shape.traits.rotary is RotaryTables.FP32 else 2 if half_model else 4)


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


def sink_attention_extra(shape: ModelShape, e: int) -> int:
    """Bytes per token per layer gpt-oss's eager attention keeps besides Llama's s² terms: the sink column of
    the softmax output (e·a) and the int64 indices of ``combined_logits.max(dim=-1)`` (8·a); 0 otherwise."""
    return (e + 8) * shape.num_heads if shape.traits.attention is AttentionKind.SINKS else 0


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
