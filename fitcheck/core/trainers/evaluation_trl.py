"""One evaluation step of TRL 1.16's DPO, GRPO and reward trainers (their own ``prediction_step``): bytes.

Alive during evaluation: the weights and optimizer states (gradients were freed by ``zero_grad``), the reference
copy, and what one ``no_grad`` evaluation step allocates on ``per_device_eval_batch_size`` rows:

- DPO (``dpo_trainer.py prediction_step`` -> ``_compute_loss`` under ``torch.no_grad``, TRL 1.16): chosen and
  rejected concatenated (2 x rows); the policy's fused-head forward, then the reference's (its own copy, the PEFT
  base with adapters disabled, or none with ``precompute_ref_log_probs``) while the policy's per-token outputs are
  held. With ``compute_metrics`` (``prediction_loss_only`` false) ``_compute_loss(return_outputs=True)`` runs a
  third, plain forward ``model(**model_kwargs)`` for the ``[2 x rows, seq, vocab]`` logits (the fused head never
  builds them), with both fused outputs still alive; ``evaluation_loop`` then keeps those logits on the device.
- GRPO (``grpo_trainer.py prediction_step`` -> ``_prepare_inputs`` in eval mode ->
  ``_generate_and_score_completions`` for the evaluation batch itself: ``per_device_eval_batch_size`` sequences,
  no buffering): ``generate`` with its KV cache, then the reference log-prob pass (``beta`` > 0) and the loss
  forward, both ``no_grad`` fused-head forwards over the rows. The logits are never returned (``None``).
- KTO (``kto_trainer.py prediction_step``, TRL 1.16): DPO's structure on its unpaired rows: the policy's KL and
  completion forwards, then the reference's two, each ``no_grad`` and of the same size.
- Reward (``Trainer.prediction_step``; ``reward_trainer.py`` sets ``can_return_loss`` and empty
  ``label_names`` so ``compute_loss`` runs): the ``*ForSequenceClassification`` forward on chosen + rejected;
  its ``[2 x rows, 1]`` logits are what ``compute_metrics`` would get (nothing vocabulary-sized).

The backbone's own transient in a ``no_grad`` forward is one layer's MLP intermediates (gate/up activations and
their product, ``3 x tokens x intermediate``) next to the residual stream; the step's peak is the larger of that
and the loss head (pinned against the real trainers: ``benchmarks/trl_truth.py TRL_EVAL_CASES``).
"""

from __future__ import annotations

from fitcheck.core.trainers.fused_head import forward_outputs, forward_peak
from fitcheck.core.trainers.generation_phase import generation_bytes
from fitcheck.core.trainers.registry import EvalRule, fused_outputs, trainer_row
from fitcheck.core.trainers.steps import fused_head_inputs
from fitcheck.spec import TrainingSpec


def _hidden(run: TrainingSpec) -> int:
    sh = run.model.shape
    return run.batch.micro_batch * run.batch.seq_len * sh.hidden_size * run.precision.load_dtype.nbytes


def _layer(run: TrainingSpec) -> int:
    """A decoder layer's MLP moment in a ``no_grad`` forward, beyond the final hidden state counted apart.

    gate/up activations and their product (``act_fn(gate_proj(x)) * up_proj(x)``: 3 x tokens x intermediate) next
    to three more ``[tokens, hidden]`` tensors: ``inputs_embeds`` (a local of ``LlamaModel.forward`` for the whole
    backbone), the layer's input (the caller's loop variable) and the post-attention residual sum; the norm's
    output is the fourth (the ``hidden`` counted by the caller). transformers 5.23 ``modeling_llama.py``.
    """
    sh = run.model.shape
    tokens, e = run.batch.micro_batch * run.batch.seq_len, run.precision.load_dtype.nbytes
    return 3 * tokens * (sh.intermediate_size + sh.hidden_size) * e


def _scored(run: TrainingSpec) -> int:
    t = run.trainer
    return run.batch.micro_batch * (t.completion_length or run.batch.seq_len - 1)


def _dpo(run: TrainingSpec, logits: int) -> tuple[int, str]:
    """DPO: the policy's and the reference's ``no_grad`` fused forwards (+ the metrics forward's logits)."""
    t = run.trainer
    hidden = _hidden(run)
    ids = 4 * 8 * run.batch.micro_batch * run.batch.seq_len  # input_ids, attention/completion masks, labels
    policy = fused_head_inputs(run, grad=False, outputs=fused_outputs(t.kind), scored=_scored(run))
    peak = hidden + max(forward_peak(policy), _layer(run))
    detail = "policy fused forward"
    if not t.precompute_ref_log_probs:
        ref = fused_head_inputs(run, grad=False, outputs=("log_probs",), scored=_scored(run))
        peak = max(peak, forward_outputs(policy) + hidden + max(forward_peak(ref), _layer(run)))
        detail += " then the reference's"
    if not t.prediction_loss_only:
        # the plain forward for compute_metrics' logits: both fused outputs held, full logits built
        held = forward_outputs(policy) * (1 if t.precompute_ref_log_probs else 2)
        peak = max(peak, held + hidden + max(logits, _layer(run)))
        detail += "; a plain forward for the logits"
    return ids + peak, detail


def _grpo(run: TrainingSpec) -> tuple[int, str]:
    """GRPO: ``generate`` for the evaluation rows, then the reference and loss ``no_grad`` fused forwards."""
    t = run.trainer
    # with vLLM the evaluation batch is generated by vLLM (colocate: its share is counted apart; server: elsewhere)
    # evaluation_loop runs model.eval(): LoRA's dropout returns its input (generation_phase.prefill_bytes)
    kv, working = (0, 0) if t.use_vllm else generation_bytes(run, run.batch.micro_batch, training=False)
    hidden = _hidden(run)
    ids = 4 * 8 * run.batch.micro_batch * run.batch.seq_len  # prompt-completion ids, attention/completion masks
    loss = fused_head_inputs(run, grad=False, outputs=fused_outputs(run.trainer.kind), scored=_scored(run))
    ref = fused_head_inputs(run, grad=False, outputs=("log_probs", "entropy"), scored=_scored(run))
    forward = hidden + max(forward_peak(loss), forward_peak(ref), _layer(run))
    ref_logps = 4 * _scored(run) if t.beta != 0.0 else 0  # held into the loss forward
    peak = max(kv + working, ids + ref_logps + forward)
    return peak, f"generate ({run.batch.micro_batch} sequences) then no_grad fused forwards"


def _reward(run: TrainingSpec) -> tuple[int, str]:
    """Reward: the sequence-classification forward on chosen + rejected (``no_grad``)."""
    ids = 2 * 8 * run.batch.micro_batch * run.batch.seq_len  # input_ids, attention_mask
    return ids + _hidden(run) + _layer(run), "sequence-classification forward, no vocabulary-sized logits"


def trl_eval_forward(run: TrainingSpec, logits: int) -> tuple[int, str]:
    """Bytes of one DPO/GRPO/reward evaluation step beyond the held states, and a one-line description.

    Args:
        run: The evaluation step as the trainer runs it (``step_spec(eval_spec(spec))``).
        logits: One step's ``[rows, seq, vocab]`` logits in the model dtype (DPO's metrics forward).
    """
    rule = trainer_row(run.trainer.kind).evaluation
    if rule is EvalRule.PAIRED:  # KTO: the same forwards on its unpaired rows (+ KL passes
        return _dpo(run, logits)  # of the same size, one after the other: kto_trainer.py _compute_loss)
    if rule is EvalRule.GENERATE:
        return _grpo(run)
    return _reward(run)
