"""What the norms beyond the Llama recipe keep: fp32-product RMSNorms, q/k norms, post-norm-only layers (pure).

Which norms a model has is its ``ModelShape.traits`` (``norm_kind``, ``norm_placement``, ``qk_norm``; filled from
:mod:`fitcheck.families`). Read off fake-tensor traces of the transformers 5.23 models
(``fitcheck.torch_adapters.tracer``; OLMo-2-1124-7B and gpt-oss-20b at real width) and pinned by
``tests/test_activations_recent.py`` and the formula-vs-trace grid (``benchmarks/formula_vs_trace.py``). Notation
as in the decoder module: e element bytes of the activations, h hidden, q = heads·head_dim, kv =
kv_heads·head_dim; bytes per token per layer.

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

Per-head q/k norms: ``Qwen3Attention.forward`` (transformers 5.23 models/qwen3/modeling_qwen3.py) runs
``q_norm`` / ``k_norm`` (``Qwen3RMSNorm`` over ``head_dim``) on the q / k projections before rotary. Each norm
keeps what any
``*RMSNorm`` keeps (fitcheck.core.activations.decoder ``_norm_saved``) with one ``rsqrt`` per head instead of
per token: the fp32 input 4·w, rsqrt 4 per row, and, for a trained weight, the normalised tensor (2·w when the
activations are 16-bit: a 16-bit model or fp32 weights under autocast; 4·w in plain fp32). The q_proj /
k_proj outputs themselves are no longer kept: rotary reads the norm outputs, counted in their place. Read off
fake-tensor traces (``fitcheck.torch_adapters.tracer``) and pinned by tests/test_activations_recent.py:
6·(q+kv) + 4·(a+kv_heads) bytes per token per layer, bf16 full.
"""

from __future__ import annotations

from fitcheck.spec import ModelShape, NormKind, NormPlacement, QkNorm, TrainingSpec


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


def _gemma_qk(shape: ModelShape) -> bool:
    """Gemma3RMSNorm q/k norms (modeling_gemma3.py) compute in fp32 and scale by (1 + weight.float()): a trained
    weight keeps the fp32 normalised tensor (4·w, not a 16-bit copy), and (1 + weight) is an fp32 (head_dim,)
    tensor per norm."""
    return shape.traits.qk_norm is QkNorm.PER_HEAD and shape.traits.norm_kind is NormKind.RMS_ONE_PLUS


def qk_norm_saved(shape: ModelShape, half_activations: bool, trainable_weight: bool) -> int:
    """Bytes per token per layer the q_norm and k_norm of one attention layer keep.

    Args:
        shape: The model's shape (heads, kv heads, head_dim).
        half_activations: The projections' outputs are 16-bit (16-bit weights, or autocast); otherwise fp32.
        trainable_weight: The norm weights are trained (full fine-tuning): the normalised tensor is kept.

    Returns:
        0 for families without per-head q/k norms; OLMo-2's full-width q/k norms (:func:`olmo2_qk_norms`).
    """
    if shape.traits.qk_norm is QkNorm.FULL_WIDTH:
        return olmo2_qk_norms(shape, trainable_weight)
    if shape.traits.qk_norm is not QkNorm.PER_HEAD:
        return 0
    total = 0
    for heads in (shape.num_heads, shape.num_kv_heads):
        width = heads * shape.head_dim
        total += 4 * width + 4 * heads
        if trainable_weight:
            total += (2 if half_activations and not _gemma_qk(shape) else 4) * width
    return total


def qk_norm_outside(shape: ModelShape) -> int:
    """Bytes outside the per-token terms: Gemma-3's fp32 ``(1 + weight)`` of each q/k norm, per layer."""
    return 4 * shape.head_dim * 2 * shape.num_layers if _gemma_qk(shape) else 0


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
