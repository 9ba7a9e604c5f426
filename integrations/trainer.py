"""fitcheck in a ``transformers.Trainer`` script: :func:`preflight` and :class:`FitcheckCallback`.

**Call** :func:`preflight` **before** ``Trainer(...)``. For single-GPU and DDP runs the Trainer moves the
weights to the GPU inside its constructor (``Trainer.__init__`` -> ``_move_model_to_device``), before any
callback runs, so a check before the constructor is the only place a weight OOM can be prevented. The callback
covers the rest: at ``on_init_end`` it reads the loaded model as it really is (dtypes, devices, PEFT layers,
quantized layers), the TrainingArguments and the resolved DeepSpeed config, prints the report on the main
process, and with ``strict=True`` raises before the first step. After the first optimizer steps it compares
the prediction with the measured peak (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``; on a CPU,
a live-tensor tracker) and writes both to ``record_path`` when asked.

Works with transformers 5.x and 4.x (>= 4.40): only events and attributes both have are relied on
(``on_init_end``, ``on_train_begin``, ``on_step_end``, ``on_train_end``; ``state.is_world_process_zero``,
``args.hf_deepspeed_config``); version-specific names are read through the readers, which accept both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from fitcheck.integrations.preflight_inputs import check_preflight_inputs, config_use_cache
from fitcheck.integrations.spec_build import (
    adapter_of,
    apply_live_facts,
    build_spec,
    detect_hardware,
    detected_gpu,
    field_findings,
    inventory_for,
    is_live_model,
    lora_values,
    quantization_values,
    training_args_values,
    transformers_major,
)
from fitcheck.integrations.trainer_estimate import estimate_with, with_findings
from fitcheck.integrations.trl_live import (
    find_trainer,
    reference_model_of,
    trainer_kind_of,
    trainer_spec_from_args,
    with_trainer,
)
from transformers import TrainerCallback

from fitcheck.errors import FitcheckError
from fitcheck.findings import Finding
from fitcheck.report import Report
from fitcheck.spec import TrainerKind, TrainingSpec
from fitcheck.units import format_bytes

__all__ = ["DoesNotFitError", "EstimateUnavailableError", "FitcheckCallback", "preflight"]


class DoesNotFitError(FitcheckError):
    """The run will not fit (raised only when asked: ``strict=True``).

    Attributes:
        report: The estimate that says so.
    """

    def __init__(self, report: Report) -> None:
        from fitcheck.integrations.callback_guard import verdict

        self.report = report
        super().__init__(f"fitcheck: {verdict(report)}")


class EstimateUnavailableError(FitcheckError):
    """``strict=True`` and the estimate could not be made: strict fails closed."""


def _would_fail(report: Report) -> bool:
    return not report.fits or bool(report.errors)


def _transformers_defaults(values: dict[str, object], prov: dict[str, str]) -> None:
    """transformers 4.x ``from_pretrained`` loads float32 unless ``torch_dtype`` is given (5.x: "auto")."""
    if transformers_major() == 4 and "dtype" not in values:
        values["dtype"] = "float32"
        prov["dtype"] = "transformers 4.x from_pretrained default (float32 without torch_dtype)"


def preflight(
    model_or_config: Any,
    args: Any = None,
    peft_config: Any = None,
    quantization_config: Any = None,
    *,
    gpu: str | None = None,
    gpu_memory: str | int | None = None,
    strict: bool = False,
    device_map: str | None = None,
    max_memory: Mapping[str, int] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: object,
) -> Report:
    """Estimate a run before the Trainer exists — the only point where a weight OOM can still be prevented.

    For single-GPU and DDP runs ``Trainer(...)`` moves the weights to the GPU inside its constructor; call this
    before it (and before ``model.to("cuda")``).

    Args:
        model_or_config: A Hub id or local path, a ``PretrainedConfig``, or a loaded model (then its real
            dtypes, PEFT layers and quantized layers are read).
        args: A ``TrainingArguments`` or a TRL ``SFTConfig``/``DPOConfig``/``GRPOConfig``/``RewardConfig`` (the
            trainer is recognised from its class; pass ``max_prompt_length``/``max_completion_length`` for
            DPO/GRPO data lengths).
        peft_config: A peft ``LoraConfig``, or the config of another method fitcheck estimates (``IA3Config``,
            ``PromptTuningConfig``, ...: ``readers.TRACED_PEFT_TYPES``) (ignored for a loaded model that already
            has adapters).
        quantization_config: A transformers ``BitsAndBytesConfig``.
        gpu: GPU name (``"A100-80GB"``, ``"RTX4090-24GB"``...); default: this machine's GPU, else H100-80GB.
        gpu_memory: Memory per GPU instead of ``gpu`` (``"24GiB"`` or bytes).
        strict: Raise :class:`DoesNotFitError` when it will not fit.
        device_map: Also check a ``device_map`` (``"auto"``...) for trainable parameters on cpu/disk.
        max_memory: ``max_memory`` for that check (``{"0": bytes, "cpu": bytes}``).
        env: Environment (default ``os.environ``): HF cache, ``PYTORCH_CUDA_ALLOC_CONF``.
        **overrides: Any ``fitcheck estimate`` flag by name: ``max_seq_length=4096``, ``num_processes=8``,
            ``dtype="bfloat16"``, ``deepspeed="ds.json"``, ``config_file="accelerate.yaml"``...

    Returns:
        The report.

    Raises:
        DoesNotFitError: When ``strict`` and the run does not fit.
        FitcheckError: Bad input (a message naming the field and the fix).
    """
    check_preflight_inputs(model_or_config, args, overrides)
    env = dict(os.environ if env is None else env)
    values: dict[str, object] = {}
    prov: dict[str, str] = {}
    findings: list[Finding] = []
    if args is not None:
        values, prov, findings = training_args_values(args)
    if values.get("use_cpu") is True and "device_type" not in overrides:
        # TrainingArguments(use_cpu=True) trains on the CPU (training_args.py _setup_devices): estimate the CPU
        values["device_type"] = "cpu"
        prov["device_type"] = f"{type(args).__name__}.use_cpu"
        if gpu is None and gpu_memory is None and not {"gpu", "gpu_memory", "host_memory"} & set(overrides):
            values.update(detect_hardware("cpu"))  # this machine's RAM is the CPU run's budget
    facts = None
    if is_live_model(model_or_config):
        from fitcheck.torch_adapters import inspect_model

        facts = inspect_model(model_or_config)
    # a non-LoRA peft_config for a model without it yet: its adapter (get_peft_model is applied later)
    adapter = adapter_of(peft_config) if peft_config is not None and (facts is None or facts.peft is None) else None
    if peft_config is not None and adapter is None and (facts is None or facts.lora is None):
        values.update(lora_values(peft_config))
    if quantization_config is not None and (facts is None or facts.quant is None):
        values.update(quantization_values(quantization_config))
    _transformers_defaults(values, prov)
    if gpu is not None:
        values["gpu"] = gpu
    if gpu_memory is not None:
        values["gpu_memory"] = gpu_memory
    if gpu is None and gpu_memory is None and "gpu" not in overrides and "gpu_memory" not in overrides:
        hw = detected_gpu()
        values.update(hw)
    trl_lengths = {k: int(str(overrides[o])) for k, o in (("prompt", "max_prompt_length"),
                   ("completion", "max_completion_length")) if o in overrides}
    for key, value in overrides.items():
        if key in ("max_prompt_length", "max_completion_length"):
            continue
        values[key] = value
        prov[key] = f"preflight({key}=...)"
    inventory = inventory_for(model_or_config, env)
    spec, assumptions = build_spec(inventory, values, prov, findings, env)
    notes: list[str] = []
    extra: tuple[Finding, ...] = ()
    if facts is not None:
        from fitcheck.integrations.live_checks import architecture_finding, with_pending_lora

        flag_spec = spec
        spec, notes = apply_live_facts(spec, facts)
        spec, pending = with_pending_lora(spec, flag_spec, facts)
        notes += pending
        mismatch = architecture_finding(model_or_config, inventory)
        extra = (mismatch,) if mismatch is not None else ()
    if adapter is not None and spec.peft is None:
        spec = dataclasses.replace(spec, peft=adapter, lora=None, freeze=None)
    kind = trainer_kind_of(args)
    if kind is not TrainerKind.TRAINER:  # a TRL config: its trainer's step (reference model, generation, ...)
        spec = with_trainer(spec, trainer_spec_from_args(args, trl_lengths))
        notes = [*notes, f"TRL {kind.value} trainer recognised from {type(args).__name__}"]
    if device_map:
        from fitcheck.torch_adapters import device_map_findings

        extra += device_map_findings(spec, device_map, max_memory)
    if facts is not None:
        from fitcheck.torch_adapters import live_device_map_findings

        extra += live_device_map_findings(model_or_config, num_processes=spec.sharding.num_processes)
    report: Report = estimate_with(spec, extra)
    if device_map:
        from fitcheck.advice import weights_only_finding

        note = weights_only_finding(report, device_map)
        if note is not None:
            report = with_findings(report, (note,), ())
    use_cache = facts.use_cache if facts is not None else config_use_cache(model_or_config, inventory)
    more = field_findings(spec, values, env, use_cache=use_cache,
                          device_used_fraction=report.device_used_bytes / max(1, report.budget_bytes),
                          existing=report.findings)
    report = with_findings(report, more, (*assumptions, *notes))
    if strict and _would_fail(report):
        raise DoesNotFitError(report)
    return report


def _rank_zero(args: Any, state: Any) -> bool:
    flag = getattr(state, "is_world_process_zero", None)
    if isinstance(flag, bool):
        return flag
    return int(getattr(args, "process_index", 0) or 0) == 0


class FitcheckCallback(TrainerCallback):
    """Check a Trainer run at construction, and compare the prediction with the measured peak.

    Args:
        strict: Raise :class:`DoesNotFitError` at ``on_init_end`` (inside ``Trainer(...)``, before any step)
            when the run will not fit. Without it, fitcheck only warns, and an internal fitcheck error is a
            warning too: it never breaks training.
        record_path: Write predicted and measured peaks to this JSON file (main process only).
        measure_steps: Optimizer steps to measure (the estimate is the steady state from step 2 on).
        print_report: Print the full report on the main process.
        gpu: GPU name to estimate for instead of the detected device.
        gpu_memory: Memory per GPU instead of the detected device's.
        **overrides: ``fitcheck estimate`` flags for what the Trainer cannot know, above all
            ``max_seq_length`` (default: ``args.max_length``/``max_seq_length`` when the config has one).

    Attributes:
        report: The latest prediction.
        measured: The measured peaks (``{"step": n, "max_memory_allocated": ..., ...}``), once measured.
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        record_path: str | None = None,
        measure_steps: int = 2,
        print_report: bool = True,
        gpu: str | None = None,
        gpu_memory: str | int | None = None,
        **overrides: object,
    ) -> None:
        self.strict = strict
        self.record_path = record_path
        self.measure_steps = max(1, int(measure_steps))
        self.print_report = print_report
        self.gpu = gpu
        self.gpu_memory = gpu_memory
        self.overrides = dict(overrides)
        self.report: Report | None = None
        self.measured: dict[str, Any] | None = None
        self._spec: TrainingSpec | None = None
        self._estimated_batch: int | None = None
        self._train_begins = 0
        self._tracker: Any = None
        self._device_type = "cpu"
        self._main = True
        self._initialised = False

    # ---- helpers -------------------------------------------------------------------------------------------
    def _guard(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, DoesNotFitError):
            raise exc
        warnings.warn(f"fitcheck: {what} failed and was skipped ({type(exc).__name__}: {exc})", stacklevel=3)

    def _say(self, text: str) -> None:
        if self._main:
            print(text, flush=True)

    def _spec_from_trainer(self, args: Any, model: Any) -> tuple[TrainingSpec, Report]:
        from fitcheck.integrations.trainer_estimate import trainer_spec

        device = getattr(args, "device", None)
        self._device_type = getattr(device, "type", "cpu") or "cpu"
        spec: TrainingSpec
        report: Report
        spec, report = trainer_spec(args, model, gpu=self.gpu, gpu_memory=self.gpu_memory, overrides=self.overrides)
        return spec, report

    def _print(self, report: Report) -> None:
        if not (self._main and self.print_report):
            return
        from fitcheck.render import make_console, print_report

        print_report(report, make_console())

    # ---- events --------------------------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Estimate from the live model and arguments; raise here when strict and it will not fit.

        Under ``strict`` an estimate that cannot be made raises :class:`EstimateUnavailableError` (fails closed).
        """
        from fitcheck.integrations.callback_guard import calling_trainer, guard_train

        self._main = _rank_zero(args, state)
        guard_train(calling_trainer(), self._stop_tracker)  # the tracker leaves torch's mode stack, also on raise
        return self._check(args, control, kwargs.get("model"))

    def _check(self, args: Any, control: Any, model: Any) -> Any:
        """Estimate the run; under ``strict`` raise when it will not fit or cannot be estimated."""
        from fitcheck.integrations.callback_guard import verdict

        self._initialised = True
        try:
            if model is None:
                raise ValueError("on_init_end got no model")
            self._spec, self.report = self._spec_from_trainer(args, model)
            self._estimated_batch = self._spec.batch.micro_batch
            self._print(self.report)
        except DoesNotFitError:
            raise
        except Exception as exc:
            if self.strict:
                raise EstimateUnavailableError(
                    f"fitcheck (strict=True): the memory estimate could not be made, so the run is not let through "
                    f"({type(exc).__name__}: {exc}); fix the cause, pass the model id/config to preflight(), or "
                    "drop strict=True"
                ) from exc
            self._guard("the memory estimate", exc)
            return control
        if self.strict and _would_fail(self.report):
            raise DoesNotFitError(self.report)
        if _would_fail(self.report):
            warnings.warn(f"fitcheck: {verdict(self.report)}; training may fail or run out of memory", stacklevel=2)
        return control

    def _stop_tracker(self) -> None:
        if self._tracker is not None:
            self._tracker.stop()
            self._tracker = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Start measuring; on an ``auto_find_batch_size`` retry re-estimate with the new batch (once each)."""
        self._main = _rank_zero(args, state)
        if not self._initialised:  # added with trainer.add_callback(...): on_init_end never ran
            from fitcheck.integrations.callback_guard import calling_trainer, guard_running_train, guard_train

            trainer = calling_trainer()
            guard_train(trainer, self._stop_tracker)  # the next train() call
            guard_running_train(trainer, self._stop_tracker)  # this one: a step that raises stops the tracker
            self._check(args, control, kwargs.get("model"))  # strict raises here, before any step
        self._train_begins += 1
        try:
            batch = int(getattr(state, "train_batch_size", 0) or 0) // max(1, int(getattr(args, "n_gpu", 1) or 1))
            if self._spec is not None and batch and batch != self._estimated_batch:
                self._estimated_batch = batch
                spec = dataclasses.replace(self._spec, batch=dataclasses.replace(self._spec.batch, micro_batch=batch))
                self._spec = spec
                self.report = estimate_with(spec)
                verdict = "fits" if self.report.fits else "does NOT fit"
                self._say(f"fitcheck: micro-batch {batch} (auto_find_batch_size attempt {self._train_begins}): "
                          f"predicted {format_bytes(self.report.device_used_bytes)} of "
                          f"{format_bytes(self.report.budget_bytes)} — {verdict}")
            self.measured = None
            self._start_measuring(kwargs.get("model"), kwargs.get("optimizer"), retry=self._train_begins > 1)
        except Exception as exc:
            self._guard("memory measurement setup", exc)
        return control

    def _start_measuring(self, model: Any, optimizer: Any, *, retry: bool) -> None:
        import torch

        if self._device_type == "cuda" and torch.cuda.is_available():
            if retry:  # the failed attempt's peak must not count for this batch size
                torch.cuda.reset_peak_memory_stats()
            return
        if self._device_type != "cpu" or model is None:
            return
        from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

        if self._tracker is not None:
            self._tracker.stop()
        self._tracker = LiveTensorTracker()
        self._tracker.track(model_state_tensors(model, optimizer))
        reference = reference_model_of(find_trainer())  # DPO/GRPO's separate reference copy
        if reference is not None and reference is not model:
            self._tracker.track(model_state_tensors(reference))
        self._tracker.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Read the peak after each of the first ``measure_steps`` optimizer steps."""
        step = int(getattr(state, "global_step", 0) or 0)
        if self.report is None or step < 1 or step > self.measure_steps:
            return control
        try:
            self._record(step, kwargs.get("model"))
        except Exception as exc:
            self._guard("the memory measurement", exc)
        if step >= self.measure_steps and self._tracker is not None:
            self._tracker.stop()
            self._tracker = None
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Stop the CPU tracker if training ended before the measured steps."""
        if self._tracker is not None:
            self._tracker.stop()
            self._tracker = None
        return control

    def _record(self, step: int, model: Any) -> None:
        import torch

        assert self.report is not None
        report = self.report
        if self._device_type == "cuda" and torch.cuda.is_available():
            measured: dict[str, Any] = {
                "device": "cuda",
                "max_memory_allocated": int(torch.cuda.max_memory_allocated()),
                "max_memory_reserved": int(torch.cuda.max_memory_reserved()),
            }
            predicted_key, measured_key = "peak_allocated_bytes", "max_memory_allocated"
        elif self._tracker is not None:
            measured = {"device": "cpu", "live_tensor_peak": int(self._tracker.peak)}
            predicted_key, measured_key = "peak_allocated_bytes", "live_tensor_peak"
        else:
            return
        measured["step"] = step
        self.measured = measured
        predicted = {
            "peak_allocated_bytes": report.peak_allocated_bytes,
            "peak_reserved_bytes": report.peak_reserved_bytes,
            "device_used_bytes": report.device_used_bytes,
            "budget_bytes": report.budget_bytes,
            "peak_phase": report.peak_phase.value,
        }
        pred_value, meas_value = int(str(predicted[predicted_key])), int(measured[measured_key])
        error = (pred_value - meas_value) / max(1, meas_value)
        if step == self.measure_steps:
            self._say(f"fitcheck: step {step}: predicted {format_bytes(pred_value)} "
                      f"({predicted_key}), measured {format_bytes(meas_value)} ({measured_key}): "
                      f"{error:+.1%}")
        if self.record_path and self._main:
            spec = report.spec
            record = {
                "model": spec.model.model_id,
                "regime": report.regime,
                "micro_batch": spec.batch.micro_batch,
                "seq_len": spec.batch.seq_len,
                "grad_accum": spec.batch.grad_accum,
                "num_processes": spec.sharding.num_processes,
                "strategy": spec.sharding.strategy.value,
                "device_type": spec.hardware.device_type.value,
                "gpu": spec.hardware.gpu_name,
                "predicted": predicted,
                "measured": measured,
                "relative_error": error,
                "compared": f"{predicted_key} vs {measured_key}",
                "transformers_major": transformers_major(),
            }
            with open(self.record_path, "w", encoding="utf-8") as fh:
                json.dump(record, fh, indent=2)

