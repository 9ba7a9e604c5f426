"""TRL trainers (SFT, DPO, GRPO, Reward) and evaluation: what their step allocates beyond a plain Trainer step.

Pure (no torch). ``trainer_components(spec, base)`` rewrites the plain-Trainer components for the TRL trainer in
``spec.trainer`` and adds ``reference_model.*``, ``generation.*`` and ``evaluation.*`` components.
"""

from fitcheck.core.trainers.evaluation import (
    EVAL_TRAINERS,
    eval_spec,
    evaluation_component,
    evaluation_findings,
)
from fitcheck.core.trainers.grpo_batch import grpo_batch_error, grpo_valid_micro_batch
from fitcheck.core.trainers.steps import step_spec, trainer_components
from fitcheck.spec import TrainerKind, TrainerSpec, VllmMode

__all__ = [
    "EVAL_TRAINERS",
    "TrainerKind",
    "TrainerSpec",
    "VllmMode",
    "eval_spec",
    "evaluation_component",
    "evaluation_findings",
    "grpo_batch_error",
    "grpo_valid_micro_batch",
    "step_spec",
    "trainer_components",
]
