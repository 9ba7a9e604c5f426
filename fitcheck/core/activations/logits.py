"""The loss side of the activations: the vocabulary-sized tensors and labels at the loss (:func:`loss_logits`) and
the logits-side bytes at the LM head's backward (:func:`head_backward_logits`). Every term was read off fake-tensor
traces of the transformers 5.23 models (``fitcheck.torch_adapters.tracer``); pure, no torch; split out of
``layer_saved.py`` unchanged.
"""

from __future__ import annotations

from fitcheck.core.activations.activation_mode import ActivationMode, activation_mode
from fitcheck.core.activations.heads import CLASSIFIER_TASKS, classifier_head_backward, classifier_logits
from fitcheck.core.activations.layernorm_outside import layernorm_logits
from fitcheck.core.activations.qlora import qlora_frozen_head
from fitcheck.core.activations.versions import legacy_logits_extra
from fitcheck.core.kernels import fused_loss, liger_cross_entropy
from fitcheck.core.states import trl_module_cast
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import TrainingSpec


def loss_logits(spec: TrainingSpec) -> tuple[int, int]:
    """(forward peak, start-of-backward) bytes of the vocab-sized tensors and the labels."""
    sh = spec.model.shape
    if sh.task in CLASSIFIER_TASKS:  # no vocabulary-sized tensor (core/heads/classifier.py)
        return classifier_logits(spec, activation_mode(spec).e, spec.lora is None and spec.quant is None)
    m = activation_mode(spec)
    fused = fused_loss(spec, act_bytes=m.e, residual_bytes=m.r, autocast=m.autocast)
    if fused is not None:  # Liger FLCE / Cut Cross-Entropy: no logits (fitcheck/core/kernels)
        return fused.forward, fused.backward_start
    if sh.traits.recipe.layernorm_block:
        return layernorm_logits(spec)
    b, s, v, h = spec.batch.micro_batch, spec.batch.seq_len, sh.vocab_size, sh.hidden_size
    bsv = b * s * v
    labels = b * (s + 1) * 8 + 8  # labels padded by one (loss_utils.ForCausalLMLoss) + loss scalars
    # forward: logits in the model dtype, .float() upcast (a no-op in fp32), log_softmax output fp32
    fwd = (10 if m.e == 2 else 8) * bsv + labels
    if spec.lora is not None or spec.quant is not None:
        fwd += m.e * b * s * h  # final-norm output, held by the CausalLM forward during the loss, not saved
    fwd += legacy_logits_extra(spec, m.e)  # transformers < 4.49: shifted fp32 logits copy (versions.py)
    # start of backward: log_softmax output + its gradient + the fp32 logits gradient (trace: 12·b·s·V + 8)
    bwd = 12 * bsv + 8
    # final_logit_softcapping (configuration_gemma2.py: defaults to 30.0; None turns it off)
    if sh.traits.logit_softcapping:
        # Gemma-2: logits = tanh(logits / cap) * cap; tanh keeps its output, logits-dtype (trace "gemma2 eager":
        # +2·b·s·V at both phases, modeling_gemma2.py Gemma2ForCausalLM.forward)
        fwd, bwd = fwd + m.e * bsv, bwd + m.e * bsv
    if liger_cross_entropy(spec):
        # Liger's cross-entropy writes the fp32 logits gradient in place and saves it: no log-softmax output, its
        # gradient nor a separate logits gradient (kernels/liger.py); backward casts it back to the logits dtype
        fwd -= 4 * bsv
        bwd += (4 + (m.e if m.e == 2 else 0) - 12) * bsv
    if m.autocast:
        # bf16 casts of the LM head weight (none where TRL cast the head to bf16) and input, kept until its backward
        cast = _head_weight_cast(spec) + 2 * b * s * h
        fwd += cast + 4 * b * s * h  # + the fp32 final-norm output, freed once cast
        if qlora_frozen_head(spec):
            cast -= 2 * b * s * h  # frozen head: its backward needs the weight cast only (trace "llama qlora")
        if spec.lora is not None and spec.quant is None and "lm_head" not in spec.lora.modules_to_save:
            # LoRA, fp32 frozen head: the held norm output is the fp32 one counted above, and the input cast is
            # not saved: at the loss only it and the weight cast live (trace "llama fp32 lora autocast")
            cast -= 2 * b * s * h
            fwd -= m.e * b * s * h + 2 * b * s * h
        bwd += cast
    return fwd, bwd


def traced_legacy_logits(spec: TrainingSpec) -> Component | None:
    """The shifted fp32 logits copy of transformers < 4.49 (``versions.legacy_logits_extra``) as a component beside a
    trace's own, or None where the formula adds nothing.

    The tracer runs the installed transformers (5.23: labels padded, no copy), so a trace of an older stack's step
    lacks the copy the formula counts at the forward's loss peak; the same term is added to the traced answer at
    the end of forward, where :func:`loss_logits` adds it (the causal-LM loss of the Llama-style recipe, transformers'
    own loss: no classifier head, fused loss or LayerNorm block, for which the formula adds nothing either).
    """
    sh = spec.model.shape
    if sh.task in CLASSIFIER_TASKS or sh.traits.recipe.layernorm_block:
        return None
    m = activation_mode(spec)
    if fused_loss(spec, act_bytes=m.e, residual_bytes=m.r, autocast=m.autocast) is not None:
        return None
    extra = legacy_logits_extra(spec, m.e)
    if not extra:
        return None
    return Component(
        "logits.legacy_shift_copy", Category.LOGITS, Location.DEVICE, {Phase.FORWARD_END: extra},
        "transformers < 4.49 loss_utils.ForCausalLMLoss / model forward: shift_logits = logits[..., :-1, "
        ":].contiguous() in fp32 (removed by PR #35646, 4.49.0); added to the trace of the installed transformers",
        f"4·b·(s-1)·V = {extra:,} B at the loss (--stack transformers={spec.stack.get('transformers')})",
    )


def head_backward_logits(spec: TrainingSpec, m: ActivationMode) -> int:
    """Logits-side bytes at the LM head's backward: the logits gradient in the logits dtype (+ autocast casts)."""
    if spec.model.shape.task in CLASSIFIER_TASKS:
        return classifier_head_backward(spec, m.e)
    fused = fused_loss(spec, act_bytes=m.e, residual_bytes=m.r, autocast=m.autocast)
    if fused is not None:
        return fused.head_backward
    b, s, v, h = spec.batch.micro_batch, spec.batch.seq_len, spec.model.shape.vocab_size, spec.model.shape.hidden_size
    total = m.e * b * s * v  # grad of .float(): cast back to the bf16 logits (fp32 model: the fp32 gradient)
    if m.autocast:
        total += _head_weight_cast(spec) + (0 if qlora_frozen_head(spec) else 2 * b * s * h)  # head weight/input casts
    return total


def _head_weight_cast(spec: TrainingSpec) -> int:
    """Bytes of autocast's bf16 cast of the LM head weight (``2·V·h``), 0 where TRL 0.7.5-0.25.1's SFTTrainer cast
    the k-bit prepared head back to bf16 (``core/states/trl_adapters.py``: autocast's cast of a bf16 tensor to bf16
    returns it)."""
    sh = spec.model.shape
    return 0 if trl_module_cast(spec) else 2 * sh.vocab_size * sh.hidden_size
