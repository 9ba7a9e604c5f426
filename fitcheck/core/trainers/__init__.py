"""TRL trainers (one row each in ``registry``) and evaluation: what their step allocates beyond a plain Trainer step.

Pure (no torch). ``trainer_components(spec, base)`` rewrites the plain-Trainer components for the TRL trainer in
``spec.trainer`` and adds ``reference_model.*``, ``generation.*`` and ``evaluation.*`` components.
"""

from fitcheck.core.trainers.dpo_releases import dpo_release_layout
from fitcheck.core.trainers.evaluation import (
    eval_spec,
    evaluation_component,
    evaluation_findings,
)
from fitcheck.core.trainers.grpo_batch import (
    GRPO_CONFIG_MODELLED,
    GrpoBatch,
    grpo_batch_error,
    grpo_config_accepts,
    grpo_steps_per_generation,
    grpo_valid_micro_batch,
)
from fitcheck.core.trainers.registry import (
    CONFIG_CLASSES,
    KTO_DEFAULT_LOSS,
    KTO_LOSS_TYPES,
    REFUSED,
    TRAINERS,
    EvalRule,
    ReferenceRule,
    TrainerRow,
    calculates_kl,
    runs_fused_head,
    step_runs_fused_head,
    trainer_row,
)
from fitcheck.core.trainers.sft_metrics import sft_metrics_layout, sft_release_findings
from fitcheck.core.trainers.steps import (
    GENERATION_TRACED,
    generation_parts,
    generation_rows,
    has_reference_copy,
    step_spec,
    trainer_components,
)
from fitcheck.core.trainers.trl_release_findings import dpo_release_findings, reward_release_findings
from fitcheck.spec import TrainerKind, TrainerSpec, VllmMode

__all__ = [
    "CONFIG_CLASSES",
    "GENERATION_TRACED",
    "GRPO_CONFIG_MODELLED",
    "KTO_DEFAULT_LOSS",
    "KTO_LOSS_TYPES",
    "REFUSED",
    "TRAINERS",
    "EvalRule",
    "GrpoBatch",
    "ReferenceRule",
    "TrainerKind",
    "TrainerRow",
    "TrainerSpec",
    "VllmMode",
    "calculates_kl",
    "dpo_release_findings",
    "dpo_release_layout",
    "eval_spec",
    "evaluation_component",
    "evaluation_findings",
    "generation_parts",
    "generation_rows",
    "grpo_batch_error",
    "grpo_config_accepts",
    "grpo_steps_per_generation",
    "grpo_valid_micro_batch",
    "has_reference_copy",
    "reward_release_findings",
    "runs_fused_head",
    "sft_metrics_layout",
    "sft_release_findings",
    "step_runs_fused_head",
    "step_spec",
    "trainer_components",
    "trainer_row",
]
