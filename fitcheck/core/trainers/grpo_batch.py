"""GRPO's batch rules (``GRPOConfig.__post_init__``, ``trl/trainer/grpo_config.py``, TRL 1.16): pure checks.

The generation batch holds whole prompt groups: ``generation_batch_size`` (default ``per_device_train_batch_size
x processes x steps_per_generation``, ``steps_per_generation`` defaulting to ``gradient_accumulation_steps``)
must be divisible by ``num_generations``; a given ``generation_batch_size`` must also be divisible by the global
micro-batch (``per_device_train_batch_size x processes``). Evaluation: ``per_device_eval_batch_size x processes``
must be divisible by ``num_generations_eval`` (default ``num_generations``). ``GRPOConfig`` raises otherwise, so
a micro-batch that breaks them is no answer to "the largest micro-batch that fits".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fitcheck.spec import TrainerKind, TrainingSpec

if TYPE_CHECKING:
    from collections.abc import Mapping

# The GRPOConfig fields whose checks ``grpo_config_accepts`` answers: every field a fitcheck run passes to the class
# (``torch_adapters.trl_config_check``) that ``GRPOConfig.__post_init__`` reads (TRL 1.16 grpo_config.py L1048-1168)
GRPO_CONFIG_MODELLED = frozenset({"per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                                  "generation_batch_size", "steps_per_generation", "per_device_eval_batch_size"})


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


def grpo_config_accepts(values: Mapping[str, object]) -> bool:
    """True when ``GRPOConfig.__post_init__`` (TRL 1.16 ``trl/trainer/grpo_config.py`` L1096-1141) raises for none
    of these values, at world size 1 (the settings check passes the batch of all processes as the per-device one).

    Its checks, in its order: a ``generation_batch_size`` must be divisible by the global micro-batch (else
    ``ValueError``; a micro-batch of 0 divides by zero); ``generation_batch_size`` and ``steps_per_generation`` are
    not both given; the generation batch (given, or micro-batch x ``steps_per_generation`` or
    ``gradient_accumulation_steps``) is divisible by ``num_generations`` (0: ``ZeroDivisionError``); and
    ``num_generations >= 2``. Its evaluation check (the eval batch divisible by ``num_generations_eval or
    num_generations``) runs only with ``do_eval``, which no run sets; a given ``per_device_eval_batch_size`` is held
    to it anyway, so False is only ever "maybe": the caller then builds the class and TRL decides (and words it).

    Args:
        values: Field -> value as passed to the class (with the class's defaults for the fields not passed); a
            field of ``GRPO_CONFIG_MODELLED`` that is absent, or a value that is not an ``int``, answers False.
    """
    def count(name: str, optional: bool = False) -> int | None:
        value = values.get(name)
        if value is None and optional:
            return None
        if type(value) is not int:
            raise TypeError(name)
        return value

    try:
        micro, accum = count("per_device_train_batch_size"), count("gradient_accumulation_steps")
        generations = count("num_generations")
        given_batch, steps = count("generation_batch_size", True), count("steps_per_generation", True)
        eval_batch = count("per_device_eval_batch_size", True)
    except TypeError:
        return False
    assert micro is not None and accum is not None and generations is not None
    if given_batch is not None and steps is not None:
        return False
    if given_batch is not None:
        if micro == 0 or given_batch % micro:
            return False
        batch = given_batch
    else:
        batch = micro * (accum if steps is None else steps)
    if generations < 2 or batch % generations:
        return False
    return eval_batch is None or eval_batch % generations == 0
