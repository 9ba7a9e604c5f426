"""Run TRL's own config validation on the TRL settings of a ``fitcheck estimate`` run (TRL 1.16).

``--trainer sft --num_generations 4`` or ``--trainer reward --packing`` name fields the trainer's config class does
not have (``SFTConfig.__init__`` raises ``TypeError``); ``--num_generations 0`` or a generation batch that is no
multiple of ``num_generations`` are refused by ``GRPOConfig.__post_init__`` (``ZeroDivisionError`` /
``ValueError``, trl/trainer/grpo_config.py). The config object is built here from the run's values and the
class's own checks decide; what they raise is a ``ConfigError`` (exit 2), with TRL's message.

Multi-process runs: ``GRPOConfig`` divides by ``self.world_size``, which is this process's (1), so the run's
per-process batch is passed as the batch of all its processes (``per_device_train_batch_size x num_processes``).
TRL and torch are imported only here, and only when the run names a TRL trainer and TRL is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from collections.abc import Mapping

from fitcheck.core.trainers import grpo_batch_error, trainer_row
from fitcheck.errors import ConfigError, short_repr
from fitcheck.spec import TrainingSpec

# fitcheck flags that describe the data where TRL 1.16 has no config field (readers/trl_settings.py): passed to
# the config class only when it has such a field (GRPOConfig.max_completion_length)
_DATA_LENGTHS = ("max_prompt_length", "max_completion_length")


def check_trl_config(spec: TrainingSpec, trl: Mapping[str, object]) -> None:
    """Build the run's TRL config object (``SFTConfig``, ``DPOConfig``, ``GRPOConfig``, ``RewardConfig``,
    ``KTOConfig``) and let its ``__init__`` / ``__post_init__`` validate the settings.

    Args:
        spec: The run (batch, accumulation, processes).
        trl: The TRL flags as given (``readers.split_trl_values``).

    Raises:
        ConfigError: TRL refuses the settings (an unknown field, a value its checks reject).
    """
    row = trainer_row(spec.trainer.kind)
    if row.config_class is None or importlib.util.find_spec("trl") is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import trl as trl_module

    cls = getattr(trl_module, row.config_class)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, object] = {}
    for key, value in trl.items():
        if key == "trainer" or (key in _DATA_LENGTHS and key not in fields):
            continue
        if key not in fields:
            raise ConfigError(
                f"--{key} with --trainer {spec.trainer.kind.value}: TRL 1.16's {row.config_class} has no field "
                f"{key!r} ({row.config_class}.__init__ refuses it); drop --{key} or use the trainer it belongs to"
            )
        kwargs[key] = _typed(cls, key, value)
    processes = max(1, spec.sharding.num_processes)
    kwargs.update(
        output_dir="fitcheck-trl-config-check",  # TrainingArguments keeps the name; nothing is created
        report_to=[],
        use_cpu=True,  # no accelerator checks on this machine: the settings are what is checked
        per_device_train_batch_size=spec.batch.micro_batch * processes,
        gradient_accumulation_steps=spec.batch.grad_accum,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls(**kwargs)
    except (ValueError, TypeError, ZeroDivisionError, AssertionError) as exc:
        what = str(exc) or type(exc).__name__
        if grpo_batch_error(spec) is not None and "num_generations" in what:
            return  # the report carries it as the grpo-batch-refused error (exit 2, with the report printed)
        if isinstance(exc, ZeroDivisionError):
            what = f"division by zero in its checks ({what}): a count is 0"
        raise ConfigError(
            f"--trainer {spec.trainer.kind.value}: TRL 1.16's {row.config_class} refuses these settings: "
            f"{short_repr(what)[1:-1] if len(what) > 80 else what}"
        ) from None


def _typed(cls: type, key: str, value: object) -> object:
    """A flag's text as the config field's type (TRL's parser does the same with the dataclass types)."""
    if not isinstance(value, str):
        return value
    field_type = str({f.name: f.type for f in dataclasses.fields(cls)}[key])
    text = value.strip()
    if "bool" in field_type:
        return text.lower() in ("1", "true", "yes", "on")
    if field_type.startswith("list") or "list[" in field_type:
        return [text]
    for kind in (int, float):
        if kind.__name__ in field_type:
            try:
                return kind(text)
            except ValueError:
                raise ConfigError(f"--{key}: expected {kind.__name__}, got {short_repr(value)}") from None
    return value
