"""``fitcheck launch`` with a TRL script: the trainer and its TRL config fields, read from the script's own flags.

A TRL example script parses its command line with ``TrlParser((ScriptArguments, SFTConfig | DPOConfig |
GRPOConfig | RewardConfig, ModelConfig))``. fitcheck never imports or runs the script. It

1. names the trainer: ``fitcheck launch --trainer X``, else the one TRL config class the script's text names
   (``SFTConfig`` ... ``RewardConfig``; several, or a TRL trainer fitcheck does not model, exit 2 with the fix);
2. parses the script's arguments with TRL's OWN parser for those classes (``trl.TrlParser``, TRL 1.16
   ``trl/scripts/utils.py``: field names, types, ``--no_<flag>`` and defaults are TRL's), without building the
   dataclasses (``parse_known_args``: no ``TrainingArguments.__post_init__``, no device probing, no environment
   changes); ``--config FILE`` (TrlParser's YAML) sets defaults the same way ``set_defaults_with_config`` does;
3. hands the memory-relevant TRL fields on as run settings, read like ``fitcheck estimate --trainer X``
   (:mod:`fitcheck.readers.trl_settings`): TRL's defaults for absent flags, DPO's reference copy, GRPO's generation.

``model_name_or_path``, ``--use_peft``, ``--lora_r``, ``--lora_alpha``, ``--lora_target_modules``,
``--load_in_4bit`` (``ModelConfig``) are read by the script-argv reader as for every script. Lengths TRL 1.16 has no
config field for (GRPO's prompt, DPO's prompt/completion split) come from ``fitcheck launch --max_prompt_length``.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping, Sequence
from contextlib import redirect_stderr
from typing import Any

from fitcheck.core.trainers import CONFIG_CLASSES, trainer_row
from fitcheck.errors import ConfigError
from fitcheck.readers import TRL_FLAG_NAMES
from fitcheck.spec import TrainerKind

_MAX_SCRIPT_CHARS = 4 * 1024 * 1024  # a training script is read for its TRL config names; no script is larger
# TRL configs of trainers fitcheck does not model (trl 1.16 trl/__init__.py and trl/experimental)
_EVAL_FLAGS = ("per_device_eval_batch_size", "eval_accumulation_steps", "prediction_loss_only")
_NOT_MODELLED = ("ORPOConfig", "CPOConfig", "PPOConfig", "RLOOConfig", "OnlineDPOConfig", "GKDConfig",
                 "PRMConfig", "XPOConfig", "NashMDConfig", "BCOConfig")

def detect_trainer(script: str, forced: object | None) -> TrainerKind | None:
    """The TRL trainer a script runs: ``--trainer`` given to fitcheck, else the one TRL config its text names.

    Raises:
        ConfigError: An unknown ``--trainer``, several TRL configs in the script, or a TRL trainer not modelled.
    """
    if forced is not None:
        try:
            return TrainerKind(str(forced))
        except ValueError:
            raise ConfigError(f"fitcheck launch --trainer {forced}: expected one of "
                              + ", ".join(k.value for k in TrainerKind)) from None
    if not os.path.isfile(script):  # a FIFO, a device, a module path: never opened (a FIFO blocks on open)
        return None
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            text = f.read(_MAX_SCRIPT_CHARS)
    except OSError:
        return None  # not readable here (a module path, a remote file): a plain TrainingArguments script
    found = sorted(name for name in CONFIG_CLASSES if re.search(rf"\b{name}\b", text))
    other = sorted(name for name in _NOT_MODELLED if re.search(rf"\b{name}\b", text))
    if len(found) > 1:
        raise ConfigError(f"{script} names {' and '.join(found)}: say which trainer runs with fitcheck launch "
                          "--trainer sft|dpo|grpo|reward|kto")
    if not found and other:
        raise ConfigError(f"{script} uses TRL's {other[0]}: that trainer is not modelled (fitcheck models the SFT, "
                          "DPO, GRPO, reward and KTO trainers); pass --trainer trainer to estimate it as a plain "
                          "Trainer step, knowing its own allocations are left out")
    return CONFIG_CLASSES[found[0]] if found else None


def parse_trl_flags(kind: TrainerKind, argv: Sequence[str]) -> dict[str, object]:
    """The TRL fields of ``kind``'s config from a script's arguments, parsed by ``trl.TrlParser`` (see module doc).

    Raises:
        ConfigError: TRL is not installed, or TRL's parser refuses a value.
    """
    try:
        import trl
    except ImportError:
        raise ConfigError("fitcheck launch: the script runs a TRL trainer but trl is not installed here; "
                          "pip install 'fitcheck[trl]'") from None
    lib: Any = trl
    cls = getattr(lib, str(trainer_row(kind).config_class))
    parser = lib.TrlParser((lib.ScriptArguments, cls, lib.ModelConfig))
    args = list(argv)
    if "--config" in args:  # TrlParser's YAML: defaults the command line overrides (its `env` block is not applied)
        at = args.index("--config")
        path = args[at + 1] if at + 1 < len(args) else ""
        del args[at:at + 2]
        parser.set_defaults_with_config(**{k: v for k, v in _yaml(path).items() if k != "env"})
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            ns, _ = parser.parse_known_args(args)
    except SystemExit:
        msg = (err.getvalue().strip().splitlines() or ["invalid arguments"])[-1]
        raise ConfigError(f"the script's arguments, as TRL's TrlParser ({cls.__name__}) reads them: {msg}") from None
    given = {a[2:].split("=")[0].replace("-", "_") for a in args if a.startswith("--")}
    out: dict[str, object] = {"trainer": kind.value}
    for name in trainer_row(kind).script_fields:  # the config fields the estimate reads
        value = getattr(ns, name, None)
        if value is not None:
            out[name] = value
    if getattr(ns, "eval_strategy", "no") not in ("no", None) or getattr(ns, "do_eval", False):
        out["per_device_eval_batch_size"] = ns.per_device_eval_batch_size
        if ns.eval_accumulation_steps is not None:
            out["eval_accumulation_steps"] = ns.eval_accumulation_steps
        if "prediction_loss_only" in given:
            out["prediction_loss_only"] = ns.prediction_loss_only
    return out


def _yaml(path: str) -> dict[str, Any]:
    from fitcheck.readers import read_text_file, safe_yaml_load

    data = safe_yaml_load(read_text_file(path, what="--config"), source=path, what="--config")
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: must contain a YAML mapping (TrlParser)")
    return data


class TrlLaunchHook:
    """What ``integrations.launch_report`` calls for the TRL part of a launch (cli is above integrations)."""

    def split(self, ns: Any, values: Mapping[str, object]) -> dict[str, object]:
        """The launch's values with the TRL trainer's fields read from the script's own arguments.

        The TRL fields are run settings: ``run_args.spec_from_settings`` builds the ``TrainerSpec`` from them
        (TRL's defaults for absent fields: ``readers/trl_settings.py``).
        """
        vals = dict(values)
        kind = detect_trainer(str(ns.training_script), vals.pop("trainer", None))
        if kind is None or not trainer_row(kind).trl:  # a plain TrainingArguments script: no evaluation phase
            return {k: v for k, v in vals.items() if k not in ("max_prompt_length", *_EVAL_FLAGS)}
        script = parse_trl_flags(kind, list(ns.training_script_args or []))
        keep = {k: v for k, v in vals.items() if k not in TRL_FLAG_NAMES or k == "max_prompt_length"}
        return {**script, **keep}
