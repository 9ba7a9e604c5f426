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
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from fitcheck.core.optimizers import canonical_optimizer
from fitcheck.errors import ConfigError, FitcheckError, short_repr
from fitcheck.findings import Finding, Severity
from fitcheck.readers.settings_table import SETTINGS, SPELLINGS, Kind, Reach, convert
from fitcheck.readers.sources import as_bool, load_mapping_file, where
from fitcheck.spec import LEGACY_OPTIMIZER_NAMES, Dtype

# Old TRL `use_flash_attention_2: true` means attn_implementation="flash_attention_2" (trl ModelConfig < 0.9).
_FLASH_FLAG = "use_flash_attention_2"
# TRL configs' model_init_kwargs (SFTConfig / DPOConfig / KTOConfig / GRPOConfig / RewardConfig: a dict, or a JSON
# string their __post_init__ parses): its ``dtype`` (``torch_dtype`` before TRL 0.23) is what a trainer given the model
# by name loads (trl/trainer/utils.py create_model_from_path); TRL's scripts update ModelConfig's ``dtype`` with it
# (trl/scripts/sft.py: ``model_init_kwargs.update(training_args.model_init_kwargs)``), so it wins in its source
_INIT_KWARGS = "model_init_kwargs"
_INIT_DTYPE_KEYS = ("dtype", "torch_dtype")
# other model_init_kwargs keys that are fitcheck settings, read as they are (from_pretrained's own names); keys of
# from_pretrained that change no device byte; any other key is reported as not modelled (the answer is unpinned)
_INIT_SETTINGS = ("attn_implementation", "device_map")
_INIT_NEUTRAL = frozenset({"revision", "trust_remote_code", "token", "cache_dir", "local_files_only", "subfolder",
                           "low_cpu_mem_usage", "use_safetensors", "force_download"})


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


@dataclass
class _Reading:
    """What :func:`read_training_args_mapping` collects from one source, filled by its side readers."""

    source: str
    values: dict[str, object] = field(default_factory=dict)
    provenance: dict[str, tuple[str, str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def put(self, canonical: str, value: object, spelled: str) -> bool:
        """``canonical`` converted from ``value`` (spelled ``spelled`` in the source), with its provenance; a bad
        value is a problem (False)."""
        try:
            self.values[canonical] = convert(SETTINGS[canonical].kind, value, where(self.source, spelled))
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            return False
        self.provenance[canonical] = (self.source, spelled)
        return True


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
    reading = _Reading(source)
    values, provenance, findings = reading.values, reading.provenance, reading.findings
    seen, ignored = _spellings_seen(raw)
    for canonical, spelled in seen.items():
        # Newer spelling first where two generations exist; a None (unset) spelling gives way to the other.
        order = sorted(spelled, key=functools.partial(_preference, canonical))
        chosen = next((s for s in order if raw[s] is not None), None)
        if chosen is None or not reading.put(canonical, raw[chosen], chosen):
            continue
        findings.extend(_spelling_findings(raw, source, canonical, chosen, order, values[canonical]))
    _flash_flag(raw, reading)
    _init_kwargs(raw, reading)
    if reading.problems:
        raise ConfigError.collect(reading.problems)
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


def _spellings_seen(raw: Mapping[str, object]) -> tuple[dict[str, list[str]], list[str]]:
    """Canonical name -> the spellings of it present in ``raw``; and the keys that are no setting."""
    seen: dict[str, list[str]] = {}
    ignored: list[str] = []
    for key in raw:
        canonical = SPELLINGS.get(key)
        if canonical is None:
            if key not in (_FLASH_FLAG, _INIT_KWARGS):
                ignored.append(key)
            continue
        seen.setdefault(canonical, []).append(key)
    return seen, ignored


def _spelling_findings(
    raw: Mapping[str, object], source: str, canonical: str, chosen: str, order: list[str], value: object
) -> list[Finding]:
    """Which spelling was read (files, and older spellings anywhere), and spellings that disagree."""
    row = SETTINGS[canonical]
    notes = row.notes(canonical)
    out: list[Finding] = []
    # A current-name flag is no news.
    if notes and not (source == "command line" and chosen == canonical):
        out.append(
            Finding(
                "spelling-read",
                Severity.INFO,
                f"{source}: read `{chosen}` ({notes.get(chosen, 'accepted spelling')})",
                "",
            )
        )
    for other in (s for s in order if s != chosen and raw[s] is not None):
        try:
            other_value = convert(row.kind, raw[other], where(source, other))
        except ConfigError:
            other_value = raw[other]
        if other_value != value:
            out.append(
                Finding(
                    "conflicting-spellings",
                    Severity.WARNING,
                    f"{source}: `{chosen}`={value!r} and `{other}`={other_value!r} disagree; "
                    f"`{chosen}` is used (transformers reads the newer name first)",
                    f"keep only `{chosen}`",
                )
            )
    return out


def _flash_flag(raw: Mapping[str, object], reading: _Reading) -> None:
    if _FLASH_FLAG not in raw or raw[_FLASH_FLAG] is None:
        return
    try:
        if as_bool(raw[_FLASH_FLAG], at=where(reading.source, _FLASH_FLAG)) and \
                "attn_implementation" not in reading.values:
            reading.values["attn_implementation"] = "flash_attention_2"
            reading.provenance["attn_implementation"] = (reading.source, _FLASH_FLAG)
    except ConfigError as exc:
        reading.problems.extend(exc.problems)


def _init_kwargs(raw: Mapping[str, object], reading: _Reading) -> None:
    """``model_init_kwargs.dtype`` (or ``.torch_dtype``) read as the load dtype; it wins over ``dtype`` in the same
    source, with a warning where they disagree (``_INIT_KWARGS``); ``attn_implementation`` and ``device_map`` read as
    those settings; other keys flagged (:func:`_init_kwargs_unread`)."""
    source, values, provenance = reading.source, reading.values, reading.provenance
    kwargs = raw.get(_INIT_KWARGS)
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except ValueError:
            kwargs = None
    if kwargs is None:
        return
    if not isinstance(kwargs, Mapping):
        reading.problems.append(f"{where(source, _INIT_KWARGS)}: expected a mapping (or its JSON string), got "
                                f"{short_repr(raw.get(_INIT_KWARGS))}; fix: e.g. {{\"dtype\": \"bfloat16\"}}")
        return
    for name in _INIT_SETTINGS:  # they win in their source, as the dtype does: the trainer passes them on
        if kwargs.get(name) is not None:
            reading.put(name, kwargs[name], f"{_INIT_KWARGS}.{name}")
    reading.findings.extend(_init_kwargs_unread(kwargs, source))
    key = next((k for k in _INIT_DTYPE_KEYS if kwargs.get(k) is not None), None)
    if key is None:
        return
    text = str(kwargs[key])  # a live config may hold a torch.dtype: "torch.bfloat16" (Dtype.from_name reads it)
    spelled = f"{_INIT_KWARGS}.{key}"
    if "dtype" in values and Dtype.from_name(values["dtype"]) != Dtype.from_name(text):
        reading.findings.append(Finding(
            "conflicting-spellings", Severity.WARNING,
            f"{source}: `{spelled}`={text!r} and `{provenance['dtype'][1]}`={values['dtype']!r} disagree; "
            f"`{spelled}` is used (TRL's scripts update ModelConfig's dtype with model_init_kwargs)",
            f"keep only `{spelled}`"))
    values["dtype"] = text
    provenance["dtype"] = (source, spelled)


def _init_kwargs_unread(kwargs: Mapping[str, object], source: str) -> list[Finding]:
    """A ``not-modelled`` warning (it unpins the answer; issue 19: accepted means modelled) for ``model_init_kwargs``
    keys that are neither read (the dtype, :data:`_INIT_SETTINGS`) nor memory-neutral loading keys:
    ``quantization_config``, ``use_cache``, ``max_memory``, ..."""
    other = sorted(str(k) for k in kwargs if k not in (*_INIT_DTYPE_KEYS, *_INIT_SETTINGS, *_INIT_NEUTRAL))
    if not other:
        return []
    return [Finding(
        "not-modelled", Severity.WARNING,
        f"{source}: `{_INIT_KWARGS}` key(s) {', '.join(other)} are passed to from_pretrained by the TRL trainer "
        "(trl/trainer/utils.py create_model_from_path) and are not read by fitcheck: the estimate is without them",
        "give them as fitcheck flags where there is one (a quantization_config as --load_in_4bit / "
        "--bnb_4bit_quant_type / --bnb_4bit_compute_dtype ...), or drop them from model_init_kwargs")]


def _preference(canonical: str, spelling: str) -> int:
    row = SETTINGS[canonical]
    spellings = [a.name for a in row.aliases if a.reach.value >= Reach.FILES.value]
    ranked = [*spellings, canonical] if row.newer_first else [canonical, *spellings]
    return ranked.index(spelling) if spelling in ranked else len(ranked)


def _map_optimizer(values: dict[str, object], provenance: dict[str, tuple[str, str]]) -> list[Finding]:
    name = values.get("optim")
    if not isinstance(name, str):
        return []
    src, spelled = provenance["optim"]
    try:
        new_name, finding = canonical_optimizer(name)
    except FitcheckError as exc:  # NotModelledError for a name transformers does not know
        raise ConfigError(f"{where(src, spelled)}: {exc}") from None
    if name.strip().lower() in LEGACY_OPTIMIZER_NAMES:  # the stack decides (run_args._optimizer, with the finding)
        values["optim"] = name.strip().lower()
        return []
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
    for spelling in [*SPELLINGS, _FLASH_FLAG, _INIT_KWARGS]:
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
    for name, following in _flags(argv):
        if name is None:  # a positional argument
            if following[0].lower().endswith((".json", ".yaml", ".yml")) and base is None:
                base = read_training_args_file(following[0])
            continue
        if name == "config" and following and base is None:
            base = read_training_args_file(following[0])
            continue
        canonical = SPELLINGS.get(name)
        negated = False
        if canonical is None and name.startswith("no_") and SPELLINGS.get(name[3:]):
            canonical, name, negated = SPELLINGS[name[3:]], name[3:], True
        if name == _INIT_KWARGS and following:  # TRL's parser takes its JSON string
            raw[name] = following[0]
            continue
        if canonical is None and name != _FLASH_FLAG:
            passed_over.append("--" + name)
            continue
        raw[name] = _flag_value(canonical, name, following, negated, source)
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


def _flags(argv: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """``(name, values that follow it)`` per ``--flag`` (``-`` read as ``_``); ``(None, [arg])`` per positional."""
    out: list[tuple[str | None, list[str]]] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            out.append((None, [token]))
            continue
        name, eq, inline = token[2:].partition("=")
        following: list[str] = []
        while i < len(tokens) and not tokens[i].startswith("--"):
            following.append(tokens[i])
            i += 1
        out.append((name.replace("-", "_"), [inline, *following] if eq else following))
    return out


def _flag_value(canonical: str | None, name: str, following: list[str], negated: bool, source: str) -> object:
    """The raw value of one known flag, the way HfArgumentParser reads its kind."""
    kind = SETTINGS[canonical].kind if canonical is not None else Kind.BOOL
    if negated:
        if kind is not Kind.BOOL:
            raise ConfigError(f"{source}: --no_{name}: only boolean flags have a --no_ form")
        return False
    if kind is Kind.BOOL:
        return following[0] if following else True
    if kind in (Kind.NAMES, Kind.INDICES):
        if not following:
            raise ConfigError(f"{source}: --{name} expects one or more values")
        return list(following)
    if canonical == "fsdp" and not following:
        return True  # transformers 5: bare --fsdp means fsdp=True (nargs="?", const=True)
    if not following:
        raise ConfigError(f"{source}: --{name} expects a value")
    return following[0]
