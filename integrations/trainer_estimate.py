"""The estimate of a constructed ``transformers.Trainer`` run: its arguments, its live model, this device.

Shared by :class:`~fitcheck.integrations.trainer.FitcheckCallback` (at ``on_init_end``) and the micro-batch
tuner (:func:`fitcheck.integrations.tuner.tune_micro_batch`), so both start from the same spec.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from fitcheck.integrations.spec_build import (
    apply_live_facts,
    build_spec,
    detect_hardware,
    field_findings,
    inventory_for,
    training_args_values,
)
from fitcheck.integrations.trl_live import (
    dataset_lengths,
    find_trainer,
    trainer_kind_of,
    trainer_spec_from_args,
    with_trainer,
)

from fitcheck.findings import Finding
from fitcheck.report import Report
from fitcheck.spec import TrainerKind, TrainingSpec


def estimate_with(spec: TrainingSpec, extra: tuple[Finding, ...] = ()) -> Report:
    """The estimate of ``spec`` with ``extra`` findings added to it.

    A PEFT method other than LoRA (``spec.peft``) is estimated only from peft's own model and a traced step (the
    CLI's default path, ``torch_adapters.PinnedPath``); the formulas alone refuse it (``core/states/peft_adapter``).
    """
    from fitcheck.core import estimate

    if extra:
        spec = dataclasses.replace(spec, findings=(*spec.findings, *extra))
    if spec.peft is not None:
        from fitcheck.torch_adapters import PinnedPath

        report: Report = PinnedPath("auto")(spec)
        return report
    return estimate(spec)


def with_findings(report: Report, extra: tuple[Finding, ...], assumptions: tuple[str, ...]) -> Report:
    """The report with more findings and assumptions."""
    return dataclasses.replace(
        report,
        findings=(*report.findings, *extra),
        assumptions=(*report.assumptions, *assumptions),
    )


def trainer_spec(
    args: Any,
    model: Any,
    *,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    device_type: str | None = None,
    overrides: Mapping[str, object] | None = None,
    source: str = "FitcheckCallback",
    trainer: Any = None,
) -> tuple[TrainingSpec, Report]:
    """Spec and report of a Trainer run from its ``TrainingArguments`` (or TRL config) and its model.

    Args:
        args: The Trainer's arguments (``args.hf_deepspeed_config`` is read when DeepSpeed is on).
        model: The model the Trainer holds.
        gpu: GPU name to estimate for instead of the device ``args.device`` names.
        gpu_memory: Memory per GPU instead of the device's.
        device_type: ``cuda`` or ``cpu`` (default: ``cuda`` when ``gpu``/``gpu_memory`` is given, else the
            device's type).
        overrides: ``fitcheck estimate`` flags by name (``max_seq_length`` ...).
        source: Who asked (for the provenance of the overrides).
        trainer: The Trainer (default: the one on the call stack); a TRL trainer's prepared dataset gives the
            lengths when no ``max_seq_length`` override is given.

    Returns:
        The spec and its report (live-model notes and field findings included).
    """
    values, prov, findings = training_args_values(args)
    ds = getattr(args, "hf_deepspeed_config", None)
    if ds is not None and isinstance(getattr(ds, "config", None), Mapping):
        values["deepspeed"] = dict(ds.config)  # "auto" already resolved by trainer_config_process
        prov["deepspeed"] = "args.hf_deepspeed_config"
    if gpu is not None or gpu_memory is not None:
        if gpu is not None:
            values["gpu"] = gpu
        if gpu_memory is not None:
            values["gpu_memory"] = gpu_memory
        values["device_type"] = "cuda"
    else:
        values.update(detect_hardware(getattr(args, "device", None)))
    if device_type is not None:
        values["device_type"] = device_type
    values.setdefault("num_processes", int(getattr(args, "world_size", 1) or 1))
    trainer = find_trainer() if trainer is None else trainer
    kind = trainer_kind_of(args)
    lengths = dataset_lengths(kind, trainer) if trainer is not None else {}
    if "max_seq_length" in lengths:  # the longest prepared row, instead of a config default
        values["max_seq_length"] = lengths["max_seq_length"]
        prov["max_seq_length"] = "trainer.train_dataset (longest row)"
    overrides = dict(overrides or {})
    trl_lengths = {k: int(str(overrides.pop(o))) for k, o in (("prompt", "max_prompt_length"),
                   ("completion", "max_completion_length")) if o in overrides}
    for key, value in overrides.items():
        values[key] = value
        prov[key] = f"{source}({key}=...)"
    env = dict(os.environ)
    from fitcheck.integrations.live_checks import architecture_finding

    from fitcheck.torch_adapters import inspect_model, live_device_map_findings

    facts = inspect_model(model)
    inventory = inventory_for(model, env)
    spec, assumptions = build_spec(inventory, values, prov, findings, env)
    spec, notes = apply_live_facts(spec, facts)
    if kind is not TrainerKind.TRAINER:  # a TRL config: its trainer's step (reference model, generation, ...)
        spec = with_trainer(spec, trainer_spec_from_args(args, {**lengths, **trl_lengths}))
        notes = [*notes, f"TRL {kind.value} trainer recognised from {type(args).__name__}"]
    extra = live_device_map_findings(model, num_processes=spec.sharding.num_processes)
    mismatch = architecture_finding(model, inventory)
    if mismatch is not None:
        extra = (mismatch, *extra)
    report = estimate_with(spec, extra)
    more = field_findings(spec, values, env, use_cache=facts.use_cache,
                          device_used_fraction=report.device_used_bytes / max(1, report.budget_bytes),
                          existing=report.findings)
    return spec, with_findings(report, more, (*assumptions, *notes))
