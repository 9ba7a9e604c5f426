"""The components of one training step and the phase where their sum peaks.

One place for both: :func:`collect_components` (model states, activations, buffers, CUDA overheads) and
:func:`peak_phase` (the phase with the most device bytes; ties go to the earliest phase in
:data:`fitcheck.report.PHASES`, so the answer is deterministic). The estimate and the allocator model read
them from here.

Pure: no torch import, no environment reads.
"""

from __future__ import annotations

from collections.abc import Iterable

from fitcheck.core.activations import (
    activation_components,
    fsdp_traced_backward,
    lm_head_input_saved,
    traced_legacy_logits,
    zero2_traced_component,
)
from fitcheck.core.overheads import overhead_components
from fitcheck.core.states import (
    buffer_components,
    model_state_components,
    offload_components,
    offload_grad_norm_component,
    prequant_components,
    zero1_reduction_component,
)
from fitcheck.core.trainers import (
    GENERATION_TRACED,
    dpo_release_layout,
    eval_spec,
    evaluation_component,
    has_reference_copy,
    runs_fused_head,
    sft_metrics_layout,
    step_spec,
    trainer_components,
)
from fitcheck.findings import Finding, Severity
from fitcheck.report import PHASES, Category, Component, Location, Phase, phases_of
from fitcheck.spec import TrainingSpec


def collect_components(
    spec: TrainingSpec, activations: tuple[Component, ...] | None = None
) -> tuple[Component, ...]:
    """Every component of the step: model states, activations, buffers and overheads (+ TRL trainer parts).

    A TRL trainer (``spec.trainer``) runs its policy step on :func:`fitcheck.core.trainers.step_spec` (DPO's
    chosen + rejected rows, GRPO's prompt + completion) and rewrites the components
    (:func:`fitcheck.core.trainers.trainer_components`: fused LM head, reference model, generation phase).

    Args:
        spec: The training run.
        activations: Activation components to use instead of the per-family formulas (from a trace).

    Returns:
        The components, in report order.
    """
    run = step_spec(spec)
    if activations is not None and spec.trainer.is_trl and runs_fused_head(spec.trainer.kind):
        activations = traced_body_formula_head(run, activations)
    acts = activation_components(run) if activations is None else activations
    if activations is not None and not runs_fused_head(run.trainer.kind) and (
            copy := traced_legacy_logits(run)) is not None:  # transformers < 4.49 (the trace runs 5.23's loss)
        acts = (*acts, copy)
    if activations is not None:  # FSDP2's gradients at backward's moments (activations/fsdp_traced.py)
        acts = fsdp_traced_backward(run, acts)
    if activations is not None and (first := zero2_traced_component(run, acts)) is not None:
        acts = (*acts, first)  # ZeRO-2's first reduction: the formula's moments have it (activations/backward.py)
    # ZeRO-1's reduction at the end of backward, when it outgrows the activations' worst backward moment
    reduction = zero1_reduction_component(
        run, sum(c.at(Phase.BACKWARD) for c in acts if c.location is Location.DEVICE))
    # DeepSpeed offload_optimizer: the fp64 norm copy at the head's reduction, when it outgrows that moment
    norm = offload_grad_norm_component(run, acts)
    base = (
        *model_state_components(run),
        *acts,
        *buffer_components(run),
        *offload_components(run),
        *(() if norm is None else (norm,)),
        *(() if reduction is None else (reduction,)),
        *prequant_components(run),
        *overhead_components(run),
    )
    out = trainer_components(spec, base, lm_head_input_saved(run), traced=activations is not None)
    if spec.trainer.eval_batch_size is None:
        return out
    run = step_spec(eval_spec(spec))  # one evaluation step: its batch, as the trainer runs it
    ev = evaluation_component(run, out, activation_components(run))
    return out if ev is None else (*out, ev)


def traced_body_formula_head(run: TrainingSpec, traced: tuple[Component, ...]) -> tuple[Component, ...]:
    """A trace of a TRL trainer's policy step with the trainer's own LM head and loss.

    The tracer runs the model's forward with its ``lm_head`` and transformers' loss (the ``[rows, seq, vocab]``
    logits, their fp32 upcast and gradient: its ``Category.LOGITS`` components). TRL 1.16's SFT / DPO / KTO /
    GRPO trainers replace that head with the chunked one (``trl/kernels/chunked_logprob.py``): the traced logits
    are dropped and the formula's ``logits.loss`` is kept in their place, which :func:`trainer_components`
    then swaps for the fused head (``core/trainers/fused_head.py``). The body (every layer's activations,
    inputs, temporaries) stays traced.
    """
    head = tuple(c for c in activation_components(run) if c.name == "logits.loss")
    return (*(c for c in traced if c.category is not Category.LOGITS), *head)


def traced_trainer_finding(spec: TrainingSpec, traced: tuple[Component, ...] = ()) -> tuple[Finding, ...]:
    """What a traced TRL run took from the trace and what from the formulas (the trace runs the plain step;
    ``traced``: the traced components, GRPO's ``generate`` among them where it was traced)."""
    t = spec.trainer
    if not t.is_trl:
        return ()
    run = step_spec(spec)
    formula = []
    if dpo_release_layout(spec) is not None:
        formula.append("the LM head and DPOTrainer's log-probs over the full logits (core/trainers/dpo_releases.py)")
    elif sft_metrics_layout(spec) is None and runs_fused_head(t.kind):
        formula.append("TRL's chunked LM head and loss (core/trainers/fused_head.py)")
    elif sft_metrics_layout(spec) is not None:
        formula.append("the LM head, loss and SFTTrainer's metrics over the full logits (core/trainers/sft_metrics.py)")
    if has_reference_copy(spec):
        formula.append("the reference model")
    generate = any(c.name in GENERATION_TRACED for c in traced)
    if not generate and any(c.at(Phase.GENERATION) for c in trainer_components(spec, ())):
        formula.append("the generation phase")
    shape = f"{run.batch.micro_batch} rows x {run.batch.seq_len} tokens"
    if generate:
        shape += "; model.generate's prefill and decode steps (torch_adapters/tracer_generate.py)"
    if run.model.params is not spec.model.params:  # the score head replaces the LM head (reward)
        shape += ", the sequence-classification model the trainer loads"
    return (
        Finding(
            "trace-trainer-parts",
            Severity.INFO,
            f"traced: the {t.kind.value} trainer's policy forward and backward through the model ({shape}); "
            f"from the formulas: {', '.join(formula) if formula else 'nothing else'}",
            "",
        ),
    )


def peak_phase(components: Iterable[Component]) -> tuple[Phase, dict[Phase, int]]:
    """The phase with the most device bytes, and the device total of every phase.

    Args:
        components: The step's components.

    Returns:
        ``(phase, totals)``; ties go to the earliest phase of :data:`PHASES`.
    """
    device = [c for c in components if c.location is Location.DEVICE]
    phases = phases_of(tuple(components))  # + generation / evaluation where a trainer fills them
    totals = {p: sum(c.at(p) for c in device) for p in phases}
    best = max(phases, key=lambda p: (totals[p], -phases.index(p)))
    return best, totals


def transient_bytes_at(components: Iterable[Component], phase: Phase) -> int:
    """Bytes at ``phase`` of device components allocated and freed within each step.

    A component is transient when its bytes differ between phases (activations, logits, temporaries,
    gradients freed by ``zero_grad(set_to_none=True)``); a component constant over the step (weights,
    optimizer states, workspaces) is persistent.

    Args:
        components: The step's components.
        phase: The peak phase.

    Returns:
        Sum of the transient device components' bytes in that phase.
    """
    total = 0
    for c in components:
        if c.location is not Location.DEVICE:
            continue
        values = {c.at(p) for p in PHASES}
        if len(values) > 1:
            total += c.at(phase)
    return total


def transient_at_peak(components: tuple[Component, ...]) -> int:
    """:func:`transient_bytes_at` the components' own peak phase.

    Args:
        components: The step's components.

    Returns:
        Transient device bytes at the peak phase.
    """
    return transient_bytes_at(components, peak_phase(components)[0])
