"""Set a Trainer's micro-batch before its dataloader is built, DeepSpeed's three batch keys included.

Used by :func:`fitcheck.integrations.tuner.tune_micro_batch` (once, at the end) and by the DeepSpeed trial
engines (:mod:`fitcheck.integrations.tuner_engine`, once per trial); users call :func:`set_trainer_micro_batch`
for a size they pick (it is re-exported by :mod:`fitcheck.integrations.tuner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def deepspeed_configs(trainer_or_args: Any) -> list[dict[str, Any]]:
    """The DeepSpeed config dicts a Trainer (or its TrainingArguments) reads; often one object.

    ``args.hf_deepspeed_config.config`` (TrainingArguments ``__post_init__``), the accelerator plugin's
    ``hf_ds_config.config`` and ``deepspeed_config`` (accelerate 1.15 ``DeepSpeedPlugin``; a new object when
    ``propagate_args_to_deepspeed`` re-made it).
    """
    args = getattr(trainer_or_args, "args", trainer_or_args)
    accelerator = getattr(trainer_or_args, "accelerator", None)
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    out: list[dict[str, Any]] = []
    candidates = (getattr(getattr(args, "hf_deepspeed_config", None), "config", None),
                  getattr(getattr(plugin, "hf_ds_config", None), "config", None),
                  getattr(plugin, "deepspeed_config", None))
    for config in candidates:
        if isinstance(config, dict) and all(config is not c for c in out):
            out.append(config)
    return out


@dataclass(frozen=True)
class TrainerBatch:
    """What :func:`set_trainer_micro_batch` set.

    Attributes:
        micro_batch: ``per_device_train_batch_size``.
        grad_accum: ``gradient_accumulation_steps``.
        train_batch_size: micro × accumulation × world size (DeepSpeed ``train_batch_size``).
        exact: True when the global batch before the change is kept exactly.
    """

    micro_batch: int
    grad_accum: int
    train_batch_size: int
    exact: bool


def _keep_global(per_gpu: int, micro: int) -> tuple[int, int]:
    """The rule of ``fitcheck.advice.batch_search.plan_global_batch`` on plain numbers."""
    m = min(micro, per_gpu)
    if per_gpu % m == 0:
        return m, per_gpu // m
    d = max(k for k in range(1, m) if per_gpu % k == 0)
    if 2 * d >= m:
        return d, per_gpu // d
    return m, per_gpu // m


def steps_per_generation(args: Any, micro: int) -> int:
    """``generation_batch_size / (micro × processes)``: the slices of one generation batch at ``micro``.

    Raises:
        ValueError: GRPOConfig refuses the batch at ``micro`` (``core.trainers.GrpoBatch.refusal``: the generation
            batch is not a multiple of ``micro × processes``).
    """
    from fitcheck.core.trainers import GrpoBatch

    batch = GrpoBatch(micro, int(getattr(args, "world_size", 1) or 1), int(args.gradient_accumulation_steps),
                      int(args.num_generations), generation_batch_size=int(args.generation_batch_size))
    refusal = batch.refusal()
    if refusal is not None:
        raise ValueError(f"{refusal}: micro-batch {micro} is not one GRPO accepts")
    return batch.steps


def set_trainer_micro_batch(
    trainer_or_args: Any, micro_batch: int, *, keep_global_batch: bool = True
) -> TrainerBatch:
    """Set the micro-batch of a Trainer (or its TrainingArguments) before its dataloader is built.

    Sets ``args.per_device_train_batch_size``; with ``keep_global_batch`` rescales
    ``args.gradient_accumulation_steps`` (rule: ``fitcheck.advice.batch_search.plan_global_batch``); updates
    the Trainer's private ``_train_batch_size`` (copied from args in ``Trainer.__init__``; guarded by
    ``hasattr``); for TRL's GRPO, ``steps_per_generation`` at the same ``generation_batch_size`` (a ValueError
    when GRPOConfig would refuse the size); and writes DeepSpeed's ``train_micro_batch_size_per_gpu``,
    ``gradient_accumulation_steps`` and ``train_batch_size`` into ``args.hf_deepspeed_config.config`` (the dict
    accelerate's DeepSpeed plugin shares, transformers/integrations/deepspeed.py ``propagate_args_to_deepspeed``),
    so DeepSpeed's check
    ``train_batch_size == micro × accumulation × world`` holds at every ZeRO stage.

    Args:
        trainer_or_args: A ``transformers.Trainer`` or ``TrainingArguments``.
        micro_batch: The micro-batch to use.
        keep_global_batch: Rescale gradient accumulation to keep micro × accumulation.

    Returns:
        What was set.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    args = getattr(trainer_or_args, "args", trainer_or_args)
    old_micro = int(args.per_device_train_batch_size)
    old_gas = int(args.gradient_accumulation_steps)
    per_gpu = old_micro * old_gas
    if keep_global_batch:
        micro, gas = _keep_global(per_gpu, micro_batch)
    else:
        micro, gas = micro_batch, old_gas
    world = int(getattr(args, "world_size", 1) or 1)
    grpo_steps = None
    if getattr(args, "steps_per_generation", None) and getattr(args, "generation_batch_size", None):
        # TRL GRPOConfig: the generation batch is kept, steps_per_generation follows (its __post_init__ rule)
        grpo_steps = steps_per_generation(args, micro)
    args.per_device_train_batch_size = micro
    if grpo_steps is not None:
        args.steps_per_generation = grpo_steps
    args.gradient_accumulation_steps = gas
    if trainer_or_args is not args and hasattr(trainer_or_args, "_train_batch_size"):
        n_gpu = max(1, int(getattr(args, "n_gpu", 1) or 1))  # DataParallel multiplies (training_args.py)
        trainer_or_args._train_batch_size = micro * n_gpu
    for config in deepspeed_configs(trainer_or_args):
        config["train_micro_batch_size_per_gpu"] = micro
        config["gradient_accumulation_steps"] = gas
        config["train_batch_size"] = micro * gas * world
    accelerator = getattr(trainer_or_args, "accelerator", None)
    state = getattr(getattr(accelerator, "gradient_state", None), "plugin_kwargs", None)
    if isinstance(state, dict) and "num_steps" in state and deepspeed_configs(trainer_or_args):
        # DeepSpeed only: accelerate 1.15 _prepare_deepspeed takes the config's accumulation as num_steps. Any
        # other Trainer keeps num_steps 1 (transformers 5.23 create_accelerator_and_postprocess: "The Trainer
        # handles GAS itself, so GAS=1 in Accelerate to avoid any double-division"); num_steps = gas made
        # Accelerator.backward divide every loss by gas a second time after tuning (half the gradient at 4 x 2).
        state["num_steps"] = gas
    return TrainerBatch(micro, gas, micro * gas * world, micro * gas == per_gpu)


