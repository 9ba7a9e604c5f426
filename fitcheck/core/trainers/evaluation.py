"""The evaluation phase (``Phase.EVALUATION``): one ``Trainer.evaluate`` step in the middle of training.

``Trainer.evaluate`` (transformers 5.23 trainer.py) runs ``evaluation_loop`` with ``prediction_loss_only=True``
when the trainer has no ``compute_metrics`` (the usual TRL setup): ``prediction_step`` does one ``no_grad``
forward with the labels and keeps only the loss. Alive then: the weights and optimizer states (gradients were
freed by ``zero_grad(set_to_none=True)`` after the last optimizer step), a reference copy if any, and the
forward's loss computation on ``per_device_eval_batch_size`` rows -- for the plain Trainer the full-vocabulary
logits, their fp32 upcast and log-softmax (the same bytes as the training forward's ``logits.loss``); for SFT the
fused head's buffers without a backward (``fitcheck.core.trainers.fused_head``). Nothing is saved for backward.

With ``compute_metrics`` (``prediction_loss_only`` False) every step's logits are gathered on the device by
``EvalLoopContainer.add`` (``nested_concat``: ``torch.cat`` of what is held and the new step) until
``eval_accumulation_steps`` steps have run, then moved to the CPU; without ``eval_accumulation_steps`` they stay
for the whole evaluation set (a finding says so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fitcheck.core.states import partition
from fitcheck.core.trainers.evaluation_trl import trl_eval_forward
from fitcheck.core.trainers.fused_head import forward_peak
from fitcheck.core.trainers.grpo_batch import grpo_batch_error
from fitcheck.core.trainers.reference_fsdp import reference_fsdp2_finding
from fitcheck.core.trainers.registry import EvalRule, fused_outputs, step_runs_fused_head, trainer_row
from fitcheck.core.trainers.sft_metrics import eval_metrics_moment
from fitcheck.core.trainers.steps import fused_head_inputs, has_reference_copy, held_between_steps
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import TrainingSpec

_SOURCE = "transformers 5.23 trainer.py evaluate / evaluation_loop / prediction_step (no_grad forward)"
# Measured against real Trainer.evaluate / SFTTrainer.evaluate on CPU (benchmarks/trl_truth.py EVAL_CASES) and
# DPO / GRPO / reward evaluate (TRL_EVAL_CASES)


def eval_spec(spec: TrainingSpec) -> TrainingSpec:
    """The spec of one evaluation step: ``per_device_eval_batch_size`` rows, no accumulation."""
    rows = spec.trainer.eval_batch_size or spec.batch.micro_batch
    return dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, micro_batch=rows, grad_accum=1))


def _logits_bytes(spec: TrainingSpec) -> int:
    """One step's ``[rows, seq, vocab]`` logits in the model dtype (what ``prediction_step`` returns)."""
    sh = spec.model.shape
    return spec.batch.micro_batch * spec.batch.seq_len * sh.vocab_size * spec.precision.load_dtype.nbytes


def evaluation_component(run: TrainingSpec, train: tuple[Component, ...],
                         step: tuple[Component, ...]) -> Component | None:
    """The evaluation phase's bytes, or None when no evaluation batch size is given.

    Args:
        run: The spec of one evaluation step as the trainer runs it (``step_spec(eval_spec(spec))``).
        train: The training step's components (weights, optimizer states, reference model).
        step: The plain-step components of ``run`` (their forward's loss computation).
    """
    t = run.trainer
    if t.eval_batch_size is None:
        return None
    sh = run.model.shape
    # ZeRO-3's flat gradient partition buffer is never freed (core/states/sharding.py Partition.gradients_resident)
    grads = partition(run).gradients_resident
    held = sum(c.at(Phase.FORWARD_END) for c in train
               if held_between_steps(c) or (grads and c.location is Location.DEVICE and c.name == "gradients"))
    b, s = run.batch.micro_batch, run.batch.seq_len
    hidden = b * s * sh.hidden_size * run.precision.load_dtype.nbytes  # the backbone output, held at the loss
    ids = 8 * b * s
    row = trainer_row(t.kind)
    if row.evaluation not in (EvalRule.TRAINER, EvalRule.SFT):  # their own prediction_step (evaluation_trl)
        forward, detail = trl_eval_forward(run, _logits_bytes(run))
        steps = t.eval_accumulation_steps or 1
        if not t.prediction_loss_only and row.evaluation is EvalRule.PAIRED:  # metrics logits kept
            forward = max((steps - 1) * _logits_bytes(run) + forward, 2 * steps * _logits_bytes(run))
        return Component("evaluation.step", Category.ACTIVATIONS, Location.DEVICE,
                         {Phase.EVALUATION: held + forward}, _SOURCE + "; " + row.eval_source,
                         f"{b} rows x {s} tokens: {detail}; weights and optimizer states stay, gradients were freed")
    if row.evaluation is EvalRule.SFT and step_runs_fused_head(run):
        loss = forward_peak(fused_head_inputs(run, grad=False, outputs=fused_outputs(t.kind)))
    else:  # the plain loss; an SFTTrainer release that keeps the full logits for its metrics (sft_metrics.py)
        loss = max(next((c.at(Phase.FORWARD_END) for c in step if c.name == "logits.loss"), 0),
                   eval_metrics_moment(run))
    forward = hidden + loss + ids
    detail = f"{b} rows x {s} tokens, no_grad forward with the loss"
    if not t.prediction_loss_only and row.evaluation is EvalRule.TRAINER:
        steps = t.eval_accumulation_steps or 1
        logits = _logits_bytes(run)
        # step k of an accumulation window: (k-1) held + this step's forward, or at the concat (k-1)+1+k copies
        forward = max((steps - 1) * logits + forward, 2 * steps * logits)
        detail += f"; logits of {steps} step(s) gathered on the device"
    return Component("evaluation.step", Category.ACTIVATIONS, Location.DEVICE, {Phase.EVALUATION: held + forward},
                     _SOURCE, detail + "; weights and optimizer states stay, gradients were freed")


def evaluation_findings(spec: TrainingSpec, totals: Mapping[Phase, int]) -> tuple[Finding, ...]:
    """The trainer's findings: evaluation above every training phase; evaluation logits accumulating; a GRPO batch
    GRPOConfig refuses; the FSDP2 reference gathered whole (``reference_fsdp``)."""
    t = spec.trainer
    out: list[Finding] = []
    gathered = reference_fsdp2_finding(spec, has_reference_copy(spec))
    if gathered is not None:
        out.append(gathered)
    batch = grpo_batch_error(spec)
    if batch is not None:  # GRPOConfig's batch rules (grpo_batch.py), evaluation batch included
        out.append(Finding("grpo-batch-refused", Severity.ERROR, f"GRPOConfig would refuse this run: {batch}",
                           "use a per_device_train_batch_size (x processes x steps_per_generation) and a "
                           "per_device_eval_batch_size (x processes) that are multiples of num_generations"))
    if t.eval_batch_size is None:
        return tuple(out)
    train = max((v for p, v in totals.items() if p is not Phase.EVALUATION), default=0)
    if totals.get(Phase.EVALUATION, 0) > train:
        out.append(Finding(
            "evaluation-peak", Severity.WARNING,
            f"evaluation (per_device_eval_batch_size {t.eval_batch_size}) needs more than any training phase: "
            "a run can pass its first steps and run out of memory at the first evaluation",
            "lower --per_device_eval_batch_size" + (" or set --eval_accumulation_steps"
                                                    if not t.prediction_loss_only else "")))
    if t.prediction_loss_only or t.eval_accumulation_steps is not None:
        return tuple(out)
    out.append(Finding(
        "eval-logits-accumulate", Severity.WARNING,
        "with compute_metrics (prediction_loss_only false) the Trainer keeps every evaluation step's logits on the "
        "GPU until the evaluation set ends; the evaluation phase shows one step, and grows by one step's logits "
        "per evaluation step",
        "set --eval_accumulation_steps (e.g. 8) to move them to the CPU every few steps, or "
        "preprocess_logits_for_metrics to keep argmax ids only"))
    return tuple(out)
