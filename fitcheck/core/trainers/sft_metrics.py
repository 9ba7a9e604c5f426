"""TRL 0.15 - 1.6's ``SFTTrainer`` step: the model's own loss, then metrics over the full logits (pure).

Which release does what is ``core/states/trl_adapters.py`` (:func:`~fitcheck.core.states.sft_loss`,
:func:`~fitcheck.core.states.sft_metrics`); this module counts the bytes. From v0.15.0 to v1.6.x
``SFTTrainer.compute_loss`` (``trl/trainer/sft_trainer.py`` at the tags) calls ``super().compute_loss(...,
return_outputs=True)``: the plain Trainer's step (the model's ``[rows, seq, vocab]`` logits, transformers'
ForCausalLMLoss, ``core/activations/logits.py``), but the ``ModelOutput`` stays referenced while the metrics run,
outside the model's forward:

- ``outputs.logits``: fp32 under mixed precision (accelerate ``Accelerator.prepare_model`` wraps the forward in
  ``convert_outputs_to_fp32``, ``accelerate/utils/operations.py``: ``.float()`` of every 16-bit output), else in the
  model's dtype; beside it the loss's saved fp32 log-softmax and the casts saved for backward (what the plain
  ``logits.loss`` counts at the start of backward, less the two gradients);
- the metrics' temporaries (``torch.no_grad`` from v0.22; no gradient flows through them before either), by layout:
  the shifted copy ``outputs.logits[..., :-1, :].contiguous()`` and its ``argmax`` (token accuracy; 0.15 also
  ``gather_for_metrics`` of the copy itself: an ``all_gather`` of ``world`` copies); ``entropy_from_logits``
  (``trl/trainer/utils.py``): per chunk a log-softmax, its ``exp`` and their product (3 tensors of the chunk), one
  row per chunk at v0.22, 128 tokens of the flattened logits from v0.23 (a ``reshape`` that copies a
  non-contiguous shifted view, 1.6 with rows > 1). One row's shifted logits are a contiguous prefix of
  ``outputs.logits``: ``.contiguous()`` / ``reshape`` return a view, no copy.

The peak of these moments is compared with the loss's own forward peak; the autocast weight cache is cleared on
leaving the forward (torch ``autocast_mode.py`` ``__exit__``), so at the metrics only its casts saved for backward
are left (as ``full_logits.outside_forward``). Checked against real ``SFTTrainer`` steps of TRL 0.20.0, 0.22.2,
0.24.0, 1.4.0 and 1.6.0 on CPU, one process (``benchmarks/trl_sft_releases.py``, recorded in
``benchmarks/data/trl_sft_releases.json``): every layout but 0.15's gather across processes.
"""

from __future__ import annotations

import dataclasses

from fitcheck.core.states import ENTROPY_CHUNK_TOKENS, SftLoss, SftMetrics, sft_loss, sft_metrics, trl_release
from fitcheck.findings import Finding, Severity
from fitcheck.report import Component, Phase
from fitcheck.spec import MixedPrecision, Strategy, TrainerKind, TrainingSpec

# the layouts checked against a real SFTTrainer (benchmarks/trl_sft_releases.py: TRL 0.20.0, 0.22.2, 0.24.0, 1.4.0,
# 1.6.0 on CPU, one process); 0.15's gather of the copy is the identity on one process (its COPY), never run on more
CHECKED_LAYOUTS = (SftMetrics.COPY, SftMetrics.ROW_ENTROPY_THEN_COPY, SftMetrics.CHUNK_ENTROPY_THEN_COPY,
                   SftMetrics.COPY_ENTROPY_THEN_COPY, SftMetrics.VIEW_ENTROPY)


def sft_metrics_layout(spec: TrainingSpec) -> SftMetrics | None:
    """The metrics layout of this run's ``SFTTrainer`` (None: not an SFT run of a full-logits release)."""
    if spec.trainer.kind is not TrainerKind.SFT:
        return None
    return sft_metrics(trl_release(spec))


def _outputs_bytes(spec: TrainingSpec) -> int:
    """Element bytes of ``outputs.logits`` as ``compute_loss`` sees them (module docstring)."""
    amp = spec.precision.mixed_precision is not MixedPrecision.NO and spec.sharding.strategy is not Strategy.DEEPSPEED
    return 4 if amp else spec.precision.load_dtype.nbytes


def metrics_bytes(spec: TrainingSpec, layout: SftMetrics) -> int:
    """The worst moment of the metrics' temporaries (beyond ``outputs.logits`` and what the loss saved)."""
    b, s, v = spec.batch.micro_batch, spec.batch.seq_len, spec.model.shape.vocab_size
    e = _outputs_bytes(spec)
    shifted = b * (s - 1)
    # logits[..., :-1, :] of ONE row is a contiguous prefix: .contiguous() returns it (no copy; measured, TRL 1.4.0)
    copy = 0 if b == 1 else e * shifted * v
    ints = 16 * shifted  # shift_labels.contiguous() and the argmax predictions (int64)
    entropies = 4 * b * s  # the per-token entropies (fp32)

    def chunk(tokens: int) -> int:  # log-softmax, exp and their product of one chunk
        return 3 * e * tokens * v

    if layout is SftMetrics.GATHERED_COPY:
        world = spec.data_parallel_size
        return copy * (1 + world if world > 1 else 1) + ints
    if layout is SftMetrics.COPY:
        return copy + ints
    if layout is SftMetrics.ROW_ENTROPY_THEN_COPY:
        return max(chunk(s) + entropies, copy + ints)
    tokens = min(ENTROPY_CHUNK_TOKENS, b * s)
    if layout is SftMetrics.CHUNK_ENTROPY_THEN_COPY:
        return max(chunk(tokens) + entropies, copy + ints)
    if layout is SftMetrics.COPY_ENTROPY_THEN_COPY:
        return max(copy + chunk(tokens) + entropies, 2 * copy + ints)
    return copy + chunk(tokens) + entropies + ints  # VIEW_ENTROPY: the reshape copies as .contiguous() would


def sft_metrics_component(run: TrainingSpec, base: Component, cache: Component | None) -> Component:
    """``logits.loss`` of a full-logits ``SFTTrainer`` step: the plain loss, or the metrics' moment where higher.

    Args:
        run: The step's spec (``step_spec``).
        base: The plain Trainer's ``logits.loss`` of the step (``core/activations/logits.py``).
        cache: The step's ``activations.autocast_weight_cache`` component, if any.
    """
    layout = sft_metrics_layout(run)
    assert layout is not None, "only full-logits SFT releases get here (steps.trainer_components)"
    b, s, v = run.batch.micro_batch, run.batch.seq_len, run.model.shape.vocab_size
    bsv = b * s * v
    # after the forward: outputs.logits + (saved fp32 log-softmax + saved casts: base's start of backward less the
    # log-softmax gradient and the fp32 logits gradient, logits.py)
    held = _outputs_bytes(run) * bsv + base.at(Phase.BACKWARD_START) - 8 * bsv - 8
    moment = held + metrics_bytes(run, layout)
    cleared = 0 if cache is None else cache.at(Phase.FORWARD_END) - cache.at(Phase.BACKWARD_START)
    fwd = max(base.at(Phase.FORWARD_END), moment - cleared)
    return dataclasses.replace(
        base, by_phase={**base.by_phase, Phase.FORWARD_END: fwd},
        source=base.source + f"; TRL {'.'.join(map(str, trl_release(run) or ()))} SFTTrainer.compute_loss "
        "(trl/trainer/sft_trainer.py): outputs.logits kept for its metrics (core/trainers/sft_metrics.py)",
        detail=base.detail + f"; metrics ({layout.value}) after the forward: {moment:,} B",
    )


def eval_metrics_moment(run: TrainingSpec) -> int:
    """The metrics' moment of a full-logits release's ``compute_loss`` in evaluation (0 for any other run): the
    ``no_grad`` forward saved nothing, so ``outputs.logits`` and the metrics' temporaries are all that is left of
    the loss."""
    layout = sft_metrics_layout(run)
    if layout is None:
        return 0
    b, s, v = run.batch.micro_batch, run.batch.seq_len, run.model.shape.vocab_size
    return _outputs_bytes(run) * b * s * v + metrics_bytes(run, layout)


def sft_release_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """What the stack's TRL release changes in an ``--trainer sft`` run, and whether it was checked."""
    if spec.trainer.kind is not TrainerKind.SFT:
        return ()
    release = trl_release(spec)
    loss = sft_loss(release)
    name = f"trl {spec.stack.get('trl')} ({spec.stack.source})"
    if loss is SftLoss.CHUNKED_NLL:
        return (Finding(
            "not-modelled", Severity.WARNING,
            f"{name}: SFTTrainer's default loss_type 'chunked_nll' (TRL 1.7-1.14, _chunked_cross_entropy_loss: "
            "256-token checkpointed chunks, each upcasting the LM head weight to fp32) is not modelled; estimated "
            "with TRL 1.16's fused LM head",
            "pass --stack trl=1.16 to ask about the modelled release, or measure a step"),)
    layout = sft_metrics(release)
    if layout is None:
        return ()
    checked = layout in CHECKED_LAYOUTS or (layout is SftMetrics.GATHERED_COPY and spec.data_parallel_size == 1)
    return (Finding(
        "versions-modelled" if checked else "sft-metrics-unchecked", Severity.INFO if checked else Severity.WARNING,
        f"{name}: SFTTrainer computes the model's own loss over the full logits and keeps them for its metrics "
        f"({layout.value.replace('_', ' ')}; core/trainers/sft_metrics.py)"
        + ("" if checked else ": this release's layout was read from its source, not checked against a real step"),
        "" if checked else "measure a step of that release"),)
