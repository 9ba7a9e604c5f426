"""The DeepSpeed and FSDP part of merging a run's sources: which config applies, and what it fills in.

Precedence (see :mod:`fitcheck.readers.merge`): a DeepSpeed file from ``--deepspeed``, else the
TrainingArguments ``deepspeed`` field (a file or an inline dict), else accelerate's ``deepspeed_config``;
``--zero_stage``/``--offload_*`` override it (without any file: the dict accelerate builds from the flags
alone). FSDP: ``--fsdp``/``--fsdp_config``, else the TrainingArguments ``fsdp``/``fsdp_config`` fields, else
accelerate's ``fsdp_config``. Each step returns what it found; nothing here changes the caller's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.accelerate_config import AccelerateRead
from fitcheck.readers.deepspeed import (
    accelerate_deepspeed_config,
    deepspeed_precision_conflict,
    load_deepspeed_file,
    resolve_deepspeed,
)
from fitcheck.readers.fsdp_config import FsdpRead, fsdp_from_config, fsdp_option_string
from fitcheck.readers.sources import as_bool, as_int, as_mapping, as_str, load_mapping_file
from fitcheck.spec import DeepSpeedSpec, MixedPrecision

# What one merge step sets: name -> (value, where it was read).
Updates = dict[str, tuple[object, str]]


@dataclass(frozen=True)
class Source:
    """A TrainingArguments field that names another source, and where it was read."""

    value: object
    where: str


def run_precision(values: Mapping[str, object]) -> MixedPrecision | None:
    """The run's bf16/fp16 as one setting, None when neither is on."""
    mp = MixedPrecision.from_flags(values.get("bf16"), values.get("fp16"))
    return None if mp is MixedPrecision.NO else mp


def deepspeed_raw(
    cli: Mapping[str, object],
    deepspeed_file: str | None,
    sources: Mapping[str, Source],
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
    from_file = raw is not None
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
    if overrides and from_file:  # nothing is overridden when the flags are the only DeepSpeed source
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
    sources: Mapping[str, Source],
    acc: AccelerateRead | None,
    findings: list[Finding],
) -> tuple[dict[str, object] | None, str]:
    raw: dict[str, object] | None = None
    source = ""
    ta = sources.get("deepspeed")
    ta_ds, ta_where = (ta.value, ta.where) if ta is not None else (None, "")
    cli_ds = cli.get("deepspeed")
    cli_file = deepspeed_file or (
        as_str(cli_ds, at="--deepspeed") if cli_ds and not isinstance(cli_ds, Mapping) else None
    )
    if isinstance(cli_ds, Mapping) and not deepspeed_file:  # a live TrainingArguments' dict (transformers accepts it)
        raw, source = as_mapping(cli_ds, at="TrainingArguments.deepspeed"), "TrainingArguments.deepspeed"
    elif cli_file:
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
class DeepSpeedMerged:
    """A resolved DeepSpeed config and what it fills in the run."""

    spec: DeepSpeedSpec
    updates: Updates
    notes: dict[str, str]  # "deepspeed.<field>" -> where it was read or what filled it
    findings: tuple[Finding, ...]


def resolve_ds(
    raw: Mapping[str, object],
    source: str,
    values: Mapping[str, object],
    provenance: Mapping[str, str],
    world: int,
    hidden_size: int | None,
) -> DeepSpeedMerged:
    """Resolve the DeepSpeed config against the run; the run takes the batch sizes and precision it fills."""
    run_prov = {k: provenance[k] for k in values if k in provenance}
    ds = resolve_deepspeed(
        raw, source=source, run=values, run_provenance=run_prov, world_size=world, hidden_size=hidden_size
    )
    findings = list(ds.findings)
    run_mp = run_precision(values)
    conflict = deepspeed_precision_conflict(
        ds, run_mp, provenance.get("bf16" if values.get("bf16") else "fp16", ""), source
    )
    if conflict is not None:
        findings.append(conflict)
    updates: Updates = {}
    for key, value, ds_key in (
        ("per_device_train_batch_size", ds.micro_batch, "train_micro_batch_size_per_gpu"),
        ("gradient_accumulation_steps", ds.grad_accum, "gradient_accumulation_steps"),
    ):
        if key not in values:
            updates[key] = (value, ds.provenance.get(ds_key, f"{source}:{ds_key}"))
    if ds.optimizer is not None:  # the config's optimizer section builds the optimizer: optim is not used
        opt_where = f"{source}:optimizer.type={ds.optimizer.type} (DeepSpeed builds {ds.optimizer.builds})"
        updates["optim"] = (ds.optimizer.optim, opt_where)
        updates["optim_args"] = (ds.optimizer.optim_args, opt_where)
    if run_mp is None and ds.mixed_precision is not MixedPrecision.NO:
        where_ = f"{source}:{ds.mixed_precision.value}.enabled"
        updates["bf16"] = (ds.mixed_precision is MixedPrecision.BF16, where_)
        updates["fp16"] = (ds.mixed_precision is MixedPrecision.FP16, where_)
    notes = {f"deepspeed.{key}": where_ for key, where_ in ds.provenance.items()}
    return DeepSpeedMerged(ds.spec, updates, notes, tuple(findings))


def fsdp_read(
    cli: Mapping[str, object],
    fsdp: str | None,
    sources: Mapping[str, Source],
    acc: AccelerateRead | None,
    cfg_where: str = "--fsdp_config",
) -> FsdpRead | None:
    """FSDP from ``--fsdp``/``--fsdp_config``, the TrainingArguments fields, or accelerate's file.

    ``cfg_where`` names an inline ``fsdp_config`` mapping in ``cli`` (a framework file's section)."""
    ta_fsdp, ta_cfg = sources.get("fsdp"), sources.get("fsdp_config")
    option = fsdp if fsdp is not None else cli.get("fsdp")
    option_where = "--fsdp"
    if option is None and ta_fsdp is not None and ta_fsdp.value not in (None, False, ""):
        option, option_where = ta_fsdp.value, ta_fsdp.where
    cfg, cfg_source = _fsdp_config(cli, ta_cfg, cfg_where)
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


def _fsdp_config(
    cli: Mapping[str, object], ta_cfg: Source | None, cfg_where: str
) -> tuple[dict[str, object] | None, str]:
    cfg_file = cli.get("fsdp_config")
    if isinstance(cfg_file, Mapping):  # a live TrainingArguments' or a framework file's fsdp_config dict
        return as_mapping(cfg_file, at=cfg_where), cfg_where
    if cfg_file is not None:
        cfg_source = as_str(cfg_file, at="--fsdp_config")
        return load_mapping_file(cfg_source, what="FSDP config (--fsdp_config)"), cfg_source
    if ta_cfg is not None and isinstance(ta_cfg.value, str) and ta_cfg.value:
        return load_mapping_file(ta_cfg.value, what=f"FSDP config ({ta_cfg.where})"), ta_cfg.value
    if ta_cfg is not None and isinstance(ta_cfg.value, Mapping):
        return as_mapping(ta_cfg.value, at=ta_cfg.where), ta_cfg.where
    return None, ""


def _sync_each_batch(cli: Mapping[str, object], sources: Mapping[str, Source]) -> bool:
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
