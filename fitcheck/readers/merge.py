"""Merge every configuration source of one run into flat run values and a :class:`ShardingSpec`.

Precedence, highest first (the same order ``accelerate launch`` and the Trainer apply):

1. explicit command-line flags (``cli`` holds only the flags the user passed);
2. the TrainingArguments file (``--training_args``; what the training script would parse);
3. the DeepSpeed JSON and the accelerate config YAML (``--deepspeed``, ``--config_file`` or accelerate's
default
   location under ``$HF_HOME``/``$XDG_CACHE_HOME``), with DeepSpeed ``"auto"`` values filled from 1-2;
4. defaults (the libraries' own, applied by ``fitcheck.readers.run_args`` or noted here).

A value that two sources give differently is a finding naming both places; the higher one is used. Strategy:
DeepSpeed if any source configures it (``--zero_stage``, a DeepSpeed file, ``distributed_type: DEEPSPEED``),
FSDP if any source configures it (``--fsdp``, ``fsdp`` in the TrainingArguments, ``distributed_type: FSDP``),
DDP when more than one process, else a single GPU. Both DeepSpeed and FSDP is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.accelerate_config import (
    AccelerateRead,
    default_config_path,
    parse_mixed_precision,
    read_accelerate_config,
)
from fitcheck.readers.deepspeed import (
    accelerate_deepspeed_config,
    deepspeed_precision_conflict,
    load_deepspeed_file,
    resolve_deepspeed,
)
from fitcheck.readers.fsdp_config import FsdpRead, fsdp_from_config, fsdp_option_string
from fitcheck.readers.run_settings import RunSettings
from fitcheck.readers.settings_table import SETTINGS, Use
from fitcheck.readers.sources import as_bool, as_int, as_mapping, as_str, load_mapping_file
from fitcheck.readers.trainer_args import ArgsRead, read_training_args_file, read_training_args_mapping
from fitcheck.spec import DeepSpeedSpec, FsdpSpec, MixedPrecision, ShardingSpec, Strategy

# Flags the merge step reads itself (files, sharding, accelerate's names), never as TrainingArguments values.
SHARDING_FLAGS = (
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "num_machines",
    "num_processes",
    "fsdp_config",
    "mixed_precision",
    "deepspeed",
    "fsdp",
    "sync_each_batch",
)
# TrainingArguments fields that name another source (a file or an inline section), taken out before merging.
_SOURCE_FIELDS = tuple(name for name, row in SETTINGS.items() if row.use is Use.SOURCE and row.trainer_arg)


@dataclass(frozen=True)
class MergedRun:
    """Everything the readers found, merged by precedence.

    Attributes:
        settings: The typed run settings (with where each was read) for ``run_args.spec_from_settings``.
        sharding: Processes and strategy.
        findings: Conflicts, spellings read, not-modelled settings, DeepSpeed/transformers mismatches.
    """

    settings: RunSettings
    sharding: ShardingSpec
    findings: tuple[Finding, ...] = field(default=())

    @property
    def values(self) -> Mapping[str, object]:
        """The settings a source gave, by canonical name (read-only)."""
        return self.settings.values

    @property
    def provenance(self) -> Mapping[str, str]:
        """Canonical name -> where its value was read ("--bf16", "args.json:bf16", "ds.json:...")."""
        return self.settings.provenance


@dataclass(frozen=True)
class _Source:
    """A TrainingArguments field that names another source, and where it was read."""

    value: object
    where: str


def _prov_text(source: str, key: str, cli: bool) -> str:
    return f"--{key}" if cli else f"{source}:{key}"


def merge_sources(
    cli: Mapping[str, object],
    *,
    training_args_file: str | None,
    deepspeed_file: str | None,
    accelerate_config_file: str | None,
    fsdp: str | None,
    env: Mapping[str, str],
    hidden_size: int | None = None,
) -> MergedRun:
    """Read and merge the command line, TrainingArguments file, DeepSpeed JSON and accelerate config.

    Args:
        cli: Flags the user passed explicitly (canonical or alias names -> values).
        training_args_file: A JSON/YAML file of TrainingArguments fields.
        deepspeed_file: A DeepSpeed JSON (``--deepspeed``).
        accelerate_config_file: An accelerate config (``--config_file``); None = accelerate's default file
            when it exists.
        fsdp: TrainingArguments' ``fsdp`` option string (``"full_shard auto_wrap offload"``), if passed.
        env: Environment variables (``HF_HOME``, ``XDG_CACHE_HOME``, ``HOME``) for the default accelerate
            file.
        hidden_size: The model's hidden size, for DeepSpeed ``"auto"`` bucket sizes.

    Returns:
        The merged run.

    Raises:
        ConfigError: Malformed or missing files, bad values, unresolvable ``"auto"``, inconsistent batch
            sizes, DeepSpeed and FSDP both configured.
    """
    findings: list[Finding] = []
    values, provenance = _layered(cli, training_args_file, findings)
    sources = {k: _Source(values.pop(k), provenance.pop(k)) for k in _SOURCE_FIELDS if k in values}
    acc = _accelerate(accelerate_config_file, env, findings)
    num_processes, num_machines = _processes(cli, acc, provenance)
    values["num_processes"], values["num_machines"] = num_processes, num_machines
    _update(values, provenance, _precision(cli, acc, values, provenance, findings))
    findings.extend(_parallelism(sources))
    _update(values, provenance, _every_n_layers(values, provenance))

    ds_raw, ds_source = _deepspeed_raw(cli, deepspeed_file, sources, acc, findings)
    fs_read = _fsdp_read(cli, fsdp, sources, acc)
    if ds_raw is not None and fs_read is not None:
        raise ConfigError(f"DeepSpeed ({ds_source}) and FSDP are both configured; use one of them")
    ds_spec: DeepSpeedSpec | None = None
    fs_spec: FsdpSpec | None = None
    if ds_raw is not None:
        ds = _resolve_ds(ds_raw, ds_source, values, provenance, num_processes, hidden_size)
        findings.extend(ds.findings)
        _update(values, provenance, ds.updates)
        provenance.update(ds.notes)
        ds_spec = ds.spec if acc is None or acc.zero3_init is None else replace(ds.spec, zero3_init=acc.zero3_init)
        strategy = Strategy.DEEPSPEED
    elif fs_read is not None:
        fs_spec = fs_read.spec
        findings.extend(fs_read.findings)
        _update(values, provenance, _fsdp_checkpointing(fs_read, values))
        strategy = Strategy.FSDP
    else:
        strategy = Strategy.DDP if num_processes > 1 else Strategy.SINGLE
    try:
        sharding = ShardingSpec(strategy, num_processes, num_machines, ds_spec, fs_spec)
    except ValueError as exc:
        raise ConfigError(f"--num_processes/--num_machines ({provenance['num_processes']}): {exc}") from None
    return MergedRun(RunSettings.from_values(values, provenance), sharding, tuple(findings))


# What one merge step sets: name -> (value, where it was read).
_Updates = dict[str, tuple[object, str]]


def _update(values: dict[str, object], provenance: dict[str, str], updates: _Updates) -> None:
    for key, (value, where_) in updates.items():
        values[key] = value
        provenance[key] = where_


def _layered(
    cli: Mapping[str, object], training_args_file: str | None, findings: list[Finding]
) -> tuple[dict[str, object], dict[str, str]]:
    """The TrainingArguments file, then the command line over it (a finding per value they disagree on)."""
    cli_known = {k: v for k, v in cli.items() if k not in SHARDING_FLAGS}
    cli_read = read_training_args_mapping(cli_known, source="command line")
    ta_read = read_training_args_file(training_args_file) if training_args_file else ArgsRead({}, {})
    values: dict[str, object] = {}
    provenance: dict[str, str] = {}
    for read, is_cli in ((ta_read, False), (cli_read, True)):
        for key, value in read.values.items():
            src, spelled = read.provenance[key]
            if key in values and values[key] != value:
                findings.append(
                    Finding(
                        "conflicting-sources",
                        Severity.WARNING,
                        f"{key}: {_prov_text(src, spelled, is_cli)}={value!r} overrides "
                        f"{provenance[key]}={values[key]!r}",
                        "remove one of them",
                    )
                )
            values[key] = value
            provenance[key] = _prov_text(src, spelled, is_cli)
        findings.extend(f for f in read.findings if f.code != "keys-passed-over" or not is_cli)
    for key in cli_read.ignored:  # flags of fitcheck itself (gpu, host_memory, model, ...) pass through
        values[key] = cli[key]
        provenance[key] = f"--{key}"
    return values, provenance


def _processes(
    cli: Mapping[str, object], acc: AccelerateRead | None, provenance: dict[str, str]
) -> tuple[int, int]:
    """``num_processes`` (total over machines) and ``num_machines``: flags, else accelerate's file, else 1."""
    num_machines = _flag_int(cli, "num_machines") or (acc.num_machines if acc else 1)
    num_processes = _flag_int(cli, "num_processes") or (acc.num_processes if acc else None)
    if num_processes is None:
        if acc is not None and acc.distributed_type != "NO":
            raise ConfigError(
                f"{acc.source}: num_processes is not set (accelerate: 'You need to manually pass in "
                "`--num_processes` using this config yaml'); pass --num_processes N (total GPUs)"
            )
        num_processes = 1
    provenance["num_processes"] = (
        "--num_processes"
        if "num_processes" in cli
        else acc.provenance.get("num_processes", "default 1")
        if acc
        else "default 1"
    )
    provenance["num_machines"] = (
        "--num_machines" if "num_machines" in cli else (acc.source if acc else "default 1")
    )
    return num_processes, num_machines


def _parallelism(sources: Mapping[str, _Source]) -> list[Finding]:
    par = sources.get("parallelism_config")
    if par is None or not isinstance(par.value, Mapping):
        return []
    if not any(
        isinstance(par.value.get(k), int) and int(str(par.value.get(k))) > 1 for k in ("tp_size", "cp_size", "sp_size")
    ):
        return []
    return [
        Finding(
            "not-modelled",
            Severity.WARNING,
            f"{par.where or 'parallelism_config'}: tensor/context parallel sizes > 1 are not modelled",
            "the estimate treats every process as a data-parallel rank",
        )
    ]


def _every_n_layers(values: Mapping[str, object], provenance: Mapping[str, str]) -> _Updates:
    """transformers 5 ``gradient_checkpointing_kwargs.every_n_layers`` -> ``checkpoint_every_n_layers``."""
    every = values.get("gradient_checkpointing_kwargs")
    if not isinstance(every, Mapping) or every.get("every_n_layers") is None:
        return {}
    n = as_int(every["every_n_layers"], at="every_n_layers", minimum=1)
    return {"checkpoint_every_n_layers": (n, provenance["gradient_checkpointing_kwargs"])}


def _fsdp_checkpointing(fs_read: FsdpRead, values: Mapping[str, object]) -> _Updates:
    """FSDP ``activation_checkpointing`` turns checkpointing on unless the run says otherwise."""
    if not fs_read.activation_checkpointing or "gradient_checkpointing" in values:
        return {}
    where_ = fs_read.provenance.get("activation_checkpointing", "fsdp activation_checkpointing")
    return {"gradient_checkpointing": (True, where_)}


def _flag_int(cli: Mapping[str, object], key: str) -> int | None:
    return as_int(cli[key], at=f"--{key}", minimum=1) if cli.get(key) is not None else None


def _accelerate(path: str | None, env: Mapping[str, str], findings: list[Finding]) -> AccelerateRead | None:
    if path is None:
        default = default_config_path(env)
        if not Path(default).is_file():
            return None
        path = default
        findings.append(
            Finding(
                "accelerate-default-config",
                Severity.INFO,
                f"read accelerate's default config {default} (accelerate launch uses it)",
                "pass --config_file to choose another",
            )
        )
    acc = read_accelerate_config(path)
    findings.extend(acc.findings)
    return acc


def _precision(
    cli: Mapping[str, object],
    acc: AccelerateRead | None,
    values: Mapping[str, object],
    provenance: Mapping[str, str],
    findings: list[Finding],
) -> _Updates:
    """bf16/fp16 after accelerate's ``mixed_precision`` (TrainingArguments win) and ``--mixed_precision``
    (wins over both)."""
    current = _run_precision(values)
    where_ = provenance.get("bf16" if current is MixedPrecision.BF16 else "fp16", "")
    chosen: tuple[MixedPrecision, str] | None = None
    if acc is not None and acc.mixed_precision is not None:
        asked = (acc.mixed_precision, acc.provenance["mixed_precision"])
        if _precision_step(current, where_, *asked, findings, override=False):
            chosen = asked
    if "mixed_precision" in cli:
        mp = parse_mixed_precision(cli["mixed_precision"], at="--mixed_precision")
        if chosen is not None:
            current, where_ = chosen
        if _precision_step(current, where_, mp, "--mixed_precision", findings, override=True):
            chosen = (mp, "--mixed_precision")
    if chosen is None:
        return {}
    mp, where_ = chosen
    return {"bf16": (mp is MixedPrecision.BF16, where_), "fp16": (mp is MixedPrecision.FP16, where_)}


def _run_precision(values: Mapping[str, object]) -> MixedPrecision | None:
    """The run's bf16/fp16 as one setting, None when neither is on."""
    mp = MixedPrecision.from_flags(values.get("bf16"), values.get("fp16"))
    return None if mp is MixedPrecision.NO else mp


def _precision_step(
    current: MixedPrecision | None,
    src: str,
    mp: MixedPrecision,
    where_: str,
    findings: list[Finding],
    *,
    override: bool,
) -> bool:
    """Whether ``mp`` (read at ``where_``) replaces the current precision; a finding when they differ."""
    if current is not None and current is not mp:
        findings.append(
            Finding(
                "precision-conflict",
                Severity.WARNING,
                f"{src} asks for {current.value} but {where_} says {mp.value}; "
                + (f"{where_} is used" if override else f"{src} is used (TrainingArguments win)"),
                "use the same precision in both places",
            )
        )
        return override
    return current is None or override


def _deepspeed_raw(
    cli: Mapping[str, object],
    deepspeed_file: str | None,
    sources: Mapping[str, _Source],
    acc: AccelerateRead | None,
    findings: list[Finding],
) -> tuple[dict[str, object] | None, str]:
    """The DeepSpeed config that applies (flag, TrainingArguments, accelerate), with the command line's
    ``--zero_stage``/``--offload_*`` over it; None when DeepSpeed is not configured."""
    raw, source = _deepspeed_file(cli, deepspeed_file, sources, acc, findings)
    overrides = {
        k: cli[k] for k in ("zero_stage", "offload_optimizer", "offload_param") if cli.get(k) is not None
    }
    if raw is None and not overrides:
        return None, ""
    if raw is None:
        raw, source = accelerate_deepspeed_config(), "command line"
    raw = dict(raw)
    zero = dict(as_mapping(raw.get("zero_optimization") or {}, at=f"{source}:zero_optimization"))
    if "zero_stage" in overrides:
        zero["stage"] = as_int(overrides["zero_stage"], at="--zero_stage")
    for key in ("offload_optimizer", "offload_param"):
        if key in overrides:
            device = as_str(overrides[key], at=f"--{key}").strip().lower()
            if device not in ("none", "cpu", "nvme"):
                raise ConfigError(f"--{key}: must be none, cpu or nvme, got {overrides[key]!r}")
            section = dict(as_mapping(zero.get(key) or {}, at=f"{source}:zero_optimization.{key}"))
            section["device"] = device
            section.setdefault("nvme_path", "/local_nvme" if device == "nvme" else None)
            zero[key] = section
    if overrides:
        findings.append(
            Finding(
                "cli-override",
                Severity.INFO,
                f"command line overrides {source}: " + ", ".join(f"--{k} {v}" for k, v in overrides.items()),
                "",
            )
        )
    raw["zero_optimization"] = zero
    return raw, source


def _deepspeed_file(
    cli: Mapping[str, object],
    deepspeed_file: str | None,
    sources: Mapping[str, _Source],
    acc: AccelerateRead | None,
    findings: list[Finding],
) -> tuple[dict[str, object] | None, str]:
    raw: dict[str, object] | None = None
    source = ""
    ta = sources.get("deepspeed")
    ta_ds, ta_where = (ta.value, ta.where) if ta is not None else (None, "")
    cli_file = deepspeed_file or (
        as_str(cli["deepspeed"], at="--deepspeed") if cli.get("deepspeed") else None
    )
    if cli_file:
        raw, source = load_deepspeed_file(cli_file), cli_file
    elif isinstance(ta_ds, str) and ta_ds:
        raw, source = load_deepspeed_file(ta_ds), ta_ds
    elif isinstance(ta_ds, Mapping):
        raw, source = as_mapping(ta_ds, at=ta_where), f"{ta_where} (inline)"
    if acc is not None and acc.distributed_type == "DEEPSPEED":
        acc_raw = (
            load_deepspeed_file(acc.deepspeed_config_file) if acc.deepspeed_config_file else acc.deepspeed
        )
        acc_src = acc.deepspeed_config_file or f"{acc.source}:deepspeed_config"
        if raw is None:
            raw, source = acc_raw, acc_src
        elif acc_raw is not None and acc_src != source:
            findings.append(
                Finding(
                    "conflicting-sources",
                    Severity.WARNING,
                    f"DeepSpeed config given twice: {source} and {acc_src}; {source} is used "
                    "(the Trainer's `deepspeed` argument wins)",
                    "keep one",
                )
            )
    return raw, source


@dataclass(frozen=True)
class _DeepSpeedMerged:
    spec: DeepSpeedSpec
    updates: _Updates
    notes: dict[str, str]  # "deepspeed.<field>" -> where it was read or what filled it
    findings: tuple[Finding, ...]


def _resolve_ds(
    raw: Mapping[str, object],
    source: str,
    values: Mapping[str, object],
    provenance: Mapping[str, str],
    world: int,
    hidden_size: int | None,
) -> _DeepSpeedMerged:
    """Resolve the DeepSpeed config against the run; the run takes the batch sizes and precision it fills."""
    run_prov = {k: provenance[k] for k in values if k in provenance}
    ds = resolve_deepspeed(
        raw, source=source, run=values, run_provenance=run_prov, world_size=world, hidden_size=hidden_size
    )
    findings = list(ds.findings)
    run_mp = _run_precision(values)
    conflict = deepspeed_precision_conflict(
        ds, run_mp, provenance.get("bf16" if values.get("bf16") else "fp16", ""), source
    )
    if conflict is not None:
        findings.append(conflict)
    updates: _Updates = {}
    for key, value, ds_key in (
        ("per_device_train_batch_size", ds.micro_batch, "train_micro_batch_size_per_gpu"),
        ("gradient_accumulation_steps", ds.grad_accum, "gradient_accumulation_steps"),
    ):
        if key not in values:
            updates[key] = (value, ds.provenance.get(ds_key, f"{source}:{ds_key}"))
    if run_mp is None and ds.mixed_precision is not MixedPrecision.NO:
        where_ = f"{source}:{ds.mixed_precision.value}.enabled"
        updates["bf16"] = (ds.mixed_precision is MixedPrecision.BF16, where_)
        updates["fp16"] = (ds.mixed_precision is MixedPrecision.FP16, where_)
    notes = {f"deepspeed.{key}": where_ for key, where_ in ds.provenance.items()}
    return _DeepSpeedMerged(ds.spec, updates, notes, tuple(findings))


def _fsdp_read(
    cli: Mapping[str, object],
    fsdp: str | None,
    sources: Mapping[str, _Source],
    acc: AccelerateRead | None,
) -> FsdpRead | None:
    """FSDP from ``--fsdp``/``--fsdp_config``, the TrainingArguments fields, or accelerate's file."""
    ta_fsdp, ta_cfg = sources.get("fsdp"), sources.get("fsdp_config")
    option = fsdp if fsdp is not None else cli.get("fsdp")
    option_where = "--fsdp"
    if option is None and ta_fsdp is not None and ta_fsdp.value not in (None, False, ""):
        option, option_where = ta_fsdp.value, ta_fsdp.where
    cfg, cfg_source = _fsdp_config(cli, ta_cfg)
    sync = _sync_each_batch(cli, sources)
    if option is None and cfg is None:
        if acc is None or acc.fsdp is None:
            return None
        read = acc.fsdp
    else:
        merged = dict(cfg or {})
        version = as_int(merged.get("version", merged.get("fsdp_version", 2)), at=f"{cfg_source}:version")
        if option is not None:
            for key, value in fsdp_option_string(option, at=option_where, version=version).items():
                merged.setdefault(key, value)
        read = fsdp_from_config(merged, source=cfg_source or option_where, flavour="trainer")
    if sync:
        read = FsdpRead(
            replace(read.spec, sync_each_batch=True),
            read.activation_checkpointing,
            read.provenance,
            read.findings,
        )
    return read


def _fsdp_config(cli: Mapping[str, object], ta_cfg: _Source | None) -> tuple[dict[str, object] | None, str]:
    cfg_file = cli.get("fsdp_config")
    if cfg_file is not None:
        cfg_source = as_str(cfg_file, at="--fsdp_config")
        return load_mapping_file(cfg_source, what="FSDP config (--fsdp_config)"), cfg_source
    if ta_cfg is not None and isinstance(ta_cfg.value, str) and ta_cfg.value:
        return load_mapping_file(ta_cfg.value, what=f"FSDP config ({ta_cfg.where})"), ta_cfg.value
    if ta_cfg is not None and isinstance(ta_cfg.value, Mapping):
        return as_mapping(ta_cfg.value, at=ta_cfg.where), ta_cfg.where
    return None, ""


def _sync_each_batch(cli: Mapping[str, object], sources: Mapping[str, _Source]) -> bool:
    """``accelerator_config.gradient_accumulation_kwargs.sync_each_batch`` (accelerate
    GradientAccumulationPlugin)."""
    if cli.get("sync_each_batch") is not None:
        return as_bool(cli["sync_each_batch"], at="--sync_each_batch")
    acc_cfg = sources.get("accelerator_config")
    if acc_cfg is None or acc_cfg.value is None:
        return False
    where_ = acc_cfg.where or "accelerator_config"
    cfg = (
        load_mapping_file(acc_cfg.value, what=where_)
        if isinstance(acc_cfg.value, str)
        else as_mapping(acc_cfg.value, at=where_)
    )
    kwargs = cfg.get("gradient_accumulation_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{where_}: gradient_accumulation_kwargs must be a mapping, got {kwargs!r}")
    return as_bool(
        kwargs.get("sync_each_batch", False), at=f"{where_}.gradient_accumulation_kwargs.sync_each_batch"
    )
