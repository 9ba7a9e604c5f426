"""Partial training without PEFT for the tracer: ``requires_grad_(False)`` on what a FreezeSpec leaves frozen.

The rule is the one ``fitcheck.core.state_layout`` counts trainable parameters by: a parameter is trainable when
its generic name (layer index written ``*``, as ``fitcheck.spec.ParamEntry.name``) matches one of
``FreezeSpec.trainable`` (fnmatch) and, for per-layer parameters, its layer index is in
``FreezeSpec.trainable_layers`` (when set). This is what a training script does with
``for n, p in model.named_parameters(): p.requires_grad_(...)`` before building the Trainer.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from fitcheck.spec import FreezeSpec

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def is_trainable(name: str, freeze: FreezeSpec) -> bool:
    """Whether the parameter ``name`` (transformers naming, real layer index) stays trainable under ``freeze``."""
    m = _LAYER_INDEX.search(name)
    generic = _LAYER_INDEX.sub(".*.", name, count=1) if m else name
    if not any(fnmatch.fnmatchcase(generic, p) for p in freeze.trainable):
        return False
    if m is None or freeze.trainable_layers is None:
        return True
    return int(m.group(1)) in freeze.trainable_layers


def apply_freeze(model: Any, freeze: FreezeSpec) -> None:
    """Freeze (``requires_grad_(False)``) every parameter of ``model`` that ``freeze`` does not keep trainable."""
    for name, param in model.named_parameters():
        param.requires_grad_(is_trainable(name, freeze))
