"""What OLMo-2 and gpt-oss layers keep beyond the Llama recipe of ``fitcheck.core.activations.decoder`` (pure).

Read off fake-tensor traces of the transformers 5.23 models (``fitcheck.torch_adapters.tracer``: per-op listings
of the tensors alive at the end of forward, 2 layers minus 1 layer, OLMo-2-1124-7B and gpt-oss-20b at real
width) and pinned by ``tests/test_activations_recent.py`` and the formula-vs-trace grid
(``benchmarks/formula_vs_trace.py olmo2 gpt_oss``). Notation as in the decoder module: e element bytes of the
activations, h hidden, q = heads·head_dim, kv = kv_heads·head_dim, I intermediate, a heads, k top-k, E experts;
bytes per token per layer.

- Norms (``Olmo2RMSNorm`` models/olmo2/modeling_olmo2.py l.59-64, ``GptOssRMSNorm`` models/gpt_oss/
  modeling_gpt_oss.py l.56-61): ``(self.weight * hidden_states).to(input_dtype)`` multiplies the weight with the
  fp32 normalised tensor, so a trained weight keeps that fp32 tensor (4w), not Llama's 16-bit copy (2w); with
  the fp32 input copy and the per-row rsqrt: 4w + 4 (+ 4w trained), in a 16-bit model as in fp32.
- OLMo-2 (modeling_olmo2.py): no norm before attention or MLP; ``post_attention_layernorm`` /
  ``post_feedforward_layernorm`` normalise the sublayer outputs (l.307, l.313), so the q/k/v and MLP linears read
  the residual stream itself, as many bytes as Llama's norm outputs. ``q_norm`` / ``k_norm`` are RMSNorms over
  the whole q / kv width (l.213-214, one rsqrt per token each). The rotary tables are fp32 whatever the model
  dtype (``Olmo2RotaryEmbedding.forward`` l.108-113 returns them uncast; ``apply_rotary_pos_emb`` casts the
  rotated q / k back, l.177).
- gpt-oss eager attention (``eager_attention_forward`` l.227-255): the softmax runs over s + 1 columns (the
  per-head sink logit is concatenated, l.243-250), and ``combined_logits.max(dim=-1)`` keeps its int64
  indices for backward (b, a, s, 1). Its rotary tables are (1, s, head_dim / 2): ``emb = freqs``, no cat
  (``GptOssRotaryEmbedding.forward`` l.186-192), in the model dtype.
- gpt-oss experts run ``grouped_mm_experts_forward`` (transformers 5.23 integrations/moe.py l.424-537; the
  default ``grouped_mm``, modeling_utils.py l.1884) with ``GptOssExperts._apply_gate`` (modeling_gpt_oss.py
  l.81-87): per routed copy the gathered input (h, trained experts only), the biased gate_up output (2I,
  ``clamp`` keeps its input), the clamped gate (I), sigmoid (I), ``up + 1`` (I), the glu (I), the gated product
  (I, down_proj's input: trained experts only) and the biased down output (h, the routing-weight mul keeps it).
  The router (``GptOssTopKRouter.forward`` l.125-129) keeps the top-k ids (int64) and the softmax over the top-k
  values (e); the dispatch keeps the sort permutation (int64; the sorted expert ids too when the expert biases
  are trained: ``gate_up_proj_bias[expert_ids_g]``), ``perm // k`` and the inverse permutation (int64), and the
  gathered routing weights (e). No softmax over all E experts is kept, unlike Mixtral.
"""

from __future__ import annotations

from fitcheck.spec import AttentionKind, ModelShape, NormPlacement, RotaryTables, TrainingSpec


def product_norm_saved(width: int, trainable_weight: bool) -> int:
    """Bytes per token one OLMo-2 / gpt-oss RMSNorm over ``width`` features keeps (any model dtype).

    fp32 input copy (``hidden_states.to(torch.float32)``, kept by ``pow`` and ``mul``) 4w, ``rsqrt`` 4 per row,
    and for a trained weight the fp32 ``hidden_states * rsqrt`` that ``self.weight * hidden_states`` keeps (4w).
    """
    return 4 * width + 4 + (4 * width if trainable_weight else 0)


def olmo2_qk_norms(shape: ModelShape, trainable_weight: bool) -> int:
    """Bytes per token per layer OLMo-2's ``q_norm`` and ``k_norm`` (over the full q / kv width) keep.

    ``query_states = self.q_norm(self.q_proj(hidden_states))`` (modeling_olmo2.py l.227-228): the projections'
    outputs are only read by the norms (their fp32 copies are kept, not the 16-bit outputs).
    """
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return product_norm_saved(q, trainable_weight) + product_norm_saved(kv, trainable_weight)


def rotary_tables(shape: ModelShape, seq: int, half_model: bool) -> int:
    """Bytes of the cos and sin tables every layer reads, per micro-batch (shape (1, s, rot)).

    Llama recipe: rot = head_dim·partial_rotary_factor in the model dtype (``cos.to(x.dtype)``); OLMo-2: fp32
    tables; gpt-oss: rot = head_dim / 2 (see the module docstring).
    """
    if shape.traits.rotary is RotaryTables.HALF_HEAD_DIM:
        return 2 * seq * (shape.head_dim // 2) * (2 if half_model else 4)
    rot = max(1, round(shape.head_dim * shape.partial_rotary_factor))
    return 2 * seq * rot * (4 if shape.traits.rotary is RotaryTables.FP32 else 2 if half_model else 4)


def sink_attention_extra(shape: ModelShape, e: int) -> int:
    """Bytes per token per layer gpt-oss's eager attention keeps besides Llama's s² terms: the sink column of
    the softmax output (e·a) and the int64 indices of ``combined_logits.max(dim=-1)`` (8·a); 0 otherwise."""
    return (e + 8) * shape.num_heads if shape.traits.attention is AttentionKind.SINKS else 0


def gpt_oss_moe_saved(shape: ModelShape, e: int, full: bool) -> int:
    """Bytes per token per layer gpt-oss's router and experts keep (``grouped_mm`` experts; module docstring).

    Args:
        shape: The model's shape (hidden, intermediate, top-k).
        e: Element bytes of the activations (the router and experts run in the model / autocast dtype).
        full: The router and experts are trained (full fine-tune); otherwise they are frozen (LoRA on the
            attention linears: the router's input still needs a gradient, so its ids and scores are kept).
    """
    h, inter, k = shape.hidden_size, shape.intermediate_size, shape.experts_per_token
    router_in = e * h if full else 0  # F.linear(hidden_states, weight, bias) keeps its input for the weight
    # top-k ids, sort permutation, perm // k, inverse permutation (int64); sorted ids for the trained biases
    ids = 8 * k * (5 if full else 4)
    scores = 2 * e * k  # softmax over the top-k logits, and its gather sample_weights[perm]
    routed = 2 * h + 7 * inter if full else h + 6 * inter
    return router_in + ids + scores + e * k * routed


def embedding_cast_cached(spec: TrainingSpec, autocast: bool) -> int:
    """Bytes of the autocast-cached 16-bit cast of OLMo-2's embedding output, alive until autocast exits.

    With checkpointing, ``activation_checkpointing_enable`` calls ``enable_input_require_grads``
    (transformers 5.23 modeling_utils.py l.3181-3189): the frozen embedding's output becomes a leaf that
    requires a gradient, and autocast caches the casts of such fp32 leaves (aten/src/ATen/autocast_mode.cpp
    ``cached_cast``: ``arg.requires_grad() && arg.is_leaf()``). OLMo-2's first q/k/v projections read that
    output directly (no norm before attention), so one (b, s, h) 16-bit cast stays in the cache through the
    loss (trace: ``_to_copy`` bf16 from layer 0's q_proj at the end of forward, gone at the start of backward).
    """
    sh = spec.model.shape
    frozen_embedding = spec.lora is not None and spec.quant is None
    post_only = sh.traits.norm_placement is NormPlacement.POST
    if not post_only or not (autocast and frozen_embedding and spec.activations.checkpointing):
        return 0
    return 2 * spec.batch.micro_batch * spec.batch.seq_len * sh.hidden_size
