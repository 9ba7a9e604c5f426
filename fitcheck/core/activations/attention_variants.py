"""What attention variants beyond the Llama recipe keep: sinks, their eager softmax, the rotary tables (pure).

Which variant a model runs is its ``ModelShape.traits`` (``attention``, ``rotary``; :mod:`fitcheck.families`).
Read off fake-tensor traces of the transformers 5.23 models (``fitcheck.torch_adapters.tracer``) and pinned by
``tests/test_activations_recent.py``. Notation as in the decoder module (a heads, e element bytes).

- gpt-oss eager attention (``eager_attention_forward`` l.227-255): the softmax runs over s + 1 columns (the
  per-head sink logit is concatenated, l.243-250), and ``combined_logits.max(dim=-1)`` keeps its int64
  indices for backward (b, a, s, 1). Its rotary tables are (1, s, head_dim / 2): ``emb = freqs``, no cat
  (``GptOssRotaryEmbedding.forward`` l.186-192), in the model dtype.
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

