"""fitcheck: will this training run fit on these GPUs, and if not, what exactly should I change?

Per-GPU peak memory of one training step from a model's config.json alone (no weights, no network, no GPU),
for runs with Hugging Face transformers, accelerate, DeepSpeed, PEFT and bitsandbytes.

The pure core (``estimate``, the spec and report types) imports no torch. ``FitcheckCallback`` and
``preflight`` (and the micro-batch tuner, ``tune_micro_batch``) live in ``fitcheck.integrations`` and are
imported lazily (they need transformers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitcheck.errors import ConfigError, FitcheckError, NotModelledError, UnsupportedModelError
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase, Report
from fitcheck.spec import TrainingSpec

if TYPE_CHECKING:
    from fitcheck.core import estimate
    from fitcheck.integrations import FitcheckCallback, preflight, train_with_tuned_micro_batch, tune_micro_batch

__version__ = "0.1.0"

__all__ = [
    "Category",
    "Component",
    "ConfigError",
    "Finding",
    "FitcheckCallback",
    "FitcheckError",
    "Location",
    "NotModelledError",
    "Phase",
    "Report",
    "Severity",
    "TrainingSpec",
    "UnsupportedModelError",
    "__version__",
    "estimate",
    "preflight",
    "train_with_tuned_micro_batch",
    "tune_micro_batch",
]

_LAZY = {"FitcheckCallback", "preflight", "tune_micro_batch", "train_with_tuned_micro_batch"}


def __getattr__(name: str) -> Any:
    """Import on first use: the estimator, and the Trainer integration (which needs transformers and torch)."""
    if name == "estimate":
        from fitcheck.core import estimate

        return estimate
    if name in _LAZY:
        import fitcheck.integrations as integrations

        return getattr(integrations, name)
    raise AttributeError(f"module 'fitcheck' has no attribute {name!r}")
