"""Which implementation computes the LM loss, and the bytes of the fused ones (pure).

``--loss`` values (``fitcheck.spec.LOSS_IMPLEMENTATIONS``):

* ``torch`` (default; ``standard`` is read as an alias): transformers 5.23 ``loss_utils.ForCausalLMLoss`` on the
  full logits (``logits.float()``, ``F.cross_entropy``): the ``b x s x V`` terms of ``fitcheck.core.activations``.
* ``liger-flce``: Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction`` (what ``--use_liger_kernel`` applies
  by default; alone, e.g. axolotl's ``liger_fused_linear_cross_entropy``): ``fitcheck.core.kernels.liger``.
* ``cce``: Apple's Cut Cross-Entropy (``cut_cross_entropy.transformers.cce_patch``, axolotl's
  ``cut_cross_entropy`` plugin): ``fitcheck.core.kernels.cce``.

* ``full-logits`` (``--trainer dpo`` only): the policy's log-probs from the full-vocabulary logits upcast to fp32
  instead of TRL 1.16's chunked LM head, as LLaMA-Factory@ff6d4d1's ``CustomDPOTrainer`` computes them
  (``train/dpo/trainer.py`` ``concatenated_forward`` L219-253, ``train/trainer_utils.py`` ``get_batch_logps``):
  no fused row here (full logits, like ``torch``); the trainer's bytes are ``fitcheck.core.trainers.full_logits``.

``chunked`` is refused by the reader: it names no implementation (torchtune's ``CEWithChunkedOutputLoss``,
torchtitan's chunked loss and Liger's FLCE allocate different tensors).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fitcheck.core.kernels.cce import CCE_VERSION, cce_bytes
from fitcheck.core.kernels.liger import LIGER_VERSION, FusedLossBytes, flce_bytes, liger_applies
from fitcheck.errors import NotModelledError
from fitcheck.spec import LOSS_IMPLEMENTATIONS, Role, TrainingSpec


def effective_loss(spec: TrainingSpec) -> str:
    """The loss implementation that runs: Liger's FLCE when ``use_liger_kernel`` applies it, else ``--loss``."""
    liger = liger_applies(spec)
    if liger is not None and liger.fused_linear_cross_entropy:
        return "liger-flce"
    return spec.activations.loss


def liger_cross_entropy(spec: TrainingSpec) -> bool:
    """Liger's unfused cross-entropy replaces ``F.cross_entropy`` (``liger_kernel_config`` cross_entropy=true)."""
    liger = liger_applies(spec)
    return liger is not None and liger.cross_entropy and not liger.fused_linear_cross_entropy


def head_trained(spec: TrainingSpec) -> bool:
    """Whether the LM head weight gets a gradient (full fine-tune, ``modules_to_save``, a trainable pattern)."""
    if spec.lora is not None:
        return "lm_head" in spec.lora.modules_to_save
    if spec.quant is not None:
        return False
    if spec.freeze is not None:
        role = Role.EMBEDDING if spec.model.shape.tied_embeddings else Role.LM_HEAD  # tied: the embedding is the head
        head = [p.name for p in spec.model.params if p.role is role]
        return any(fnmatch.fnmatchcase(n, pat) for n in head for pat in spec.freeze.trainable)
    return True


@dataclass(frozen=True)
class _LossShapes:
    """What every fused loss reads: tokens, hidden and vocabulary sizes, element bytes, the shared terms."""

    b: int
    s: int
    h: int
    v: int
    act_bytes: int
    residual_bytes: int
    labels: int  # labels padded by one, the shifted copy, the loss scalars (int64)
    cast: int  # autocast's 16-bit copy of the fp32 head weight during the matmuls
    trained: bool  # the LM head weight gets a gradient

    @property
    def tokens(self) -> int:
        """Positions in the micro-batch."""
        return self.b * self.s


def _liger_flce(x: _LossShapes) -> FusedLossBytes:
    """Liger-Kernel's fused linear cross-entropy (``fitcheck.core.kernels.liger``)."""
    hidden = x.tokens * x.h * x.residual_bytes  # the final-norm output, alive while the loss runs
    fwd, saved, buffer = flce_bytes(x.tokens, x.h, x.v, input_bytes=x.residual_bytes, logit_bytes=x.act_bytes,
                                    weight_bytes=x.residual_bytes, head_trained=x.trained)
    return FusedLossBytes(
        forward=fwd + hidden + x.labels + x.cast,
        backward_start=saved + 8,
        head_backward=0,  # its backward hands back grad_input/grad_weight: the head moment counts both
        detail=f"Liger {LIGER_VERSION} fused linear cross-entropy: no {x.b}x{x.s}x{x.v} logits; a "
        f"{buffer // max(1, x.v * x.act_bytes)}x{x.v} logits chunk, grad_input"
        + (" and grad_weight" if x.trained else "") + " computed in the forward",
    )


def _cce(x: _LossShapes) -> FusedLossBytes:
    """Apple's Cut Cross-Entropy (``fitcheck.core.kernels.cce``)."""
    e16 = 2  # CCE's backward requires 16-bit hidden states (cce_backward.py assert)
    fwd, saved, bwd_extra = cce_bytes(x.tokens, x.h, x.v, input_bytes=e16, head_trained=x.trained)
    # saved e (+ the fp32 norm output)
    kept = x.tokens * x.h * e16 + (x.tokens * x.h * 4 if x.residual_bytes == 4 else 0)
    return FusedLossBytes(
        forward=fwd + kept + x.labels + x.cast,
        backward_start=saved + kept + bwd_extra + 8,
        head_backward=0,  # de/dc are the head's input and weight gradients, counted by the head moment
        detail=f"Cut Cross-Entropy {CCE_VERSION}: no {x.b}x{x.s}x{x.v} logits; lse/logit_avg in the forward, "
        "de" + (" and dc" if x.trained else "") + " in the backward",
    )


# One row per ``LossKind``: the bytes of its fused head + loss, or None for ``torch`` (the full-logits terms of
# ``fitcheck.core.activations``). A loss without a row is an error, never another loss's bytes.
LOSSES: Mapping[str, Callable[[_LossShapes], FusedLossBytes] | None] = MappingProxyType({
    "torch": None,
    "liger-flce": _liger_flce,
    "cce": _cce,
    "full-logits": None,  # full logits; the DPO step's own terms: fitcheck.core.trainers.full_logits
})
assert set(LOSSES) == set(LOSS_IMPLEMENTATIONS), "every LossKind needs a row in fitcheck/core/kernels/loss.py"


def fused_loss(spec: TrainingSpec, *, act_bytes: int, residual_bytes: int, autocast: bool) -> FusedLossBytes | None:
    """Bytes of the LM head + loss when a fused implementation replaces them; None for ``torch``.

    Args:
        spec: The training spec.
        act_bytes: Element bytes of matmul outputs (16-bit under autocast or a 16-bit model).
        residual_bytes: Element bytes of the residual stream, the final-norm output and the head weight.
        autocast: fp32 weights under 16-bit autocast (the head weight is cast per matmul: 2 B/param alive).

    Returns:
        The loss's forward peak, what it keeps for backward, and what is alive at the head's backward.

    Raises:
        NotModelledError: A loss implementation without a row in :data:`LOSSES`.
    """
    loss = effective_loss(spec)
    if loss not in LOSSES:
        raise NotModelledError(f"loss implementation {loss!r}: not modelled; expected one of "
                               + ", ".join(LOSSES) + " (fitcheck/core/kernels/loss.py LOSSES)")
    row = LOSSES[loss]
    if row is None:
        return None
    sh = spec.model.shape
    b, s, h, v = spec.batch.micro_batch, spec.batch.seq_len, sh.hidden_size, sh.vocab_size
    return row(_LossShapes(
        b=b, s=s, h=h, v=v, act_bytes=act_bytes, residual_bytes=residual_bytes,
        labels=b * (s + 1) * 8 + b * s * 8 + 8, cast=2 * v * h if autocast else 0, trained=head_trained(spec)))
