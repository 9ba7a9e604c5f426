"""DPO / KTO with log-probs from the full fp32 logits (``--loss full-logits``): LLaMA-Factory's trainers (pure).

LLaMA-Factory@ff6d4d1 subclasses TRL's ``DPOTrainer`` / ``KTOTrainer`` but computes the log-probs itself:

* DPO (``src/llamafactory/train/dpo/trainer.py``): ``concatenated_forward`` (L219-253) runs
  ``model(**batch).logits.to(torch.float32)`` over chosen + rejected, then ``get_batch_logps``
  (``train/trainer_utils.py`` L592-636): ``log_softmax`` of ``logits[:, :-1]`` (saved for backward) and a
  ``gather``. The fp32 logits stay referenced by the returned ``chosen_logits`` / ``rejected_logits`` until the
  loss is returned (their means are logged, L311-312). ``compute_reference_log_probs`` (L255-275) runs the same
  forward under ``no_grad`` (adapters disabled under LoRA, else the reference copy) AFTER the policy's.
* KTO (``train/kto/trainer.py``): ``concatenated_forward`` (L184-199) runs the target forward (``forward``
  L149-181, the same fp32 path), then the KL forward under ``no_grad``, and keeps chosen / rejected logits by
  boolean indexing (copies: one fp32 logits' worth); the reference's ``concatenated_forward`` (L202-218) holds its
  target logits while its KL forward runs.

Bytes per ``rows x seq x vocab`` element (rows: DPO 2 x micro-batch, KTO the micro-batch), the trainer's
``full_logits`` row (``fitcheck.core.trainers.registry``) giving the counts:

* kept by the policy through the reference forward: ``kept`` fp32 logits (4 each) + the saved log-softmax (4);
* the reference forward's peak on top: ``reference`` fp32 logits + the log-softmax being computed (4 each; an
  ``e``-byte logits tensor with its fp32 copy, ``e + 4`` <= 8, is a smaller moment). DPO: 8 + 8; KTO: 8 + 12
  (the policy's own KL forward, 16, is below);
* the peak is outside the model's forward: accelerate 1.15 wraps ``model.forward`` in its own autocast
  (``accelerator.py`` ``prepare_model`` L1824-1835; transformers 5.23's ``autocast_smart_context_manager`` adds
  none), and torch 2.13 clears the autocast weight cache on leaving the outermost autocast
  (``torch/amp/autocast_mode.py`` ``__exit__``): of ``activations.autocast_weight_cache`` only the casts the
  graph saved for backward (its start-of-backward bytes) are left;
* start of backward: the policy's fp32 logits are freed with the loss's locals; the gradient path is that of
  transformers' ForCausalLMLoss (saved log-softmax, its gradient, the fp32 logits gradient: 12), as the plain
  Trainer's ``logits.loss`` counts it.

Measured against real TRL 1.16 ``DPOTrainer`` / ``KTOTrainer`` subclasses following these lines on CPU
(``benchmarks/llamafactory_truth.py``, ``tests/test_llamafactory_trainers.py``).
"""

from __future__ import annotations

import dataclasses

from fitcheck.core.trainers.registry import trainer_row
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import MixedPrecision, TrainingSpec

_GET_BATCH_LOGPS = "; src/llamafactory/train/trainer_utils.py get_batch_logps L592-636"


def outside_forward(c: Component) -> Component:
    """A component at this trainer's forward-end peak, outside the model's forward (module docstring): the autocast
    weight cache is cleared, the casts saved for backward stay; every other component as it is."""
    if c.name != "activations.autocast_weight_cache":
        return c
    phases = {**c.by_phase, Phase.FORWARD_END: c.at(Phase.BACKWARD_START)}
    return dataclasses.replace(c, by_phase=phases, detail=c.detail + "; at the full-logits peak (outside the "
                               "forward) only the casts saved for backward")


def plain_loss_forward(run: TrainingSpec) -> int:
    """What the plain Trainer's ``logits.loss`` counts at its forward peak for ForCausalLMLoss
    (activations/layer_saved.py ``_logits``): the logits, their fp32 upcast and log-softmax, and under LoRA / a
    quantized base the final-norm output held by the CausalLM forward while its loss runs. A trainer computing its
    log-probs itself (no labels to the model) replaces it."""
    sh = run.model.shape
    bsv = run.batch.micro_batch * run.batch.seq_len * sh.vocab_size
    amp = run.precision.mixed_precision is not MixedPrecision.NO
    e = 2 if run.precision.load_dtype.is_half or amp else 4  # the LM head's output dtype (activations/layer_saved.py)
    plain = (10 if e == 2 else 8) * bsv
    if run.lora is not None or run.quant is not None:
        plain += e * run.batch.micro_batch * run.batch.seq_len * sh.hidden_size
    return plain


def full_logits_component(run: TrainingSpec, base: Component) -> Component:
    """``logits.full_logps``: the policy's and the reference's full-logits log-probs of one DPO / KTO step.

    Args:
        run: The step's spec (``step_spec``: chosen + rejected rows).
        base: The plain Trainer's ``logits.loss`` of the same step (ForCausalLMLoss's bytes).

    Returns:
        The component with the forward-end peak of the reference forward on top of the policy's kept logits.
    """
    sh = run.model.shape
    rows, seq, vocab = run.batch.micro_batch, run.batch.seq_len, sh.vocab_size
    bsv = rows * seq * vocab
    shifted = rows * (seq - 1) * vocab  # log_softmax of logits[:, :-1] (get_batch_logps L608-612)
    # here the ModelOutput is dropped after .to(float32) (L230), so nothing of plain_loss_forward is held
    plain = plain_loss_forward(run)
    row = trainer_row(run.trainer.kind).full_logits
    assert row is not None, "only trainers with a full_logits row get here (steps.trainer_components)"
    kept = row.kept * 4 * bsv + 4 * shifted  # the policy's fp32 logits + its saved log-softmax
    # the no_grad reference: its fp32 logits + the log-softmax being computed (> e + 4 per element)
    reference = row.reference * 4 * bsv + 4 * shifted
    fwd = base.at(Phase.FORWARD_END) - plain + kept + reference
    return Component(
        "logits.full_logps",
        Category.LOGITS,
        Location.DEVICE,
        {Phase.FORWARD_END: fwd, Phase.BACKWARD_START: base.at(Phase.BACKWARD_START)},
        row.source + _GET_BATCH_LOGPS,
        f"{run.batch.micro_batch}x{run.batch.seq_len}x{sh.vocab_size} fp32 logits + log-softmax kept while the "
        "no_grad reference forward builds its own",
    )
