"""GRPO's batch rules (``GRPOConfig.__post_init__``, ``trl/trainer/grpo_config.py``, TRL 1.16): pure checks.

The generation batch holds whole prompt groups: ``generation_batch_size`` (default ``per_device_train_batch_size
x processes x steps_per_generation``, ``steps_per_generation`` defaulting to ``gradient_accumulation_steps``)
must be divisible by ``num_generations``; a given ``generation_batch_size`` must also be divisible by the global
micro-batch (``per_device_train_batch_size x processes``). Evaluation: ``per_device_eval_batch_size x processes``
must be divisible by ``num_generations_eval`` (default ``num_generations``). ``GRPOConfig`` raises otherwise, so
a micro-batch that breaks them is no answer to "the largest micro-batch that fits".
"""

from __future__ import annotations

from fitcheck.spec import TrainerKind, TrainingSpec


def grpo_batch_error(spec: TrainingSpec, micro_batch: int | None = None) -> str | None:
    """Why GRPOConfig (TRL 1.16) would refuse this batch, or None (also None for the other trainers).

    Args:
        spec: The run (``spec.trainer`` GRPO's fields, ``spec.sharding.num_processes`` the world size).
        micro_batch: ``per_device_train_batch_size`` to check instead of the spec's.
    """
    t = spec.trainer
    if t.kind is not TrainerKind.GRPO:
        return None
    m = spec.batch.micro_batch if micro_batch is None else micro_batch
    procs = spec.sharding.num_processes
    if t.generation_batch_size is not None:
        gbs = t.generation_batch_size
        if gbs % (m * procs):
            return (f"generation_batch_size ({gbs}) must be divisible by the global batch size ({m} x {procs} "
                    "processes) (GRPOConfig, TRL 1.16)")
    else:
        gbs = m * procs * (t.steps_per_generation or spec.batch.grad_accum)
    if gbs % t.num_generations:
        return (f"the generation batch ({gbs} = per_device_train_batch_size x processes x steps_per_generation) "
                f"must be divisible by num_generations ({t.num_generations}) (GRPOConfig, TRL 1.16)")
    if t.eval_batch_size is not None and (t.eval_batch_size * procs) % t.num_generations:
        return (f"the global eval batch size ({t.eval_batch_size} x {procs}) must be divisible by num_generations "
                f"({t.num_generations}) (GRPOConfig, TRL 1.16)")
    return None


def grpo_steps_per_generation(spec: TrainingSpec) -> int:
    """Micro-batches one generation batch feeds (``GRPOConfig.__post_init__``, TRL 1.16: ``steps_per_generation``
    given; else ``generation_batch_size // (per_device_train_batch_size x processes)``; else
    ``gradient_accumulation_steps``). At least 1."""
    t = spec.trainer
    if t.steps_per_generation is not None:
        return max(t.steps_per_generation, 1)
    if t.generation_batch_size is not None:
        return max(t.generation_batch_size // (spec.batch.micro_batch * spec.sharding.num_processes), 1)
    return max(spec.batch.grad_accum, 1)


def grpo_valid_micro_batch(spec: TrainingSpec, micro_batch: int) -> int:
    """The largest micro-batch <= ``micro_batch`` that GRPOConfig accepts (0 when none); unchanged otherwise."""
    if spec.trainer.kind is not TrainerKind.GRPO:
        return micro_batch
    for m in range(micro_batch, 0, -1):
        if grpo_batch_error(spec, m) is None:
            return m
    return 0
