"""Where users meet fitcheck: the Trainer callback, the preflight, the launch wrapper and the zero-code hook.

Shipped inside the wheel as ``fitcheck.integrations`` (the repository keeps it in a top-level ``integrations/``
folder). Everything here imports transformers/torch lazily, on first use:

* :func:`preflight` — estimate before ``Trainer(...)`` (the only place a weight OOM can be prevented for
  single-GPU and DDP runs: the Trainer moves the weights to the GPU inside its constructor).
* :class:`FitcheckCallback` — reads the loaded model at ``on_init_end``, prints the report, optionally raises
  (``strict=True``), and records predicted vs measured peak memory after the first optimizer steps.
* :class:`DoesNotFitError` — raised by both only when ``strict``; :class:`EstimateUnavailableError` — raised by
  the callback under ``strict`` when no estimate could be made (strict fails closed).
* :func:`tune_micro_batch` — the largest micro-batch that runs, found by trial steps that cannot move the
  weights, keeping the global batch; :func:`train_with_tuned_micro_batch` = tune, then ``trainer.train()``.
* ``fitcheck launch`` (:func:`split_argv`, :func:`launch_report`, :func:`accelerate_command`,
  :func:`exec_command` from ``fitcheck.integrations.accelerate_launch``) and ``python -m fitcheck.run``
  (:func:`run_main`, ``fitcheck.integrations.run``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fitcheck.integrations.accelerate_launch import accelerate_command, exec_command, launch_report, split_argv
    from fitcheck.integrations.launch_plan import machine_ram_bytes, with_cpu_budget
    from fitcheck.integrations.run import main as run_main
    from fitcheck.integrations.trainer import DoesNotFitError, FitcheckCallback, preflight
    from fitcheck.integrations.tuner import (
        TuningError,
        TuningResult,
        divisors,
        set_trainer_micro_batch,
        train_with_tuned_micro_batch,
        tune_micro_batch,
    )
    from fitcheck.integrations.tuner_search import search_largest

_WHERE = {
    "TuningError": ("tuner", "TuningError"),
    "divisors": ("tuner", "divisors"),
    "tune_micro_batch": ("tuner", "tune_micro_batch"),
    "search_largest": ("tuner_search", "search_largest"),
    "DoesNotFitError": ("trainer", "DoesNotFitError"),
    "FitcheckCallback": ("trainer", "FitcheckCallback"),
    "preflight": ("trainer", "preflight"),
    "accelerate_command": ("accelerate_launch", "accelerate_command"),
    "exec_command": ("accelerate_launch", "exec_command"),
    "launch_report": ("accelerate_launch", "launch_report"),
    "split_argv": ("accelerate_launch", "split_argv"),
    "run_main": ("run", "main"),
    "with_cpu_budget": ("launch_plan", "with_cpu_budget"),
    "machine_ram_bytes": ("launch_plan", "machine_ram_bytes"),
    "train_with_tuned_micro_batch": ("tuner", "train_with_tuned_micro_batch"),
    "set_trainer_micro_batch": ("tuner", "set_trainer_micro_batch"),
    "TuningResult": ("tuner", "TuningResult"),
}

__all__ = [
    "DoesNotFitError",
    "FitcheckCallback",
    "TuningError",
    "TuningResult",
    "accelerate_command",
    "divisors",
    "exec_command",
    "launch_report",
    "machine_ram_bytes",
    "preflight",
    "run_main",
    "search_largest",
    "set_trainer_micro_batch",
    "split_argv",
    "train_with_tuned_micro_batch",
    "tune_micro_batch",
    "with_cpu_budget",
]


def __getattr__(name: str) -> Any:
    """Import the integration that defines ``name`` (transformers, torch, accelerate) on first use."""
    if name in _WHERE:
        module, attr = _WHERE[name]
        return getattr(importlib.import_module(f"fitcheck.integrations.{module}"), attr)
    raise AttributeError(f"module 'fitcheck.integrations' has no attribute {name!r}")
