"""Where users meet fitcheck: the Trainer callback, the preflight, the launch wrapper and the zero-code hook.

Shipped inside the wheel as ``fitcheck.integrations`` (the repository keeps it in a top-level ``integrations/``
folder). Everything here imports transformers/torch lazily, on first use:

* :func:`preflight` — estimate before ``Trainer(...)`` (the only place a weight OOM can be prevented for
  single-GPU and DDP runs: the Trainer moves the weights to the GPU inside its constructor).
* :class:`FitcheckCallback` — reads the loaded model at ``on_init_end``, prints the report, optionally raises
  (``strict=True``), and records predicted vs measured peak memory after the first optimizer steps.
* :class:`DoesNotFitError` — raised by both only when ``strict``.
* ``fitcheck launch`` (``fitcheck.integrations.accelerate_launch``) and ``python -m fitcheck.run``
  (``fitcheck.integrations.run``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fitcheck.integrations.trainer import DoesNotFitError, FitcheckCallback, preflight

__all__ = ["DoesNotFitError", "FitcheckCallback", "preflight"]


def __getattr__(name: str) -> Any:
    """Import the Trainer integration (transformers, torch) on first use."""
    if name in __all__:
        from fitcheck.integrations import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'fitcheck.integrations' has no attribute {name!r}")
