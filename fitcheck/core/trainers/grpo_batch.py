"""GRPO's batch rules (``GRPOConfig.__post_init__``, ``trl/trainer/grpo_config.py``, TRL 1.16): pure checks.

One home: :meth:`GrpoBatch.refusal` reads the class's batch checks in its order; the spec's check
(:func:`grpo_batch_error`, the advisor's and the tuner's micro-batch filters), the flags' check
(:func:`grpo_config_accepts`, which adds the class's two checks that are no batch's fault) and the tuner's
``steps_per_generation`` use it. The generation batch holds whole prompt groups (``GRPOTrainer``'s ``RepeatSampler``
draws ``generation_batch_size // num_generations`` prompts, each repeated ``num_generations`` times, and the
advantages group the rewards as ``view(-1, num_generations)``: TRL 1.16 ``grpo_trainer.py`` L1308-1312, a streamed
dataset's L1266-1269, L2765): ``generation_batch_size`` (default ``per_device_train_batch_size x processes x
steps_per_generation``, ``steps_per_generation`` defaulting to ``gradient_accumulation_steps``) must be divisible by
``num_generations``; a given ``generation_batch_size`` must also be divisible by the global micro-batch
(``per_device_train_batch_size x processes``). Evaluation: ``per_device_eval_batch_size x processes`` must be
divisible by ``num_generations_eval`` (default ``num_generations``). ``GRPOConfig`` raises otherwise, so a
micro-batch that breaks them is no answer to "the largest micro-batch that fits".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fitcheck.spec import TrainerKind, TrainingSpec

if TYPE_CHECKING:
    from collections.abc import Mapping

# The GRPOConfig fields whose checks ``grpo_config_accepts`` answers: every field a fitcheck run passes to the class
# (``torch_adapters.trl_config_check``) that ``GRPOConfig.__post_init__`` reads (TRL 1.16 grpo_config.py L1048-1168)
GRPO_CONFIG_MODELLED = frozenset({"per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                                  "generation_batch_size", "steps_per_generation", "per_device_eval_batch_size"})


@dataclass(frozen=True)
class GrpoBatch:
    """The values ``GRPOConfig.__post_init__``'s batch checks read (TRL 1.16 ``trl/trainer/grpo_config.py``
    L1096-1135).

    Attributes:
        micro_batch: ``per_device_train_batch_size``.
        processes: ``self.world_size``.
        grad_accum: ``gradient_accumulation_steps`` (the default ``steps_per_generation``).
        num_generations: Completions per prompt.
        generation_batch_size: Given (over all processes): it is kept and ``steps_per_generation`` follows
            (``GRPOConfig``'s branch for it alone, and ``set_trainer_micro_batch``'s rule for a live config).
        steps_per_generation: Given; None: ``gradient_accumulation_steps`` (or what a given generation batch makes).
        eval_batch: ``per_device_eval_batch_size`` when given.
    """

    micro_batch: int
    processes: int
    grad_accum: int
    num_generations: int
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    eval_batch: int | None = None

    @classmethod
    def of(cls, spec: TrainingSpec, micro_batch: int | None = None) -> GrpoBatch:
        """A run's batch (``spec.trainer`` GRPO's fields, ``spec.sharding.num_processes`` the world size), at
        ``micro_batch`` instead of the spec's when given."""
        t = spec.trainer
        return cls(spec.batch.micro_batch if micro_batch is None else micro_batch, spec.sharding.num_processes,
                   spec.batch.grad_accum, t.num_generations, t.generation_batch_size, t.steps_per_generation,
                   t.eval_batch_size)

    @property
    def steps(self) -> int:
        """``steps_per_generation`` as ``GRPOConfig.__post_init__`` sets it (L1098-1112): given; else
        ``generation_batch_size // (micro-batch x processes)``; else ``gradient_accumulation_steps``."""
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            return self.generation_batch_size // (self.micro_batch * self.processes)
        return self.grad_accum

    def refusal(self) -> str | None:
        """Why ``GRPOConfig.__post_init__`` (TRL 1.16) refuses this batch, or None; its checks in its order.

        1. A given ``generation_batch_size`` divisible by the global micro-batch (micro-batch x processes;
           L1101-1107; a global micro-batch of 0 divides by zero).
        2. The global eval batch (``per_device_eval_batch_size`` x processes) divisible by ``num_generations``
           (L1118-1127: GRPOConfig runs it only with ``do_eval``; a given eval batch is held to it always).
        3. The generation batch (given, or micro-batch x processes x ``steps_per_generation``) divisible by
           ``num_generations`` (L1129-1135).

        ``generation_batch_size`` and ``steps_per_generation`` both given, and ``num_generations < 2``, are no
        batch's fault: :func:`grpo_config_accepts` answers them for the config built from flags.
        """
        global_batch = self.micro_batch * self.processes
        if self.generation_batch_size is not None:
            if global_batch == 0 or self.generation_batch_size % global_batch:
                return (f"generation_batch_size ({self.generation_batch_size}) must be divisible by the global batch "
                        f"size ({self.micro_batch} x {self.processes} processes) (GRPOConfig, TRL 1.16)")
            generation_batch = self.generation_batch_size
        else:
            generation_batch = global_batch * self.steps
        if self.num_generations == 0:
            return "num_generations is 0 (GRPOConfig divides by it: ZeroDivisionError, TRL 1.16)"
        if self.eval_batch is not None and (self.eval_batch * self.processes) % self.num_generations:
            return (f"the global eval batch size ({self.eval_batch} x {self.processes}) must be divisible by "
                    f"num_generations ({self.num_generations}) (GRPOConfig, TRL 1.16)")
        if generation_batch % self.num_generations:
            return (f"the generation batch ({generation_batch} = per_device_train_batch_size x processes x "
                    f"steps_per_generation) must be divisible by num_generations ({self.num_generations}) "
                    "(GRPOConfig, TRL 1.16)")
        return None


def grpo_batch_error(spec: TrainingSpec, micro_batch: int | None = None) -> str | None:
    """Why GRPOConfig (TRL 1.16) would refuse this batch (:meth:`GrpoBatch.refusal`), or None (also None for the
    other trainers).

    Args:
        spec: The run (``spec.trainer`` GRPO's fields, ``spec.sharding.num_processes`` the world size).
        micro_batch: ``per_device_train_batch_size`` to check instead of the spec's.
    """
    if spec.trainer.kind is not TrainerKind.GRPO:
        return None
    return GrpoBatch.of(spec, micro_batch).refusal()


def grpo_steps_per_generation(spec: TrainingSpec) -> int:
    """Micro-batches one generation batch feeds (:attr:`GrpoBatch.steps`). At least 1."""
    return max(GrpoBatch.of(spec).steps, 1)


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

    Its checks, in its order: the batch's (:meth:`GrpoBatch.refusal`), with ``generation_batch_size`` and
    ``steps_per_generation`` not both given (between its first and second) and ``num_generations >= 2`` (last).
    Its evaluation check (the eval batch divisible by ``num_generations_eval or num_generations``) runs only with
    ``do_eval``, which no run sets; a given ``per_device_eval_batch_size`` is held to it anyway, so False is only
    ever "maybe": the caller then builds the class and TRL decides (and words it).

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
    if given_batch is not None and steps is not None:  # L1113-1116, after the given batch's own check
        return False
    batch = GrpoBatch(micro, 1, accum, generations, given_batch, steps, eval_batch)
    return batch.refusal() is None and generations >= 2  # L1137-1141: at least 2 generations
