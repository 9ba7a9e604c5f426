"""Read a PEFT LoRA configuration: a ``LoraConfig`` object, an ``adapter_config.json``, or TRL flags.

Field names and defaults are peft 0.21's ``LoraConfig`` (``peft/tuners/lora/config.py``: r=8, lora_alpha=8,
lora_dropout=0.0) and TRL's ``ModelConfig`` for the flags (``trl/trainer/model_config.py``: lora_r=16,
lora_alpha=32, lora_dropout=0.05). Other PEFT methods (``peft_type`` other than LORA) are not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from fitcheck.errors import ConfigError, NotModelledError
from fitcheck.readers.sources import as_bool, as_float, as_int, as_str_list, load_mapping_file, where
from fitcheck.spec import LoraSpec

_LORA_FIELDS = (
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "modules_to_save",
    "use_dora",
    "use_rslora",
    "target_parameters",
    "layers_to_transform",
    "rank_pattern",
    "peft_type",
)


def lora_from_mapping(raw: Mapping[str, object], *, source: str) -> LoraSpec:
    """A :class:`LoraSpec` from ``LoraConfig`` fields (an ``adapter_config.json`` or
    ``LoraConfig.to_dict()``).

    Args:
        raw: Field name -> value.
        source: Where it came from.

    Returns:
        The LoRA spec.

    Raises:
        ConfigError: Bad values.
        NotModelledError: A PEFT method other than LoRA.
    """
    peft_type = raw.get("peft_type")
    if isinstance(peft_type, Enum):
        peft_type = peft_type.value
    if peft_type is not None and str(peft_type).upper() != "LORA":
        raise NotModelledError(
            f"{where(source, 'peft_type')}: {peft_type} adapters are not modelled; only LoRA "
            "(and DoRA via use_dora) are"
        )
    r = as_int(raw.get("r", 8), at=where(source, "r"), minimum=1)
    alpha = as_float(raw.get("lora_alpha", 8), at=where(source, "lora_alpha"))
    dropout = as_float(raw.get("lora_dropout", 0.0) or 0.0, at=where(source, "lora_dropout"))
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"{where(source, 'lora_dropout')}: must be in [0, 1), got {dropout}")
    targets: tuple[str, ...] = ()
    regex: str | None = None
    tm = raw.get("target_modules")
    if isinstance(tm, str) and tm != "all-linear":
        regex = tm  # peft: a string target_modules is a full-match regex over module names
    elif tm is not None:
        targets = as_str_list([tm] if tm == "all-linear" else tm, at=where(source, "target_modules"))
    saved = as_str_list(raw.get("modules_to_save") or [], at=where(source, "modules_to_save"))
    params = as_str_list(raw.get("target_parameters") or [], at=where(source, "target_parameters"))
    layers_raw = raw.get("layers_to_transform")
    layers: tuple[int, ...] | None = None
    if layers_raw is not None:
        items = layers_raw if isinstance(layers_raw, (list, tuple)) else [layers_raw]
        layers = tuple(as_int(x, at=where(source, "layers_to_transform"), minimum=0) for x in items)
    pattern_raw = raw.get("rank_pattern") or {}
    if not isinstance(pattern_raw, Mapping):
        raise ConfigError(f"{where(source, 'rank_pattern')}: expected a mapping of module pattern -> rank")
    pattern = {
        str(k): as_int(v, at=where(source, f"rank_pattern.{k}"), minimum=1) for k, v in pattern_raw.items()
    }
    return LoraSpec(
        r=r,
        alpha=alpha,
        dropout=dropout,
        target_modules=targets,
        target_regex=regex,
        modules_to_save=saved,
        use_dora=as_bool(raw.get("use_dora", False) or False, at=where(source, "use_dora")),
        use_rslora=as_bool(raw.get("use_rslora", False) or False, at=where(source, "use_rslora")),
        target_parameters=params,
        layers_to_transform=layers,
        rank_pattern=pattern,
    )


def read_adapter_config(path: str) -> LoraSpec:
    """Read an ``adapter_config.json`` (what ``LoraConfig.save_pretrained`` writes).

    Raises:
        ConfigError: Missing/malformed file or bad values.
        NotModelledError: A PEFT method other than LoRA.
    """
    return lora_from_mapping(load_mapping_file(path, what="PEFT adapter config"), source=path)


def lora_from_object(config: object, *, source: str = "LoraConfig") -> LoraSpec:
    """Read a live ``peft.LoraConfig`` by attribute (peft is not imported).

    Raises:
        ConfigError: Bad values.
        NotModelledError: A PEFT method other than LoRA.
    """
    raw = {name: getattr(config, name) for name in _LORA_FIELDS if hasattr(config, name)}
    tm = raw.get("target_modules")
    if isinstance(tm, (set, frozenset)):
        raw["target_modules"] = sorted(str(t) for t in tm)  # peft stores a set after __post_init__
    return lora_from_mapping(raw, source=source)
