"""Read TrainingArguments (and TRL ModelConfig/SFTConfig) values the way transformers does.

Three inputs, one output. A live ``TrainingArguments``-like object, a JSON/YAML file of its fields (what
``HfArgumentParser.parse_json_file``/``parse_yaml_file`` read), or a training script's own command line
(``--per_device_train_batch_size 4 --bf16 --my_script_flag x``: flags the script defines for itself are passed
over). Each becomes an :class:`ArgsRead`: a flat mapping of *canonical* names (the names
``fitcheck.readers.run_args`` consumes) with, per name, the source and the spelling that was read.

Both generations of names are read (transformers 4.40+ and 5.x, older and newer TRL). Where a name has two
spellings, an info finding says which one was read; where one source holds both with different values, the
newer name wins, as in transformers 5 (``TrainingArguments.__post_init__``: "``gradient_checkpointing*`` are
deprecated aliases of ``activation_checkpointing*``, used only when the new name is not set").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from fitcheck.core.optimizers import canonical_optimizer
from fitcheck.errors import ConfigError, FitcheckError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import (
    as_bool,
    as_float,
    as_int,
    as_mapping,
    as_str,
    as_str_list,
    load_mapping_file,
    where,
)


@dataclass(frozen=True)
class _Key:
    kind: str  # int | posint | float | bool | str | list | dict | raw
    spellings: tuple[
        str, ...
    ] = ()  # other accepted names, most preferred first (the canonical name is tried first)
    notes: Mapping[str, str] = field(default_factory=dict)  # spelling -> which generation uses it


# Canonical name -> how to read it. Names are TrainingArguments fields (transformers 5.23 training_args.py),
# TRL ModelConfig fields (trl/trainer/model_config.py) and SFTConfig fields that change memory or that the
# DeepSpeed "auto" resolution needs (transformers/integrations/deepspeed.py trainer_config_process).
KEYS: dict[str, _Key] = {
    "per_device_train_batch_size": _Key(
        "posint",
        ("per_gpu_train_batch_size",),
        {"per_gpu_train_batch_size": "deprecated transformers 4.x name"},
    ),
    "per_device_eval_batch_size": _Key("posint", ("per_gpu_eval_batch_size",)),
    "gradient_accumulation_steps": _Key("posint"),
    "eval_accumulation_steps": _Key("posint"),
    "bf16": _Key("bool"),
    "fp16": _Key("bool"),
    "bf16_full_eval": _Key("bool"),
    "fp16_full_eval": _Key("bool"),
    "optim": _Key("str"),
    "optim_args": _Key("str"),
    "optim_target_modules": _Key("list"),
    "learning_rate": _Key("float"),
    "weight_decay": _Key("float"),
    "adam_beta1": _Key("float"),
    "adam_beta2": _Key("float"),
    "adam_epsilon": _Key("float"),
    "max_grad_norm": _Key("float"),
    "gradient_checkpointing": _Key(
        "bool",
        ("activation_checkpointing",),
        {
            "activation_checkpointing": "transformers 5.x name",
            "gradient_checkpointing": "transformers 4.x name (deprecated alias in 5.x, removed in v6)",
        },
    ),
    "gradient_checkpointing_kwargs": _Key(
        "dict",
        ("activation_checkpointing_kwargs",),
        {
            "activation_checkpointing_kwargs": "transformers 5.x name",
            "gradient_checkpointing_kwargs": "transformers 4.x name (deprecated alias in 5.x)",
        },
    ),
    "eval_strategy": _Key(
        "str",
        ("evaluation_strategy",),
        {"eval_strategy": "transformers >= 4.41 name", "evaluation_strategy": "transformers < 4.46 name"},
    ),
    "torch_compile": _Key("bool"),
    "use_liger_kernel": _Key("bool"),
    "liger_kernel_config": _Key("raw"),
    "auto_find_batch_size": _Key("bool"),
    "torch_empty_cache_steps": _Key("posint"),
    "ddp_bucket_cap_mb": _Key("posint"),
    "ddp_find_unused_parameters": _Key("bool"),
    "use_cpu": _Key("bool", ("no_cuda",), {"no_cuda": "transformers < 4.34 name of use_cpu"}),
    "label_smoothing_factor": _Key("float"),
    "fsdp": _Key("raw"),
    "fsdp_config": _Key("raw"),
    "deepspeed": _Key("raw"),
    "accelerator_config": _Key("raw"),
    "parallelism_config": _Key("raw"),
    # TRL ModelConfig
    "model_name_or_path": _Key("str"),
    "dtype": _Key(
        "str",
        ("torch_dtype",),
        {"dtype": "transformers 5.x / current TRL name", "torch_dtype": "transformers 4.x / older TRL name"},
    ),
    "attn_implementation": _Key("str"),
    "trust_remote_code": _Key("bool"),
    "use_peft": _Key("bool"),
    "lora_r": _Key("posint"),
    "lora_alpha": _Key("float"),
    "lora_dropout": _Key("float"),
    "lora_target_modules": _Key("list"),
    "lora_target_parameters": _Key("list"),
    "lora_modules_to_save": _Key("list"),
    "use_rslora": _Key("bool"),
    "use_dora": _Key("bool"),
    "load_in_4bit": _Key("bool"),
    "load_in_8bit": _Key("bool"),
    "bnb_4bit_quant_type": _Key("str"),
    "use_bnb_nested_quant": _Key("bool"),
    "bnb_4bit_quant_storage": _Key("str"),
    # TRL SFTConfig
    "max_seq_length": _Key(
        "posint",
        ("max_length",),
        {"max_length": "TRL SFTConfig name (current)", "max_seq_length": "older TRL SFTConfig name"},
    ),
    "packing": _Key("bool"),
    "padding_free": _Key("bool"),
    "activation_offloading": _Key("bool"),
}

# Old TRL `use_flash_attention_2: true` means attn_implementation="flash_attention_2" (trl ModelConfig < 0.9).
_FLASH_FLAG = "use_flash_attention_2"

_SPELLING_TO_CANONICAL: dict[str, str] = {}
for _name, _key in KEYS.items():
    _SPELLING_TO_CANONICAL[_name] = _name
    for _sp in _key.spellings:
        _SPELLING_TO_CANONICAL[_sp] = _name


@dataclass(frozen=True)
class ArgsRead:
    """TrainingArguments-style values read from one source.

    Attributes:
        values: Canonical name -> typed value (int, float, bool, str, tuple of str, dict, or raw for
            ``fsdp``/``fsdp_config``/``deepspeed``/``accelerator_config``/``parallelism_config``).
        provenance: Canonical name -> (source, key as spelled there).
        findings: Spellings read, names passed over, retired optimizer names mapped.
        ignored: Keys/flags present in the source that fitcheck does not read.
    """

    values: dict[str, object]
    provenance: dict[str, tuple[str, str]]
    findings: tuple[Finding, ...] = ()
    ignored: tuple[str, ...] = ()


def _convert(kind: str, value: object, at: str) -> object:
    if kind == "posint":
        return as_int(value, at=at, minimum=1)
    if kind == "int":
        return as_int(value, at=at)
    if kind == "float":
        return as_float(value, at=at)
    if kind == "bool":
        return as_bool(value, at=at)
    if kind == "str":
        if isinstance(value, Enum):
            value = value.value
        return as_str(value, at=at)
    if kind == "list":
        return as_str_list(value, at=at)
    if kind == "dict":
        return as_mapping(value, at=at)
    return value


def read_training_args_mapping(raw: Mapping[str, object], *, source: str) -> ArgsRead:
    """Read a mapping of TrainingArguments/TRL field names (a parsed file, or ``vars(args)``).

    Args:
        raw: Field name -> value. Keys fitcheck does not read are passed over (listed in ``ignored``).
        source: Where the mapping came from (file name), for provenance and messages.

    Returns:
        The canonical values with provenance and findings.

    Raises:
        ConfigError: Every value of a read key that has the wrong type or range, collected.
    """
    values: dict[str, object] = {}
    provenance: dict[str, tuple[str, str]] = {}
    findings: list[Finding] = []
    problems: list[str] = []
    ignored: list[str] = []
    seen: dict[str, list[str]] = {}
    for key in raw:
        canonical = _SPELLING_TO_CANONICAL.get(key)
        if canonical is None:
            if key != _FLASH_FLAG:
                ignored.append(key)
            continue
        seen.setdefault(canonical, []).append(key)
    for canonical, spelled in seen.items():
        spec = KEYS[canonical]
        # Newer spelling first where two generations exist; a None (unset) spelling gives way to the other.
        order = sorted(spelled, key=functools.partial(_preference, canonical))
        chosen = next((s for s in order if raw[s] is not None), None)
        if chosen is None:
            continue
        try:
            values[canonical] = _convert(spec.kind, raw[chosen], where(source, chosen))
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        provenance[canonical] = (source, chosen)
        # Say which spelling was read for files, and for older spellings anywhere; a current-name flag is no news.
        if spec.notes and not (source == "command line" and chosen == canonical):
            findings.append(
                Finding(
                    "spelling-read",
                    Severity.INFO,
                    f"{source}: read `{chosen}` ({spec.notes.get(chosen, 'accepted spelling')})",
                    "",
                )
            )
        others = [s for s in order if s != chosen and raw[s] is not None]
        for other in others:
            try:
                other_value = _convert(spec.kind, raw[other], where(source, other))
            except ConfigError:
                other_value = raw[other]
            if other_value != values[canonical]:
                findings.append(
                    Finding(
                        "conflicting-spellings",
                        Severity.WARNING,
                        f"{source}: `{chosen}`={values[canonical]!r} and `{other}`={other_value!r} disagree; "
                        f"`{chosen}` is used (transformers reads the newer name first)",
                        f"keep only `{chosen}`",
                    )
                )
    if _FLASH_FLAG in raw and raw[_FLASH_FLAG] is not None:
        try:
            if (
                as_bool(raw[_FLASH_FLAG], at=where(source, _FLASH_FLAG))
                and "attn_implementation" not in values
            ):
                values["attn_implementation"] = "flash_attention_2"
                provenance["attn_implementation"] = (source, _FLASH_FLAG)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError.collect(problems)
    findings.extend(_map_optimizer(values, provenance))
    if ignored:
        findings.append(
            Finding(
                "keys-passed-over",
                Severity.INFO,
                f"{source}: {len(ignored)} key(s) do not change memory and were passed over: "
                + ", ".join(sorted(ignored)[:12])
                + (" ..." if len(ignored) > 12 else ""),
            )
        )
    return ArgsRead(values, provenance, tuple(findings), tuple(ignored))


def _preference(canonical: str, spelling: str) -> int:
    spec = KEYS[canonical]
    ranked = [*spec.spellings, canonical] if _newer_first(canonical) else [canonical, *spec.spellings]
    return ranked.index(spelling) if spelling in ranked else len(ranked)


def _newer_first(canonical: str) -> bool:
    """True where the alternative spelling is the newer one (it wins when both are set)."""
    return canonical in ("gradient_checkpointing", "gradient_checkpointing_kwargs", "dtype", "max_seq_length")


def _map_optimizer(values: dict[str, object], provenance: dict[str, tuple[str, str]]) -> list[Finding]:
    name = values.get("optim")
    if not isinstance(name, str):
        return []
    src, spelled = provenance["optim"]
    try:
        new_name, finding = canonical_optimizer(name)
    except FitcheckError as exc:  # NotModelledError for a name transformers does not know
        raise ConfigError(f"{where(src, spelled)}: {exc}") from None
    values["optim"] = new_name
    return [finding] if finding is not None else []


def read_training_args_file(path: str) -> ArgsRead:
    """Read a JSON or YAML file of TrainingArguments fields (``parse_json_file``/``parse_yaml_file`` input).

    Args:
        path: The file (``.json`` parsed as JSON, anything else as YAML).

    Returns:
        The canonical values with provenance.

    Raises:
        ConfigError: Missing/malformed file or a badly typed value.
    """
    raw = load_mapping_file(path, what="TrainingArguments file (--training_args)")
    return read_training_args_mapping(raw, source=path)


def read_training_args_object(obj: object, *, source: str = "TrainingArguments") -> ArgsRead:
    """Read a live ``TrainingArguments`` (or TRL config) object by attribute, without importing transformers.

    Args:
        obj: The object.
        source: Name for provenance.

    Returns:
        The canonical values with provenance.

    Raises:
        ConfigError: A badly typed attribute.
    """
    raw: dict[str, object] = {}
    for spelling in [*_SPELLING_TO_CANONICAL, _FLASH_FLAG]:
        if hasattr(obj, spelling):
            value = getattr(obj, spelling)
            raw[spelling] = value.value if isinstance(value, Enum) else value
    read = read_training_args_mapping(raw, source=source)
    # A live object always carries every field: the spelling finding says nothing then.
    kept = tuple(f for f in read.findings if f.code not in ("spelling-read", "keys-passed-over"))
    return ArgsRead(read.values, read.provenance, kept, ())


def read_script_argv(argv: Sequence[str], *, source: str = "command line") -> ArgsRead:
    """Read a training script's own command line the way ``HfArgumentParser`` parses it.

    ``--name value``, ``--name=value``, ``--dash-spelling``, bare boolean flags (``--bf16`` = true),
    ``--no_<flag>`` for booleans, lists (``--lora_target_modules q_proj v_proj``). Flags that are not
    TrainingArguments/TRL names belong to the script and are passed over with their values. A JSON/YAML file
    given as a positional argument or as ``--config FILE`` (TRL's ``TrlParser``) is read first; flags win.

    Args:
        argv: The arguments after the script name.
        source: Name for provenance.

    Returns:
        The canonical values with provenance.

    Raises:
        ConfigError: A known flag without its value or with a badly typed value.
    """
    raw: dict[str, object] = {}
    base: ArgsRead | None = None
    passed_over: list[str] = []
    i = 0
    tokens = list(argv)
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            if token.lower().endswith((".json", ".yaml", ".yml")) and base is None:
                base = read_training_args_file(token)
            continue
        name, eq, inline = token[2:].partition("=")
        name = name.replace("-", "_")
        following: list[str] = []
        while i < len(tokens) and not tokens[i].startswith("--"):
            following.append(tokens[i])
            i += 1
        if eq:
            following = [inline, *following]
        if name == "config" and following and base is None:
            base = read_training_args_file(following[0])
            continue
        canonical = _SPELLING_TO_CANONICAL.get(name)
        negated = False
        if canonical is None and name.startswith("no_") and _SPELLING_TO_CANONICAL.get(name[3:]):
            canonical, name, negated = _SPELLING_TO_CANONICAL[name[3:]], name[3:], True
        if canonical is None and name != _FLASH_FLAG:
            passed_over.append("--" + name)
            continue
        kind = KEYS[canonical].kind if canonical is not None else "bool"
        if negated:
            if kind != "bool":
                raise ConfigError(f"{source}: --no_{name}: only boolean flags have a --no_ form")
            raw[name] = False
        elif kind == "bool":
            raw[name] = following[0] if following else True
        elif kind == "list":
            if not following:
                raise ConfigError(f"{source}: --{name} expects one or more values")
            raw[name] = list(following)
        elif canonical == "fsdp" and not following:
            raw[name] = True  # transformers 5: bare --fsdp means fsdp=True (nargs="?", const=True)
        else:
            if not following:
                raise ConfigError(f"{source}: --{name} expects a value")
            raw[name] = following[0]
    read = read_training_args_mapping(raw, source=source)
    findings = list(read.findings)
    if passed_over:
        findings.append(
            Finding(
                "script-flags-passed-over",
                Severity.INFO,
                f"{source}: flags that are not TrainingArguments/TRL names were passed over: "
                + " ".join(passed_over[:12])
                + (" ..." if len(passed_over) > 12 else ""),
            )
        )
    if base is None:
        return ArgsRead(read.values, read.provenance, tuple(findings), tuple(passed_over))
    values = {**base.values, **read.values}
    provenance = {**base.provenance, **read.provenance}
    return ArgsRead(values, provenance, (*base.findings, *findings), (*base.ignored, *passed_over))
