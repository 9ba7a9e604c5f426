"""What the Trainer callback needs besides its events: the Trainer it runs in, a ``try``/``finally`` around
``train()``, and verdict lines that say what the report says.

A ``TrainerCallback`` gets no event when ``Trainer.train`` raises (transformers 5.23 trainer.py calls
``on_train_end`` only after the loop completes), so a dispatch mode started at ``on_train_begin`` would stay
on torch's mode stack for the rest of the process. :func:`guard_train` wraps the Trainer's ``train`` (an
instance attribute shadowing the method) so that the callback's ``stop`` runs in a ``finally``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from fitcheck.report import Report
from fitcheck.units import format_bytes


def calling_trainer(max_depth: int = 32) -> Any:
    """The ``transformers.Trainer`` whose method is on the call stack (``__init__`` at ``on_init_end``), or None."""
    try:
        from transformers import Trainer
    except ImportError:  # pragma: no cover - the callback needs transformers
        return None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def guard_train(trainer: Any, on_exit: Callable[[], None]) -> bool:
    """Make ``trainer.train(...)`` call ``on_exit()`` when it returns or raises (once per Trainer).

    Returns:
        True when the guard is (already) in place.
    """
    if trainer is None or not callable(getattr(trainer, "train", None)):
        return False
    hooks: list[Callable[[], None]] | None = getattr(trainer, "_fitcheck_train_exit", None)
    if hooks is not None:
        hooks.append(on_exit)
        return True
    hooks = [on_exit]
    original = trainer.train

    @functools.wraps(original)
    def train(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            for hook in list(hooks or ()):
                hook()

    trainer._fitcheck_train_exit = hooks
    trainer.train = train
    return True


def guard_running_train(trainer: Any, on_error: Callable[[], None]) -> bool:
    """Make an exception in the ``train()`` that is already running call ``on_error()`` before it propagates.

    A callback added with ``trainer.add_callback`` after ``Trainer(...)`` sees no ``on_init_end``; its first event
    is ``on_train_begin``, inside ``train()``, too late to wrap that call. Everything after ``on_train_begin``
    runs in ``_run_epoch`` (transformers 5.23 trainer.py ``_inner_training_loop``: data, forward, backward,
    optimizer step, the other callbacks), so that is wrapped (an instance attribute shadowing the method), with
    ``get_batch_samples`` and ``training_step`` as well should a later version rename it; the next ``train()``
    call is guarded by :func:`guard_train`.

    Returns:
        True when the guard is (already) in place.
    """
    if trainer is None or getattr(trainer, "_fitcheck_step_guard", None) is not None:
        return trainer is not None
    hooks = [on_error]
    trainer._fitcheck_step_guard = hooks

    def wrap(owner: Any, name: str) -> None:
        original = getattr(owner, name, None)
        if not callable(original):
            return

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException:
                for hook in list(hooks):
                    hook()
                raise

        setattr(owner, name, call)

    for name in ("_run_epoch", "get_batch_samples", "training_step"):
        wrap(trainer, name)
    return True


def verdict(report: Report) -> str:
    """What makes the report fail, in its own words: the budget overrun, then the error findings."""
    parts: list[str] = []
    used, budget = format_bytes(report.device_used_bytes), format_bytes(report.budget_bytes)
    if not report.fits:
        parts.append(f"predicted {used} per GPU exceeds {budget}")
    errors = [f.message for f in report.errors[:3]]
    if errors:
        head = "" if not report.fits else f"the estimate ({used} of {budget}) has errors: "
        parts.append(head + "; ".join(errors))
    return " — ".join(parts) if parts else f"fits: {used} of {budget}"
