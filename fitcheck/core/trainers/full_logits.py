"""DPO with log-probs from the full fp32 logits (``--loss full-logits``): LLaMA-Factory's CustomDPOTrainer (pure).

LLaMA-Factory@ff6d4d1 subclasses TRL's ``DPOTrainer`` but computes the log-probs itself
(``src/llamafactory/train/dpo/trainer.py``):

* ``concatenated_forward`` (L219-253): ``model(**batch).logits.to(torch.float32)`` over chosen + rejected, then
  ``get_batch_logps`` (``train/trainer_utils.py`` L592-636): ``log_softmax`` of ``logits[:, :-1]`` (saved for
  backward) and a ``gather``. The fp32 logits stay referenced by the returned ``chosen_logits`` /
  ``rejected_logits`` until the loss is returned (their means are logged, L311-312);
* ``compute_reference_log_probs`` (L255-275): the same forward under ``no_grad`` (adapters disabled under LoRA,
  else the reference copy), AFTER the policy's: its logits, fp32 copy and log-softmax come on top of the policy's
  kept fp32 logits and saved log-softmax.

Bytes per ``rows x seq x vocab`` element (rows = 2 x micro-batch), logits in ``e`` bytes (2 under bf16):

* end of the policy forward: the fp32 logits (4) + the saved log-softmax (4) = 8;
* the reference forward's peak on top: its ``e``-byte logits with their fp32 copy, then the fp32 copy and its
  log-softmax: ``max(e + 4, 8)`` = 8 (an fp32 model's ``.to(float32)`` is the same tensor: 8 too);
* start of backward: the policy's fp32 logits are freed with the loss's locals; the gradient path is that of
  transformers' ForCausalLMLoss (saved log-softmax, its gradient, the fp32 logits gradient: 12), as the plain
  Trainer's ``logits.loss`` counts it.

Measured against a real TRL 1.16 ``DPOTrainer`` subclass following these lines on CPU
(``benchmarks/llamafactory_dpo_truth.py``, ``tests/test_llamafactory_dpo.py``).
"""

from __future__ import annotations

from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import MixedPrecision, TrainingSpec

_SOURCE = ("LLaMA-Factory@ff6d4d1 src/llamafactory/train/dpo/trainer.py concatenated_forward L219-253 + "
           "compute_reference_log_probs L255-275; train/trainer_utils.py get_batch_logps L592-636")


def full_logits_component(run: TrainingSpec, base: Component) -> Component:
    """``logits.full_logps``: the policy's and the reference's full-logits log-probs of one DPO step.

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
    amp = run.precision.mixed_precision is not MixedPrecision.NO
    e = 2 if run.precision.load_dtype.is_half or amp else 4  # the LM head's output dtype (activations/layer_saved.py)
    # what base counts at its forward peak for ForCausalLMLoss (activations/layer_saved.py _logits): logits,
    # fp32 upcast, log-softmax, and under LoRA / a quantized base the final-norm output held by the CausalLM forward
    # while its loss runs; here the ModelOutput is dropped after .to(float32) (L230), so nothing of it is held
    plain = (10 if e == 2 else 8) * bsv
    if run.lora is not None or run.quant is not None:
        plain += e * rows * seq * sh.hidden_size
    kept = 4 * bsv + 4 * shifted  # the policy's fp32 logits + saved log-softmax
    reference = 4 * bsv + 4 * shifted  # the no_grad reference's fp32 logits + log-softmax (> e + 4 per element)
    fwd = base.at(Phase.FORWARD_END) - plain + kept + reference
    return Component(
        "logits.full_logps",
        Category.LOGITS,
        Location.DEVICE,
        {Phase.FORWARD_END: fwd, Phase.BACKWARD_START: base.at(Phase.BACKWARD_START)},
        _SOURCE,
        f"{run.batch.micro_batch}x{run.batch.seq_len}x{sh.vocab_size} fp32 logits + log-softmax kept while the "
        "no_grad reference forward builds its own",
    )
