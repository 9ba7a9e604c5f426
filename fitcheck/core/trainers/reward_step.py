"""The reward trainer's step: the moments inside the model that set its peaks; pure, no torch.

TRL 1.16's ``RewardTrainer`` trains ``AutoModelForSequenceClassification`` (``num_labels=1``) on chosen +
rejected rows (``trl/trainer/reward_trainer.py compute_loss``: one forward, ``torch.chunk(logits.squeeze(-1), 2)``,
``-logsigmoid(chosen - rejected).mean()``; ``core.trainers.step_spec``). transformers 5.23
``modeling_layers.py GenericForSequenceClassification.forward`` (Llama; ``modeling_gpt2.py
GPT2ForSequenceClassification.forward`` the same) runs the bias-free ``score`` Linear [1, h] over every position
(``[rows, seq, 1]`` logits) and gathers the last non-pad token (``logits[arange(rows), last_non_pad_token]``, an
int32 ``argmax`` of ``token_indices * non_pad_mask``): kilobytes. Under peft's ``SEQ_CLS`` task ``score`` is a
``modules_to_save`` copy (peft ``PeftModelForSequenceClassification``: ``classifier_module_names`` ``classifier``,
``score``), trained in full. With no vocabulary-sized logits, the plain step's head moment (the LM head's backward,
``core/activations/backward.py``) is no longer the step's worst; two moments inside the model are, which a causal
LM's logits hide (measured: the real ``RewardTrainer`` on CPU, ``benchmarks/reward_truth.py``, its live tensors at
the peak listed by op and module):

- the top layer's last MLP linear, in forward, under LoRA without checkpointing (:func:`lora_forward_tokens`);
- the final RMSNorm's backward of a full fine-tune (:func:`final_norm_backward`).

:func:`reward_component` adds what those moments hold beyond the plain step's phase totals.
"""

from __future__ import annotations

from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import Kind, MixedPrecision, NormKind, NormPlacement, TrainingSpec

_SOURCE = ("transformers 5.23 modeling_layers.py GenericForSequenceClassification / modeling_llama.py "
           "LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm; peft 0.21.2 tuners/lora/layer.py Linear.forward; "
           "measured: benchmarks/reward_truth.py (real RewardTrainer, TRL 1.16, CPU)")


def _last_mlp_linear(spec: TrainingSpec) -> str | None:
    """Short name of a layer's last MLP linear ([h, I]: ``down_proj``, GPT-2's ``mlp.c_proj``), None without one."""
    sh = spec.model.shape
    for p in spec.model.params:
        if (p.kind is Kind.LINEAR and p.per_layer and p.in_features == sh.intermediate_size
                and p.out_features == sh.hidden_size and p.module):
            return p.module
    return None


def lora_forward_tokens(spec: TrainingSpec) -> int | None:
    """Bytes per token alive in the top layer's last MLP linear, at ``lora_B(lora_A(x)) * scaling``, beyond what the
    layers saved (and the autocast casts of the adapters); None where the moment was not measured.

    peft 0.21.2 ``tuners/lora/layer.py Linear.forward``: ``result = self.base_layer(x)`` (e·h), ``x =
    self._cast_input_dtype(x, lora_A.weight.dtype)``: the fp32 copy of the 16-bit input (4·I; peft keeps the
    adapters in fp32, ``autocast_adapter_dtype``), ``lora_A`` under autocast saves its own 16-bit cast of it (in the
    layer's saved tensors), ``lora_B``'s output (e·h) and its scaled copy (e·h). The frozen base linear saves no
    input, so its input ``act(gate) * up`` (e·I) is only the MLP's local, alive as the MLP's input (the
    post-attention norm's output, e·h: ``LlamaMLP.forward``'s ``x``) and the attention's residual sum
    (``LlamaDecoderLayer.forward``'s ``residual``, r·h). GPT-2 (``GPT2Block.forward``: ``residual``, ``ln_2``'s
    output, ``mlp.c_proj``) holds the same. Live-tensor listing of the real RewardTrainer on CPU (2 pairs x 64
    tokens, bf16 + autocast, LoRA r 16 all-linear): tiny Llama (h 256, I 688) 1,712,128 B at this op beyond the
    saved tensors (6,688 per token), tiny GPT-2 (h 256, I 1024) 2,228,224 B (8,704 per token).

    Measured for a 16-bit model under autocast without checkpointing (TRL's ``bf16`` default), LoRA (no DoRA, no
    quantized base) wrapping the last MLP linear; elsewhere None.
    """
    # imported here: core.activations.decoder imports core.trainers (the fused-head column)
    from fitcheck.core.activations import wrapped_linears

    sh, lora = spec.model.shape, spec.lora
    last = _last_mlp_linear(spec)
    if (lora is None or lora.use_dora or spec.quant is not None or spec.peft is not None
            or spec.activations.checkpointing or not spec.precision.load_dtype.is_half
            or spec.precision.mixed_precision is MixedPrecision.NO or last is None
            or last not in wrapped_linears(lora, (last,))):
        return None
    e, h, inter = spec.precision.load_dtype.nbytes, sh.hidden_size, sh.intermediate_size
    residual, mlp_input, base_out, lora_out, scaled = (e * h,) * 5
    return residual + mlp_input + e * inter + base_out + 4 * inter + lora_out + scaled


def final_norm_backward(spec: TrainingSpec) -> int | None:
    """Bytes beyond everything alive at the start of backward at the final RMSNorm's backward of a full
    fine-tune; None where it does not apply.

    ``score``'s backward is a [rows·seq, 1] x [1, h] product: its input gradient (e·h per token) and weight
    gradient. Then ``LlamaRMSNorm``'s backward (``self.weight * hidden_states.to(input_dtype)``; the fp32
    ``hidden_states * torch.rsqrt(variance + eps)``) frees the two 16-bit h-wide tensors saved for the score's and
    the norm weight's gradients and holds the fp32 chain rule's temporaries (``RMS_BACKWARD_TEMPS`` x 4·h,
    ``core/activations/norm_backward.py``). Real RewardTrainer, tiny Llama full fine-tune without checkpointing:
    the step's peak (op ``mul``, five fp32 [4, 64, 256] temporaries live), 1,048,588 B above the saved tensors.

    For a 16-bit full fine-tune of a pre-norm RMSNorm (Llama-style) decoder; None elsewhere.
    """
    from fitcheck.core.activations import RMS_BACKWARD_TEMPS  # imported here: as lora_forward_tokens

    sh, t = spec.model.shape, spec.model.shape.traits
    full = spec.lora is None and spec.quant is None and spec.freeze is None and spec.peft is None
    if (not full or not spec.precision.load_dtype.is_half or t.norm_kind is not NormKind.RMS
            or t.norm_placement is not NormPlacement.PRE):
        return None
    e, h = spec.precision.load_dtype.nbytes, sh.hidden_size
    score = sum(p.numel for p in spec.model.params if p.module == "score") * e
    return (RMS_BACKWARD_TEMPS * 4 * h - 2 * e * h) * spec.batch.micro_batch * spec.batch.seq_len + score


def reward_component(run: TrainingSpec, components: tuple[Component, ...]) -> Component | None:
    """What the reward step's own moments hold beyond the plain step's phase totals (None when nothing).

    Args:
        run: ``step_spec`` of the run (the sequence-classification model, chosen + rejected rows).
        components: The step's components so far.

    Returns:
        ``activations.reward_step``: in ``Phase.FORWARD_END`` the top layer's LoRA moment (the saved tensors and
        casts of the forward's end, less the head's tensors not made yet: ``Category.LOGITS``), in
        ``Phase.BACKWARD`` the final norm's backward (everything alive at the start of backward, no gradient but
        the score's), each as its excess over the phase's total.
    """
    device = [c for c in components if c.location is Location.DEVICE]

    def total(phase: Phase) -> int:
        return sum(c.at(phase) for c in device)

    bs = run.batch.micro_batch * run.batch.seq_len
    by_phase: dict[Phase, int] = {}
    notes = []
    fwd = lora_forward_tokens(run)
    if fwd is not None:
        head = sum(c.at(Phase.FORWARD_END) for c in device if c.category is Category.LOGITS)
        moment = total(Phase.FORWARD_END) - head + fwd * bs
        by_phase[Phase.FORWARD_END] = max(0, moment - total(Phase.FORWARD_END))
        notes.append(f"top layer's last MLP linear under LoRA: {fwd} B/token beyond the saved tensors")
    bwd = final_norm_backward(run)
    if bwd is not None:
        moment = total(Phase.BACKWARD_START) + bwd
        by_phase[Phase.BACKWARD] = max(0, moment - total(Phase.BACKWARD))
        notes.append(f"final RMSNorm's backward: +{bwd:,} B over the start of backward")
    if not any(by_phase.values()):
        return None
    return Component("activations.reward_step", Category.ACTIVATIONS, Location.DEVICE, by_phase, _SOURCE,
                     "; ".join(notes))

