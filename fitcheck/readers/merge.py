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
from fitcheck.readers.deepspeed import deepspeed_precision_conflict, load_deepspeed_file, resolve_deepspeed
from fitcheck.readers.fsdp_config import FsdpRead, fsdp_from_config, fsdp_option_string
from fitcheck.readers.sources import as_bool, as_int, as_mapping, as_str, load_mapping_file
from fitcheck.readers.trainer_args import KEYS, ArgsRead, read_training_args_file, read_training_args_mapping
from fitcheck.spec import DeepSpeedSpec, FsdpSpec, MixedPrecision, ShardingSpec, Strategy

# Sharding flags of `fitcheck estimate` itself (not TrainingArguments names).
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


@dataclass(frozen=True)
class MergedRun:
    """Everything the readers found, merged by precedence.

    Attributes:
        values: Flat canonical names (TrainingArguments / TRL) for ``run_args.spec_from_values``; flags that
            are not TrainingArguments names are passed through unchanged.
        provenance: Canonical name -> where its value was read ("--bf16", "args.json:bf16",
            "ds.json:train_micro_batch_size_per_gpu").
        sharding: Processes and strategy.
        findings: Conflicts, spellings read, not-modelled settings, DeepSpeed/transformers mismatches.
    """

    values: dict[str, object]
    provenance: dict[str, str]
    sharding: ShardingSpec
    findings: tuple[Finding, ...] = field(default=())


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
        sizes,
            DeepSpeed and FSDP both configured.
    """
    findings: list[Finding] = []
    cli_known = {k: v for k, v in cli.items() if k not in SHARDING_FLAGS}
    cli_read = read_training_args_mapping(cli_known, source="command line")
    ta_read = read_training_args_file(training_args_file) if training_args_file else ArgsRead({}, {})
    values: dict[str, object] = {}
    provenance: dict[str, str] = {}
    for read, is_cli in ((ta_read, False), (cli_read, True)):
        for key, value in read.values.items():
            src, spelled = read.provenance[key]
            if key in values and values[key] != value and key in KEYS:
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

    acc = _accelerate(accelerate_config_file, env, findings)
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
    values["num_processes"], values["num_machines"] = num_processes, num_machines

    _accelerate_values(acc, values, provenance, findings)
    if "mixed_precision" in cli:
        mp = parse_mixed_precision(cli["mixed_precision"], at="--mixed_precision")
        _set_precision(values, provenance, mp, "--mixed_precision", findings, override=True)
    par = values.pop("parallelism_config", None)
    if isinstance(par, Mapping) and any(
        isinstance(par.get(k), int) and int(str(par.get(k))) > 1 for k in ("tp_size", "cp_size", "sp_size")
    ):
        findings.append(
            Finding(
                "not-modelled",
                Severity.WARNING,
                f"{provenance.pop('parallelism_config', 'parallelism_config')}: tensor/context "
                "parallel sizes > 1 are not modelled",
                "the estimate treats every process as a data-parallel rank",
            )
        )
    every = values.get("gradient_checkpointing_kwargs")
    if isinstance(every, str) and every.strip():  # --gradient_checkpointing_kwargs '{"every_n_layers": 2}'
        every = values["gradient_checkpointing_kwargs"] = as_mapping(
            every, at=str(provenance.get("gradient_checkpointing_kwargs", "--gradient_checkpointing_kwargs")))
    if isinstance(every, Mapping) and every.get("every_n_layers") is not None:
        values["checkpoint_every_n_layers"] = as_int(every["every_n_layers"], at="every_n_layers", minimum=1)
        provenance["checkpoint_every_n_layers"] = provenance["gradient_checkpointing_kwargs"]

    ds_raw, ds_source = _deepspeed_raw(cli, deepspeed_file, values, provenance, acc, findings)
    fs_read = _fsdp_read(cli, fsdp, values, provenance, acc)
    if ds_raw is not None and fs_read is not None:
        raise ConfigError(f"DeepSpeed ({ds_source}) and FSDP are both configured; use one of them")
    ds_spec: DeepSpeedSpec | None = None
    fs_spec: FsdpSpec | None = None
    if ds_raw is not None:
        ds_spec = _resolve_ds(
            ds_raw, ds_source, values, provenance, num_processes, hidden_size, acc, findings
        )
        strategy = Strategy.DEEPSPEED
    elif fs_read is not None:
        fs_spec = fs_read.spec
        findings.extend(fs_read.findings)
        if fs_read.activation_checkpointing and "gradient_checkpointing" not in values:
            values["gradient_checkpointing"] = True
            provenance["gradient_checkpointing"] = fs_read.provenance.get(
                "activation_checkpointing", "fsdp activation_checkpointing"
            )
        strategy = Strategy.FSDP
    else:
        strategy = Strategy.DDP if num_processes > 1 else Strategy.SINGLE
    try:
        sharding = ShardingSpec(strategy, num_processes, num_machines, ds_spec, fs_spec)
    except ValueError as exc:
        raise ConfigError(f"--num_processes/--num_machines ({provenance['num_processes']}): {exc}") from None
    return MergedRun(values, provenance, sharding, tuple(findings))


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


def _set_precision(
    values: dict[str, object],
    provenance: dict[str, str],
    mp: MixedPrecision,
    where: str,
    findings: list[Finding],
    *,
    override: bool,
) -> None:
    current = (
        MixedPrecision.BF16 if values.get("bf16") else MixedPrecision.FP16 if values.get("fp16") else None
    )
    if current is not None and current is not mp:
        src = provenance.get("bf16" if current is MixedPrecision.BF16 else "fp16", "")
        findings.append(
            Finding(
                "precision-conflict",
                Severity.WARNING,
                f"{src} asks for {current.value} but {where} says {mp.value}; "
                + (f"{where} is used" if override else f"{src} is used (TrainingArguments win)"),
                "use the same precision in both places",
            )
        )
        if not override:
            return
    elif current is not None and not override:
        return
    values["bf16"], values["fp16"] = mp is MixedPrecision.BF16, mp is MixedPrecision.FP16
    provenance["bf16"] = provenance["fp16"] = where


def _accelerate_values(
    acc: AccelerateRead | None, values: dict[str, object], provenance: dict[str, str], findings: list[Finding]
) -> None:
    if acc is None or acc.mixed_precision is None:
        return
    _set_precision(
        values, provenance, acc.mixed_precision, acc.provenance["mixed_precision"], findings, override=False
    )


def _deepspeed_raw(
    cli: Mapping[str, object],
    deepspeed_file: str | None,
    values: dict[str, object],
    provenance: dict[str, str],
    acc: AccelerateRead | None,
    findings: list[Finding],
) -> tuple[dict[str, object] | None, str]:
    raw: dict[str, object] | None = None
    source = ""
    ta_ds = values.pop("deepspeed", None)
    ta_where = provenance.pop("deepspeed", "")
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
    overrides = {
        k: cli[k] for k in ("zero_stage", "offload_optimizer", "offload_param") if cli.get(k) is not None
    }
    if raw is None and not overrides:
        return None, ""
    if raw is None:
        # accelerate DeepSpeedPlugin defaults without a file: stage 2, batch sizes "auto".
        raw = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "zero_optimization": {"stage": 2},
        }
        source = "command line"
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


def _resolve_ds(
    raw: Mapping[str, object],
    source: str,
    values: dict[str, object],
    provenance: dict[str, str],
    world: int,
    hidden_size: int | None,
    acc: AccelerateRead | None,
    findings: list[Finding],
) -> DeepSpeedSpec:
    run_prov = {k: provenance[k] for k in values if k in provenance}
    ds = resolve_deepspeed(
        raw, source=source, run=values, run_provenance=run_prov, world_size=world, hidden_size=hidden_size
    )
    findings.extend(ds.findings)
    run_mp = (
        MixedPrecision.BF16 if values.get("bf16") else MixedPrecision.FP16 if values.get("fp16") else None
    )
    conflict = deepspeed_precision_conflict(
        ds, run_mp, provenance.get("bf16" if values.get("bf16") else "fp16", ""), source
    )
    if conflict is not None:
        findings.append(conflict)
    for key, value, ds_key in (
        ("per_device_train_batch_size", ds.micro_batch, "train_micro_batch_size_per_gpu"),
        ("gradient_accumulation_steps", ds.grad_accum, "gradient_accumulation_steps"),
    ):
        if key not in values:
            values[key] = value
            provenance[key] = ds.provenance.get(ds_key, f"{source}:{ds_key}")
    if run_mp is None and ds.mixed_precision is not MixedPrecision.NO:
        values["bf16"] = ds.mixed_precision is MixedPrecision.BF16
        values["fp16"] = ds.mixed_precision is MixedPrecision.FP16
        provenance["bf16"] = provenance["fp16"] = f"{source}:{ds.mixed_precision.value}.enabled"
    for key, where in ds.provenance.items():
        provenance[f"deepspeed.{key}"] = where
    spec = ds.spec
    if acc is not None and acc.zero3_init is not None:
        spec = replace(spec, zero3_init=acc.zero3_init)
    return spec


def _fsdp_read(
    cli: Mapping[str, object],
    fsdp: str | None,
    values: dict[str, object],
    provenance: dict[str, str],
    acc: AccelerateRead | None,
) -> FsdpRead | None:
    ta_fsdp = values.pop("fsdp", None)
    ta_where = provenance.pop("fsdp", "")
    ta_cfg = values.pop("fsdp_config", None)
    cfg_where = provenance.pop("fsdp_config", "")
    option = fsdp if fsdp is not None else cli.get("fsdp")
    option_where = "--fsdp"
    if option is None and ta_fsdp not in (None, False, ""):
        option, option_where = ta_fsdp, ta_where
    cfg_file = cli.get("fsdp_config")
    cfg: dict[str, object] | None = None
    cfg_source = ""
    if cfg_file is not None:
        cfg_source = as_str(cfg_file, at="--fsdp_config")
        cfg = load_mapping_file(cfg_source, what="FSDP config (--fsdp_config)")
    elif isinstance(ta_cfg, str) and ta_cfg:
        cfg, cfg_source = load_mapping_file(ta_cfg, what=f"FSDP config ({cfg_where})"), ta_cfg
    elif isinstance(ta_cfg, Mapping):
        cfg, cfg_source = as_mapping(ta_cfg, at=cfg_where), cfg_where
    sync = _sync_each_batch(cli, values, provenance)
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


def _sync_each_batch(
    cli: Mapping[str, object], values: dict[str, object], provenance: dict[str, str]
) -> bool:
    """``accelerator_config.gradient_accumulation_kwargs.sync_each_batch`` (accelerate
    GradientAccumulationPlugin)."""
    if cli.get("sync_each_batch") is not None:
        return as_bool(cli["sync_each_batch"], at="--sync_each_batch")
    acc_cfg = values.pop("accelerator_config", None)
    where = provenance.pop("accelerator_config", "accelerator_config")
    if acc_cfg is None:
        return False
    cfg = (
        load_mapping_file(acc_cfg, what=where) if isinstance(acc_cfg, str) else as_mapping(acc_cfg, at=where)
    )
    kwargs = cfg.get("gradient_accumulation_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{where}: gradient_accumulation_kwargs must be a mapping, got {kwargs!r}")
    return as_bool(
        kwargs.get("sync_each_batch", False), at=f"{where}.gradient_accumulation_kwargs.sync_each_batch"
    )
