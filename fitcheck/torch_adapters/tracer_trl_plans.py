"""What ``tracer.trace_step`` needs to run a TRL preference or GRPO step beyond the SFT step: one plan per trainer.

``replay_step_args.run_trace_kwargs`` builds them from the spec (``trl_dpo`` / ``trl_kto`` / ``trl_grpo``);
``tracer_dpo.prepare_dpo``, ``tracer_kto.prepare_kto`` and ``tracer_grpo.prepare_grpo`` read them. Named tuples:
a plan is still a tuple (compared, unpacked and hashed as one). Pure Python, no torch.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DpoPlan", "GrpoPlan", "KtoPlan"]


class DpoPlan(NamedTuple):
    """DPOTrainer's step (``tracer_dpo``).

    Attributes:
        reference: ``tracer_dpo.dpo_reference``: ``MODEL_REF``, ``ADAPTERS_OFF`` or ``PRECOMPUTED``.
        prompt: Prompt tokens at the start of every row.
        rpo_alpha: The ``sft`` loss term's weight (None: no such term).
        warmup: Bytes of the reference copy's loading warm-up block (0: none).
    """

    reference: str
    prompt: int
    rpo_alpha: float | None
    warmup: int


class KtoPlan(NamedTuple):
    """KTOTrainer's step (``tracer_kto``).

    Attributes:
        reference: ``tracer_dpo.dpo_reference``: ``MODEL_REF``, ``ADAPTERS_OFF`` or ``PRECOMPUTED``.
        prompt: Prompt tokens at the start of every row.
        calculate_kl: The loss estimates the KL term (``core.trainers.calculates_kl``): the KL batch and forwards.
        warmup: Bytes of the reference copy's loading warm-up block (0: none).
        desirable: Desirable rows in the batch (``tracer_kto.desirable_rows``).
    """

    reference: str
    prompt: int
    calculate_kl: bool
    warmup: int
    desirable: int


class GrpoPlan(NamedTuple):
    """GRPOTrainer's micro-step (``tracer_grpo``).

    Attributes:
        reference: ``tracer_grpo.NO_REF`` (``beta == 0``), ``tracer_dpo.ADAPTERS_OFF`` or ``tracer_dpo.MODEL_REF``.
        prompt: Prompt tokens of every row.
        beta: ``GRPOConfig.beta``.
        steps_per_generation: Micro-batches per generation.
        old_pass: The pre-pass computes the old policy's log-probs (``tracer_grpo.old_policy_pass``).
        warmup: Bytes of the reference copy's loading warm-up block (0: none).
        grad_accum: ``gradient_accumulation_steps``.
    """

    reference: str
    prompt: int
    beta: float
    steps_per_generation: int
    old_pass: bool
    warmup: int
    grad_accum: int
