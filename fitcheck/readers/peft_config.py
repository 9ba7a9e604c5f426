"""Read a PEFT LoRA configuration: a ``LoraConfig`` object, an ``adapter_config.json``, or TRL flags.

Field names and defaults are peft 0.21's ``LoraConfig`` (``peft/tuners/lora/config.py``: r=8, lora_alpha=8,
lora_dropout=0.0) and TRL's ``ModelConfig`` for the flags (``trl/trainer/model_config.py``: lora_r=16,
lora_alpha=32, lora_dropout=0.05). The ``LoraConfig`` settings in :data:`UNMODELLED_LORA_SETTINGS` are refused
rather than estimated as plain LoRA. An ``adapter_config.json`` of another PEFT method in :data:`TRACED_PEFT_TYPES`
is read as a :class:`~fitcheck.spec.PeftAdapterSpec` (estimated only from the real peft model, built by
``torch_adapters/peft_adapters.py``); every other ``peft_type`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum

from fitcheck.errors import ConfigError, NotModelledError
from fitcheck.readers.sources import as_bool, as_float, as_int, as_str_list, load_mapping_file, where
from fitcheck.spec import LoraSpec, PeftAdapterSpec

# The PEFT methods other than LoRA that fitcheck estimates: peft 0.21.2 builds each from its adapter_config.json
# (``mapping.py`` PEFT_TYPE_TO_CONFIG_MAPPING, ``get_peft_model``) on the meta device for the tensor inventory and on
# fake tensors for the step; each is checked against a real CPU step of a tiny random Llama
# (``benchmarks/peft_adapters_cpu.py``, ``benchmarks/data/peft_adapters_cpu.json``). The one list of them.
TRACED_PEFT_TYPES: tuple[str, ...] = (
    "ADALORA",
    "IA3",
    "LN_TUNING",
    "LOHA",
    "LOKR",
    "OFT",
    "PREFIX_TUNING",
    "PROMPT_TUNING",
    "P_TUNING",
    "VERA",
)


def _set(value: object) -> bool:
    return value not in (None, False, "none", "", [], {}, ())


def _mica(value: object) -> bool:
    return isinstance(value, str) and value.lower() == "mica"


# peft 0.21.2 ``tuners/lora/config.py`` LoraConfig fields that change which tensors exist, which are trained, or
# what the forward saves, and that fitcheck does not model (field, is it set, what it does). Estimating such a
# config as plain LoRA would be silently wrong, so it is refused. Init-only settings (``init_lora_weights`` other
# than "mica", ``loftq_config``, ``eva_config``, ``corda_config``, ``lora_ga_config``) leave the trained tensors'
# shapes and trainability as plain LoRA's and are accepted.
UNMODELLED_LORA_SETTINGS: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("exclude_modules", _set, "modules excluded from the targets"),
    ("bias", _set, "training the base model's biases"),
    ("lora_bias", _set, "a trainable bias on every lora_B"),
    ("layer_replication", _set, "replicated decoder layers"),
    ("trainable_token_indices", _set, "trainable token rows of the embeddings"),
    ("use_bdlora", _set, "block-diagonal LoRA factors (BD-LoRA)"),
    ("init_lora_weights", _mica, "MiCA, a LoRA variant whose B factor is frozen"),
    ("kasa_config", _set, "KaSA, a LoRA variant with a trainable diagonal between A and B"),
    ("use_qalora", _set, "QA-LoRA's pooled adapter input"),
    ("velora_config", _set, "VeLoRA's compressed saved activations"),
    ("monteclora_config", _set, "MonteCLoRA's sampled adapters"),
    ("arrow_config", _set, "Arrow routing over several adapters"),
    ("alora_invocation_tokens", _set, "activated LoRA (aLoRA)"),
    ("megatron_config", _set, "Megatron-LM parallel linear layers"),
)


def refuse_unmodelled_lora_settings(get: Callable[[str], object], *, source: str) -> None:
    """Refuse a LoRA config that sets a field of :data:`UNMODELLED_LORA_SETTINGS`.

    Args:
        get: Field name -> value (``None`` when absent).
        source: Where the config came from.

    Raises:
        NotModelledError: Naming the first such field and how to estimate without it.
    """
    for key, is_set, what in UNMODELLED_LORA_SETTINGS:
        value = get(key)
        if is_set(value):
            raise NotModelledError(
                f"{where(source, key)}: {key}={value!r} ({what}) is not modelled; only plain LoRA and DoRA are. "
                f"To estimate the run as plain LoRA anyway, remove '{key}' from the config"
            )


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
    *(key for key, _, _ in UNMODELLED_LORA_SETTINGS),
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
        NotModelledError: A PEFT method other than LoRA, or a setting of :data:`UNMODELLED_LORA_SETTINGS`.
    """
    peft_type = _peft_type(raw)
    if peft_type is not None and peft_type.upper() != "LORA":
        raise NotModelledError(_not_lora(peft_type, source))
    refuse_unmodelled_lora_settings(raw.get, source=source)
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


def _peft_type(raw: Mapping[str, object]) -> str | None:
    """The mapping's ``peft_type`` as written (peft's ``PeftType`` enum of ``LoraConfig.to_dict()`` as its value)."""
    peft_type = raw.get("peft_type")
    if isinstance(peft_type, Enum):
        peft_type = peft_type.value
    return None if peft_type is None else str(peft_type)


def _not_lora(peft_type: str, source: str) -> str:
    """Why a ``peft_type`` other than LoRA is refused where only LoRA is read, or not modelled at all."""
    if peft_type.upper() in TRACED_PEFT_TYPES:
        return (f"{where(source, 'peft_type')}: {peft_type} adapters are estimated only from the real peft model "
                "(torch and peft installed, without --no_trace): pass the file as --adapter_config")
    return (f"{where(source, 'peft_type')}: {peft_type} adapters are not modelled; LoRA (DoRA, rsLoRA) and "
            f"{', '.join(TRACED_PEFT_TYPES)} are. Use one of these, or estimate a LoRA of similar size")


def adapter_from_mapping(raw: Mapping[str, object], *, source: str) -> LoraSpec | PeftAdapterSpec:
    """An ``adapter_config.json``'s mapping: a :class:`LoraSpec` for LoRA, a :class:`PeftAdapterSpec` for a
    method of :data:`TRACED_PEFT_TYPES`.

    Raises:
        ConfigError: Bad values.
        NotModelledError: Another PEFT method, or a LoRA setting of :data:`UNMODELLED_LORA_SETTINGS`.
    """
    peft_type = _peft_type(raw)
    if peft_type is None or peft_type.upper() == "LORA":
        return lora_from_mapping(raw, source=source)
    name = peft_type.upper()
    if name not in TRACED_PEFT_TYPES:
        raise NotModelledError(_not_lora(name, source))
    return PeftAdapterSpec(name, PeftAdapterSpec.canonical({**raw, "peft_type": name}), source)


def adapter_from_object(config: object, *, source: str) -> LoraSpec | PeftAdapterSpec:
    """A live peft ``PeftConfig`` (a ``PeftModel.peft_config`` entry, or the config given to ``preflight``) read as
    its ``adapter_config.json``: ``PeftConfigMixin.to_dict`` (peft 0.21.2 ``config.py``) is what
    ``save_pretrained`` writes, so it goes through :func:`adapter_from_mapping`; a ``LoraConfig`` through
    :func:`lora_from_object`.

    Raises:
        ConfigError: Not a peft config, or bad values.
        NotModelledError: A PEFT method not modelled.
    """
    to_dict = getattr(config, "to_dict", None)
    raw = to_dict() if callable(to_dict) else None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a peft PeftConfig (LoraConfig, IA3Config, ...), got "
                          f"{type(config).__name__}")
    peft_type = _peft_type(raw)
    if peft_type is None or peft_type.upper() == "LORA":
        return lora_from_object(config, source=source)  # its attributes (target_modules is a set after init)
    return adapter_from_mapping(raw, source=source)


def read_adapter_config(path: str) -> LoraSpec | PeftAdapterSpec:
    """Read an ``adapter_config.json`` (what ``PeftConfig.save_pretrained`` writes).

    Raises:
        ConfigError: Missing/malformed file or bad values.
        NotModelledError: A PEFT method not modelled (not LoRA nor one of :data:`TRACED_PEFT_TYPES`).
    """
    return adapter_from_mapping(load_mapping_file(path, what="PEFT adapter config"), source=path)


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
