"""What :func:`fitcheck.integrations.trainer.preflight` checks and reads before it builds a spec.

* :func:`check_preflight_inputs`: refuse what preflight cannot read (no model, an ``args`` that is no
  ``TrainingArguments``, a keyword that is no ``fitcheck estimate`` setting) instead of estimating something else.
* :func:`config_use_cache`: the ``use_cache`` a config or its inventory states.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["check_preflight_inputs", "config_use_cache"]


def check_preflight_inputs(model_or_config: Any, args: Any, overrides: Mapping[str, object]) -> None:
    """Refuse what :func:`preflight` cannot read instead of estimating something else.

    Raises:
        ConfigError: No model, an ``args`` that is no ``TrainingArguments`` (or TRL config, a subclass), or a
            keyword that is no ``fitcheck estimate`` setting (a misspelt ``max_seq_lenght`` would otherwise be
            dropped and the default length estimated).
    """
    import difflib

    from fitcheck.errors import ConfigError, short_repr
    from fitcheck.readers import SETTINGS, canonical_key

    if model_or_config is None or (isinstance(model_or_config, str) and not model_or_config.strip()):
        raise ConfigError("preflight(model_or_config=...): give a Hub id or local path, a PretrainedConfig or a "
                          "loaded model; got " + short_repr(model_or_config))
    if args is not None:
        from transformers import TrainingArguments

        if not isinstance(args, TrainingArguments):
            raise ConfigError(
                f"preflight(args=...): expected a transformers TrainingArguments or a TRL config (SFTConfig, "
                f"DPOConfig, GRPOConfig, ...), got {type(args).__name__} {short_repr(args)}; pass settings that "
                "are not in a TrainingArguments as keywords, e.g. preflight(model, max_seq_length=4096)"
            )
    known = {*SETTINGS, "max_prompt_length", "max_completion_length"}
    unknown = [k for k in overrides if canonical_key(k) not in known]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(
            "preflight: unknown keyword " + ", ".join(hints) + "; keywords are `fitcheck estimate` flag names "
            "(fitcheck estimate --help lists them)"
        )


def config_use_cache(model_or_config: Any, inventory: Any) -> bool | None:
    value = getattr(model_or_config, "use_cache", None)
    if isinstance(value, bool):
        return value
    raw = inventory.config.get("use_cache") if inventory.config else None
    return raw if isinstance(raw, bool) else None
