"""Run TRL's own config validation on the TRL settings of a ``fitcheck estimate`` run (TRL 1.16).

``--trainer sft --num_generations 4`` or ``--trainer reward --packing`` name fields the trainer's config class does
not have (``SFTConfig.__init__`` raises ``TypeError``); ``--num_generations 0`` or a generation batch that is no
multiple of ``num_generations`` are refused by ``GRPOConfig.__post_init__`` (``ZeroDivisionError`` /
``ValueError``, trl/trainer/grpo_config.py). The config object is built here from the run's values and the
class's own checks decide; what they raise is a ``ConfigError`` (exit 2), with TRL's message.

Multi-process runs: ``GRPOConfig`` divides by ``self.world_size``, which is this process's (1), so the run's
per-process batch is passed as the batch of all its processes (``per_device_train_batch_size x num_processes``).
TRL and torch are imported only here, and only when the run names a TRL trainer, TRL is installed and the config
class's ``__post_init__`` reads a field the run sets (DPOConfig: ``--loss_type``; TRL 1.16) whose check is not
modelled (GRPOConfig reads the batch, always: its batch checks are ``core.trainers.grpo_config_accepts``, and only
a batch they may refuse builds the class), or its source cannot be read with ``ast``
(``fitcheck.readers.trl_source``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fitcheck.core.trainers import GRPO_CONFIG_MODELLED, grpo_batch_error, grpo_config_accepts, trainer_row
from fitcheck.errors import ConfigError, short_repr
from fitcheck.spec import TrainerKind, TrainingSpec

if TYPE_CHECKING:
    from fitcheck.readers import ConfigSource

# fitcheck flags that describe the data where TRL 1.16 has no config field (readers/trl_settings.py): passed to
# the config class only when it has such a field (GRPOConfig.max_completion_length)
_DATA_LENGTHS = ("max_prompt_length", "max_completion_length")


def check_trl_config(spec: TrainingSpec, trl: Mapping[str, object]) -> None:
    """Build the run's TRL config object (``SFTConfig``, ``DPOConfig``, ``GRPOConfig``, ``RewardConfig``,
    ``KTOConfig``) and let its ``__init__`` / ``__post_init__`` validate the settings.

    The field names and types come from the installed trl's source (``readers.read_config_fields``), and the
    class is built (importing trl, transformers and torch: ~10 s cold) only when its ``__post_init__`` reads a
    field this run sets (``ConfigSource.checks_read``) and its checks of those fields are not modelled
    (:func:`_modelled`): otherwise every field it reads keeps its default, or passes GRPOConfig's batch checks as
    ``grpo_config_accepts`` models them, and the checks run as for a config the tests build.
    ``TrainingArguments.__post_init__`` (with ``_validate_args``, ``_process_fsdp_args``; transformers 5.23
    training_args.py) reads none of the fields set here, so skipping it changes nothing either. Where the source
    cannot be read that way, trl is imported.

    Args:
        spec: The run (batch, accumulation, processes).
        trl: The TRL flags as given (``readers.split_trl_values``).

    Raises:
        ConfigError: TRL refuses the settings (an unknown field, a value its checks reject).
    """
    row = trainer_row(spec.trainer.kind)
    if row.config_class is None or importlib.util.find_spec("trl") is None:
        return
    from fitcheck.readers import read_config_class, read_config_fields  # TRL runs only

    given = {k: v for k, v in trl.items() if k != "trainer"}
    source = read_config_class("trl", row.config_class)
    types = read_config_fields("trl", row.config_class, given) if source is not None else None
    cls = None
    if types is None:
        cls = _imported(row.config_class)
        types = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name in given}
    kwargs: dict[str, object] = {}
    for key, value in given.items():
        if key in _DATA_LENGTHS and key not in types:
            continue
        if key not in types:
            raise ConfigError(
                f"--{key} with --trainer {spec.trainer.kind.value}: TRL 1.16's {row.config_class} has no field "
                f"{key!r} ({row.config_class}.__init__ refuses it); drop --{key} or use the trainer it belongs to"
            )
        kwargs[key] = _typed(types[key], key, value)
    processes = max(1, spec.sharding.num_processes)
    kwargs.update(
        per_device_train_batch_size=spec.batch.micro_batch * processes,
        gradient_accumulation_steps=spec.batch.grad_accum,
    )
    if source is not None and source.checks_read is not None and _modelled(spec, source, kwargs):
        return
    kwargs.update(
        output_dir="fitcheck-trl-config-check",  # TrainingArguments keeps the name; nothing is created
        report_to=[],
        use_cpu=True,  # no accelerator checks on this machine: the settings are what is checked
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (cls or _imported(row.config_class))(**kwargs)
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


def _modelled(spec: TrainingSpec, source: ConfigSource, kwargs: Mapping[str, object]) -> bool:
    """Whether the class's checks are known to pass for ``kwargs`` without building it.

    True when its ``__post_init__`` reads none of the fields set (every field it reads keeps its default), or, for
    ``GRPOConfig``, when the fields it reads are ``GRPO_CONFIG_MODELLED`` and ``grpo_config_accepts`` (its batch
    checks, TRL 1.16) passes them: GRPOConfig reads the batch size, which every run sets. False: the class is built
    and TRL decides, so a refusal is TRL's own, with TRL's message.
    """
    assert source.checks_read is not None
    read = source.checks_read & kwargs.keys()
    if not read:
        return True
    if spec.trainer.kind is not TrainerKind.GRPO or not read <= GRPO_CONFIG_MODELLED:
        return False
    return grpo_config_accepts({**source.defaults, **kwargs})


def _imported(name: str) -> Any:
    """The config class from trl itself (imports trl, transformers, torch).

    TRL 1.16's config classes subclass ``transformers.TrainingArguments``, whose module imports ``trainer_utils``,
    which imports peft (transformers 5.23 ``trainer_utils.py``), which imports bitsandbytes (peft 0.21.2
    ``helpers.py``): bitsandbytes is imported first the way the tracer imports it (``tracer_patches.
    bitsandbytes_uncompiled``: without ``torch.compile``'s inductor lookup; 5.9 -> 4.6 CPU-s for ``trl.GRPOConfig``
    in a fresh process, 2-core development machine, load 10, median of 3).
    """
    from fitcheck.torch_adapters.tracer_patches import bitsandbytes_uncompiled

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bitsandbytes_uncompiled()
        import trl as trl_module
    return getattr(trl_module, name)


def _typed(field_type: str, key: str, value: object) -> object:
    """A flag's text as the config field's type (TRL's parser does the same with the dataclass types).

    ``field_type``: the annotation as text (the source's, or ``str`` of the imported field's type).
    """
    if not isinstance(value, str):
        return value
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
