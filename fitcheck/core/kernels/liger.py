"""Liger-Kernel (liger_kernel 0.8.5): what each patched kernel saves for backward and allocates (pure).

transformers 5.23 ``Trainer.__init__`` calls ``integrations/liger.py apply_liger_kernel(model,
args.liger_kernel_config)`` -> liger's ``_apply_liger_kernel_to_instance(model, **config)``, which looks the
model type up in ``MODEL_TYPE_TO_APPLY_LIGER_FN`` (monkey_patch.py; unknown types: logged, nothing applied) and
calls e.g. ``apply_liger_kernel_to_llama(rope=True, cross_entropy=False, fused_linear_cross_entropy=True,
rms_norm=True, swiglu=True)``. Per kernel, from liger_kernel 0.8.5's source:

* RMSNorm (ops/rms_norm.py ``LigerRMSNormFunction.forward``): ``ctx.save_for_backward(X, W, RSTD)``: the input in
  its own dtype and one fp32 rstd per row (``llama`` / ``gemma`` casting modes). transformers' RMSNorm instead keeps the
  fp32 upcast of the input, the rsqrt and (for a trained weight) the normalised tensor.
* SwiGLU / GEGLU (ops/swiglu.py ``LigerSiLUMulFunction``, ops/geglu.py ``LigerGELUMulFunction``):
  ``ctx.save_for_backward(a, b)``: gate and up outputs; the activation output is recomputed in backward, so the
  ``act(gate)`` tensor transformers' MLP keeps for the product's backward is gone (one I-wide tensor per token).
* RoPE (ops/rope.py ``LigerRopeFunction``): ``ctx.save_for_backward(cos, sin)``, the tables transformers keeps
  too; q and k come out as new tensors as before: no change in saved bytes.
* Fused linear cross-entropy (ops/fused_linear_cross_entropy.py, reduction mean/sum, the path
  ``LigerForCausalLMLoss`` takes): the gradients are computed in the forward, chunk by chunk; ``grad_input``
  (``zeros_like(_input)``) and ``grad_weight`` (``zeros_like(weight)``, only when the head is trained) are saved
  for backward; one ``chunk_size x V`` logits chunk (its gradient written in place) lives at a time, with
  ``chunk_size = next_power_of_2(cdiv(BT, cdiv(V, H)))`` capped at BT; ``loss_1d`` fp32 and a bool target mask.
  No ``b x s x V`` tensor exists.
* Cross-entropy (ops/cross_entropy.py ``LigerCrossEntropyFunction``): patched into ``nn.functional.cross_entropy``;
  transformers' ``ForCausalLMLoss`` still upcasts the logits to fp32, then the kernel writes the gradient into that
  fp32 tensor in place and saves it (``ctx.save_for_backward(_input.detach())``): no log-softmax output.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.spec import LigerSpec, TrainingSpec

LIGER_VERSION = "0.8.5"
# Which families liger_kernel 0.8.5 transformers/monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN patches: each family
# module declares it (``FamilyTraits.liger_patched``, fitcheck/families).
# liger_kernel_config keys the apply functions of those families take (monkey_patch.py signatures); ``geglu`` is
# Gemma's name for the gated MLP.
LIGER_CONFIG_KEYS = ("rope", "rms_norm", "swiglu", "geglu", "fused_linear_cross_entropy", "cross_entropy")
# Bytes per element of the one live logits chunk, by FLCE version: 0.8.5 reuses one ``chunk x V`` buffer in the
# input dtype and writes the gradient in place (2 for bf16). 0.4.2 (ops/fused_linear_cross_entropy.py at tag
# v0.4.2) kept the new bf16 chunk, its ``.float()`` copy and the previous iteration's bf16 gradient alive at once
# (``logits_chunk.float()`` / ``.to(dtype)`` / ``grad_logits_chunk = logits_chunk * alpha``): 2 + 4 + 2 = 8.
FLCE_CHUNK_BYTES_PER_LOGIT = {"0.8.5": None, "0.4.2": 8}


def liger_applies(spec: TrainingSpec) -> LigerSpec | None:
    """The Liger patches in effect: None without ``use_liger_kernel`` or for a model type Liger does not patch."""
    liger = spec.activations.liger
    if liger is None or not spec.model.shape.traits.liger_patched:
        return None
    return liger


def flce_chunk_size(tokens: int, hidden: int, vocab: int) -> int:
    """Rows per chunk: ``next_power_of_2(cdiv(BT, cdiv(V, H)))``, at most BT (chunk_mem_const 1)."""
    inc = -(-vocab // hidden)
    rows = -(-tokens // inc)
    return min(1 << max(0, (rows - 1).bit_length()), tokens)


@dataclass(frozen=True)
class FusedLossBytes:
    """Bytes of a fused/chunked loss at the moments the activation model uses.

    Attributes:
        forward: Peak while the loss runs (end of forward): saved tensors plus the loss's own transients.
        backward_start: Alive when backward starts (what the loss saved for backward, its gradients).
        head_backward: Logits-side bytes alive at the LM head's backward besides its input and weight gradients.
        detail: One line for the report.
    """

    forward: int
    backward_start: int
    head_backward: int
    detail: str


def flce_bytes(
    tokens: int,
    hidden: int,
    vocab: int,
    *,
    input_bytes: int,
    logit_bytes: int,
    weight_bytes: int,
    head_trained: bool,
    chunk_bytes_per_logit: int | None = None,
) -> tuple[int, int, int]:
    """(forward peak, saved for backward, chunk buffer) of one Liger fused linear cross-entropy call.

    Args:
        tokens: BT, rows of the flattened hidden states.
        hidden: H.
        vocab: V.
        input_bytes: Element bytes of the hidden states (and of ``grad_input``).
        logit_bytes: Element bytes of a logits chunk (the matmul's output dtype).
        weight_bytes: Element bytes of the head weight (and of ``grad_weight``, accum_dtype None).
        head_trained: The head weight requires a gradient (``grad_weight`` is allocated).
        chunk_bytes_per_logit: Live bytes per element of the chunk; None = 0.8.5's ``logit_bytes``.

    Returns:
        The forward peak (saved + ``loss_1d`` + target mask + one chunk), the saved bytes, and the chunk bytes.
    """
    chunk = flce_chunk_size(tokens, hidden, vocab)
    per_logit = logit_bytes if chunk_bytes_per_logit is None else chunk_bytes_per_logit
    buffer = chunk * vocab * per_logit
    saved = tokens * hidden * input_bytes + (vocab * hidden * weight_bytes if head_trained else 0)
    forward = saved + 4 * tokens + tokens + buffer  # loss_1d fp32, target != ignore_index mask
    return forward, saved, buffer


def liger_norm_saved(hidden: int, residual_bytes: int) -> int:
    """Bytes per token one Liger RMSNorm saves: its input (own dtype) + the fp32 rstd of the row."""
    return residual_bytes * hidden + 4


def liger_mlp_delta(spec: TrainingSpec, act_bytes: int) -> int:
    """Bytes per token per layer the Liger gated-MLP kernel does not save (the ``act(gate)`` output).

    0 for MoE layers: transformers 5 Mixtral experts are replaced by Liger's fused-MoE kernel (monkey_patch.py
    ``LigerExperts``), not modelled here (a finding says so).
    """
    liger = liger_applies(spec)
    sh = spec.model.shape
    if liger is None or not liger.swiglu or sh.num_experts or sh.mlp_activation != "swiglu":
        return 0
    return act_bytes * sh.intermediate_size
