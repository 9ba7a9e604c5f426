"""TRL 0.19 - 1.13's ``DPOTrainer`` step: log-probs from the full fp32 logits of the policy and the reference (pure).

Which release does what is ``core/states/trl_adapters.py`` (:func:`~fitcheck.core.states.dpo_loss`); this module
counts the bytes. Before TRL's fused LM head (1.15) ``DPOTrainer`` runs the model's forward without labels over the
chosen + rejected rows (``step_spec``: ``rows`` = 2 x micro-batch of ``seq`` = prompt + completion tokens) and
computes the log-probs itself with ``selective_log_softmax`` (``trl/trainer/utils.py``): for fp32 logits a
``gather`` and one ``logsumexp`` per row, each saving its row of the logits for backward (no log-softmax tensor).
Under mixed precision accelerate's ``convert_outputs_to_fp32`` (``accelerate/utils/operations.py``, applied by
``Accelerator.prepare_model`` outside the forward's autocast) makes an fp32 copy of every 16-bit output beside the
``e``-byte logits the LM head returned. The reference forward (``no_grad``; the reference copy, or the policy with
its adapters disabled) runs after the policy's, through the same wrapper. Every moment is outside the model's
forward: the autocast weight cache holds only the casts saved for backward (``full_logits.outside_forward``).

Per element of ``[rows, seq, vocab]`` (``bsv``), of the shifted ``[rows, seq - 1, vocab]`` (``shifted``) and of the
hidden states ``[rows, seq, hidden]`` (``bsh``):

- **0.19 - 0.28** (``concatenated_forward``, ``model_kwargs["output_hidden_states"] = True``): the policy's moment
  is its conversion, ``e + 4`` per logit and the fp32 copies of the ``L + 1`` hidden states (``4 (L + 1) bsh``; under
  LoRA / a quantized base also the final norm's output, which only the outputs hold). After it returns only the fp32
  logits stay (saved by the row ``logsumexp``\\ s); the reference's conversion comes on top with its hidden states
  in both dtypes (``(e + 4)(L + 1) bsh``, kept by ``output_hidden_states`` under ``no_grad``).
- **0.29 - 1.5** (``_compute_loss``): ``outputs`` and ``ref_outputs`` stay bound to the end of ``_compute_loss``,
  each with its shifted ``.contiguous()`` fp32 copy; then ``entropy_from_logits`` of the policy's copy in 128-token
  chunks (a log-softmax, its ``exp`` and their product, fp32) is the moment.
- **1.6 - 1.13**: the shifted logits are views; ``entropy_from_logits``' ``reshape`` of the non-contiguous view
  copies it (``4 shifted``) before its chunks.
- **Start of backward** (every layout): the tensor the ``logsumexp``\\ s saved (the fp32 logits; 0.29 - 1.5 the
  shifted copy; 1.6 - 1.13 the logits under the views) and three fp32 gradients of their input's shape
  (``GatherBackward``'s zero-filled one, the rows' select gradients, their sum: ``bsv`` before 0.29, ``shifted``
  after), in place of transformers' ForCausalLMLoss's 12 per logit.

Checked against real ``DPOTrainer`` steps of TRL 0.20.0, 0.22.2, 0.24.0, 1.4.0 and 1.6.0 on CPU
(``benchmarks/trl_trainer_releases.py``, recorded in ``benchmarks/data/trl_trainer_releases.json``): full fine-tune
with the reference copy, LoRA with the adapters-off pass, ``precompute_ref_log_probs``, with and without
checkpointing, vocabularies 2000 and 8000.
"""

from __future__ import annotations

import dataclasses

from fitcheck.core.states import ENTROPY_CHUNK_TOKENS, DpoLoss, dpo_loss, dpo_release_modelled, trl_release
from fitcheck.core.trainers.full_logits import plain_loss_forward
from fitcheck.report import Component, Phase
from fitcheck.spec import TrainerKind, TrainingSpec

# fp32 gradients of the logsumexps' input's shape at the start of backward beside the tensor they saved (module
# docstring; measured: 16.00 per logit on TRL 0.20 / 0.22 / 0.24, 16.00 per shifted element on 1.4, 4 per logit + 12
# per shifted element on 1.6, at vocab 2000 and 8000)
_GRADIENTS = 3
_PLAIN_BACKWARD_PER_LOGIT = 12  # ForCausalLMLoss at the start of backward (core/activations/logits.py)


def dpo_release_layout(spec: TrainingSpec) -> DpoLoss | None:
    """The full-logits layout of this DPO run's release (None: not DPO, the fused head, or not modelled)."""
    if spec.trainer.kind is not TrainerKind.DPO or not dpo_release_modelled(spec):
        return None
    loss = dpo_loss(trl_release(spec))
    return None if loss is DpoLoss.FUSED_HEAD else loss


def _moments(run: TrainingSpec, layout: DpoLoss) -> tuple[int, int]:
    """(forward-end bytes, start-of-backward bytes) of the log-probs (module docstring)."""
    sh = run.model.shape
    rows, seq, vocab = run.batch.micro_batch, run.batch.seq_len, sh.vocab_size
    bsv, bsh = rows * seq * vocab, rows * seq * sh.hidden_size
    shifted = rows * (seq - 1) * vocab
    e = 2  # the LM head's output under autocast (dpo_release_modelled: mixed precision only)
    reference = not run.trainer.precompute_ref_log_probs
    if layout is DpoLoss.CONCATENATED_FORWARD:
        states = (sh.num_layers + 1) * bsh
        held_norm = e * bsh if run.lora is not None or run.quant is not None else 0
        policy = (e + 4) * bsv + 4 * states + held_norm
        ref = 4 * bsv + (e + 4) * bsv + (e + 4) * states
        return (max(policy, ref) if reference else policy), 4 * bsv + _GRADIENTS * 4 * bsv
    copy = 4 * shifted if layout is DpoLoss.SHIFTED_COPIES else 0  # shift_logits = logits[..., :-1, :].contiguous()
    kept = 4 * bsv + copy  # outputs.logits (fp32) + its shifted copy, bound to the end of _compute_loss
    reshape = 4 * shifted if layout is DpoLoss.SHIFTED_VIEWS else 0  # entropy_from_logits' reshape of the view
    chunk = 3 * 4 * min(ENTROPY_CHUNK_TOKENS, rows * (seq - 1)) * vocab
    metrics = kept * (2 if reference else 1) + reshape + chunk
    conversion = kept + (e + 4) * bsv if reference else (e + 4) * bsv
    saved = shifted if layout is DpoLoss.SHIFTED_COPIES else bsv  # the copy, or the logits under the views
    return max(metrics, conversion), 4 * saved + _GRADIENTS * 4 * shifted


def dpo_release_component(run: TrainingSpec, base: Component) -> Component:
    """``logits.loss`` of a full-logits ``DPOTrainer`` release's step.

    Args:
        run: The step's spec (``step_spec``: chosen + rejected rows).
        base: The plain Trainer's ``logits.loss`` of the step (ForCausalLMLoss's bytes).
    """
    layout = dpo_release_layout(run)
    assert layout is not None, "only full-logits DPO releases get here (steps.trainer_components)"
    bsv = run.batch.micro_batch * run.batch.seq_len * run.model.shape.vocab_size
    fwd, bwd = _moments(run, layout)
    phases = {**base.by_phase,
              Phase.FORWARD_END: base.at(Phase.FORWARD_END) - plain_loss_forward(run) + fwd,
              Phase.BACKWARD_START: base.at(Phase.BACKWARD_START) - _PLAIN_BACKWARD_PER_LOGIT * bsv + bwd}
    release = ".".join(map(str, trl_release(run) or ()))
    return dataclasses.replace(
        base, by_phase=phases,
        source=f"TRL {release} DPOTrainer ({layout.value.replace('_', ' ')}; trl/trainer/dpo_trainer.py, "
        "selective_log_softmax in trl/trainer/utils.py): core/trainers/dpo_releases.py",
        detail=f"{run.batch.micro_batch}x{run.batch.seq_len}x{run.model.shape.vocab_size} fp32 logits of the policy"
        + ("" if run.trainer.precompute_ref_log_probs else " and the reference") + f" ({layout.value})",
    )

