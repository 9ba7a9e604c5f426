"""Apple's Cut Cross-Entropy (cut_cross_entropy 25.1.1): what ``linear_cross_entropy(impl="cce")`` allocates.

Read off the package source (cce.py ``LinearCrossEntropyFunction``, cce_lse_forward.py, cce_backward.py):

* forward: ``cce_lse_forward_kernel`` returns ``lse`` (``new_full((B,), -inf, fp32)``) and, when a gradient is
  needed and ``filter_eps`` is set (the default ``"high"``), ``logit_avg`` (``new_full((V,), 0, fp32)``);
  ``indexed_neg_dot_forward_kernel`` returns the target logits (fp32, B), added to ``lse`` in place.
  ``ctx.save_for_backward(e, c, lse, targets, valids, logit_avg)``: the hidden states themselves are saved (the
  LM head input), no logits exist. ``valids`` (utils.py ``_build_flat_valids``, ``shift=True`` as the transformers
  patch calls it) is int32, one per token.
* backward (``cce_backward_kernel``): ``de = zeros_like(e)``, ``dc = zeros_like(c, dtype=e.dtype)`` when the
  classifier is trained, int32 locks, and with gradient filtering the vocabulary ordering
  (cce.py ``sort_logit_avg``: ``argsort(logit_avg).to(int32)``, 4 B per vocabulary entry). ``e`` must be
  16-bit ("Backwards requires embeddings to be bf16 or fp16").

Integrated in transformers models by ``cut_cross_entropy.transformers.cce_patch`` (axolotl's
``cut_cross_entropy`` plugin), not by a TrainingArguments field: ``--loss cce``.
"""

from __future__ import annotations

CCE_VERSION = "25.1.1"


def cce_bytes(
    tokens: int,
    hidden: int,
    vocab: int,
    *,
    input_bytes: int,
    head_trained: bool,
) -> tuple[int, int, int]:
    """(forward peak, saved for backward, backward extra) of one Cut Cross-Entropy call.

    Args:
        tokens: B, rows of the flattened hidden states.
        hidden: D.
        vocab: V.
        input_bytes: Element bytes of the hidden states (16-bit: CCE's backward requires it).
        head_trained: The classifier requires a gradient (``dc`` is allocated).

    Returns:
        Forward peak: lse + target logits (fp32 B each), logit_avg (fp32 V), valid-token indices (int32 B);
        saved: lse, valid indices and logit_avg (the hidden states are counted by the caller); backward extra:
        ``de`` (B x D), ``dc`` (V x D in the input dtype) and the vocabulary ordering (int32 V).
    """
    saved = 4 * tokens + 4 * tokens + 4 * vocab
    forward = saved + 4 * tokens  # the indexed negative dot, fp32 B, until nll = neg_dot.add_(lse) is reduced
    backward = tokens * hidden * input_bytes + (vocab * hidden * input_bytes if head_trained else 0) + 4 * vocab
    return forward, saved, backward
