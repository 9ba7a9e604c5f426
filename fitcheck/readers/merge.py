"""Merge every configuration source of one run into typed :class:`RunSettings` and a :class:`ShardingSpec`.

Precedence, highest first (the same order ``accelerate launch`` and the Trainer apply):

1. explicit command-line flags (``cli`` holds only the flags the user passed);
2. the TrainingArguments file (``--training_args``; what the training script would parse);
3. the DeepSpeed JSON and the accelerate config YAML (``--deepspeed``, ``--config_file`` or accelerate's
   default location under ``$HF_HOME``/``$XDG_CACHE_HOME``), with DeepSpeed ``"auto"`` values filled from 1-2
   (:mod:`fitcheck.readers.merge_sharding`);
4. the trainer's TRL config defaults (``--trainer sft|dpo|...``;
   :func:`fitcheck.readers.trl_settings.trl_default_layer`, provenance ``"TRL <Config> default"``), for settings
   1-3 leave absent;
5. defaults (the libraries' own, on :class:`~fitcheck.readers.run_settings.RunSettings`, or noted here).

The values of 1-3 are layered into one mapping here, each step returning what it sets, and read into
``RunSettings`` once at the end.

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
from fitcheck.readers.accelerate_processes import launched_processes
from fitcheck.readers.fsdp_config import FsdpRead
from fitcheck.readers.merge_sharding import Source, Updates, deepspeed_raw, fsdp_read, resolve_ds, run_precision
from fitcheck.readers.parallelism import PARALLELISM_FLAGS, read_parallelism
from fitcheck.readers.run_settings import RunSettings
from fitcheck.readers.settings_table import SETTINGS, Use
from fitcheck.readers.sources import as_int, as_mapping
from fitcheck.readers.trainer_args import ArgsRead, read_training_args_file, read_training_args_mapping
from fitcheck.readers.trl_settings import trl_default_layer
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
    *PARALLELISM_FLAGS,
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
    where_read: Mapping[str, str] | None = None,
    cli_provenance: Mapping[str, str] | None = None,
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
        where_read: Where a value in ``cli`` was really read when it was no flag (a framework file,
            ``"cfg.yml:micro_batch_size"``: ``readers/axolotl.py``, ``readers/llamafactory.py``).
        cli_provenance: Where the ``cli`` values were read when they are not flags (a live
            ``TrainingArguments``, a script's argv: ``integrations/spec_build.py``); default ``--name``.

    Returns:
        The merged run.

    Raises:
        ConfigError: Malformed or missing files, bad values, unresolvable ``"auto"``, inconsistent batch
            sizes, DeepSpeed and FSDP both configured.
    """
    findings: list[Finding] = []
    where_read = where_read or {}
    values, provenance = _layered(cli, training_args_file, findings, where_read)
    provenance.update({k: w for k, w in (cli_provenance or {}).items() if k in values})
    _update(values, provenance, trl_default_layer(values))  # below 1-3; before precision and DeepSpeed "auto"
    sources = {k: Source(values.pop(k), provenance.pop(k)) for k in _SOURCE_FIELDS if k in values}
    acc = _accelerate(accelerate_config_file, env, findings)
    num_processes, num_machines = _processes(cli, acc, provenance, findings)
    values["num_processes"], values["num_machines"] = num_processes, num_machines
    if acc is not None and acc.use_cpu and "device_type" not in cli:  # ACCELERATE_USE_CPU for the script
        _update(values, provenance, {"device_type": ("cpu", acc.provenance["use_cpu"] + " (accelerate use_cpu)")})
    _update(values, provenance, _precision(cli, acc, values, provenance, findings))
    _update(values, provenance, _every_n_layers(values, provenance))

    ds_raw, ds_source = deepspeed_raw(cli, deepspeed_file, sources, acc, findings)
    fsdp_where = where_read.get("fsdp_config") or (cli_provenance or {}).get("fsdp_config", "--fsdp_config")
    fs_read = fsdp_read(cli, fsdp, sources, acc, fsdp_where)
    if ds_raw is not None and fs_read is not None:
        raise ConfigError(f"DeepSpeed ({ds_source}) and FSDP are both configured; use one of them")
    ta_par = sources.get("parallelism_config")
    layout = read_parallelism(
        cli,
        ta_par.value if ta_par is not None else None,
        ta_par.where if ta_par is not None else "parallelism_config",
        acc.parallelism if acc else None,
        acc.source if acc else "",
        ds_raw,
        ds_source,
    )
    findings.extend(layout.findings)
    ds_spec: DeepSpeedSpec | None = None
    fs_spec: FsdpSpec | None = None
    if ds_raw is not None:
        # DeepSpeed's data-parallel world excludes the Ulysses ranks (accelerate sets train_batch_size =
        # micro x accumulation x ParallelismConfig.data_parallel_size for SP; accelerator.py)
        sp = layout.spec.sp if layout.spec is not None else 1
        world = num_processes // sp if sp > 1 and num_processes % sp == 0 else num_processes
        ds = resolve_ds(ds_raw, ds_source, values, provenance, world, hidden_size)
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
    provenance.update({f"parallelism.{k}": w for k, w in layout.provenance.items()})
    try:
        sharding = ShardingSpec(strategy, num_processes, num_machines, ds_spec, fs_spec, layout.spec)
    except ValueError as exc:
        raise ConfigError(f"--num_processes/--num_machines ({provenance['num_processes']}): {exc}") from None
    return MergedRun(RunSettings.from_values(values, provenance), sharding, tuple(findings))


def _update(values: dict[str, object], provenance: dict[str, str], updates: Updates) -> None:
    for key, (value, where_) in updates.items():
        values[key] = value
        provenance[key] = where_


def _layered(
    cli: Mapping[str, object], training_args_file: str | None, findings: list[Finding], where_read: Mapping[str, str]
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
            provenance[key] = where_read.get(key, _prov_text(src, spelled, is_cli)) if is_cli else _prov_text(
                src, spelled, is_cli)
        findings.extend(f for f in read.findings if f.code != "keys-passed-over" or not is_cli)
    for key in cli_read.ignored:  # flags of fitcheck itself (gpu, host_memory, model, ...) pass through
        values[key] = cli[key]
        provenance[key] = where_read.get(key, f"--{key}")
    return values, provenance


def _processes(
    cli: Mapping[str, object], acc: AccelerateRead | None, provenance: dict[str, str], findings: list[Finding]
) -> tuple[int, int]:
    """``num_processes`` (total over machines) and ``num_machines``: flags, else accelerate's file, else 1."""
    num_machines = _flag_int(cli, "num_machines") or (acc.num_machines if acc else 1)
    num_processes = _flag_int(cli, "num_processes") or (acc.num_processes if acc else None)
    launched = launched_processes(acc, num_processes) if acc is not None else None
    if acc is not None and launched is not None and launched.count is not None:  # NO / MULTI_CPU: one process
        if launched.finding is not None:
            findings.append(launched.finding)
        provenance["num_processes"] = launched.where
        provenance["num_machines"] = "--num_machines" if "num_machines" in cli else acc.source
        return launched.count, num_machines
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


def _every_n_layers(values: Mapping[str, object], provenance: Mapping[str, str]) -> Updates:
    """transformers 5 ``gradient_checkpointing_kwargs.every_n_layers`` -> ``checkpoint_every_n_layers``."""
    every = values.get("gradient_checkpointing_kwargs")
    if isinstance(every, str) and every.strip():  # --gradient_checkpointing_kwargs '{"every_n_layers": 2}'
        every = as_mapping(every, at=provenance.get("gradient_checkpointing_kwargs", "--gradient_checkpointing_kwargs"))
    if not isinstance(every, Mapping) or every.get("every_n_layers") is None:
        return {}
    n = as_int(every["every_n_layers"], at="every_n_layers", minimum=1)
    return {"checkpoint_every_n_layers": (n, provenance["gradient_checkpointing_kwargs"])}


def _fsdp_checkpointing(fs_read: FsdpRead, values: Mapping[str, object]) -> Updates:
    """FSDP ``activation_checkpointing`` turns checkpointing on unless the run says otherwise.

    FSDP2's own activation checkpointing on a peft model runs under the Trainer: its FSDP2 run never installs
    peft's wrap policy (transformers 5.23 ``trainer.py`` l.1717-1722 and l.1751-1754), so accelerate 1.15
    ``fsdp2_apply_ac`` applies the transformer-based one (a real step: ``benchmarks/fsdp2_peft_units_cpu.py --ac``).
    """
    if not fs_read.activation_checkpointing:
        return {}
    where_ = fs_read.provenance.get("activation_checkpointing", "fsdp activation_checkpointing")
    if "gradient_checkpointing" in values:
        return {}
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
) -> Updates:
    """bf16/fp16 after accelerate's ``mixed_precision`` (TrainingArguments win) and ``--mixed_precision``
    (wins over both)."""
    current = run_precision(values)
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
