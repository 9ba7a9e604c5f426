"""ZeRO-3 parameters kept gathered from their forward to their backward (``stage3_max_reuse_distance``).

DeepSpeed 0.19.8 ``runtime/zero/partitioned_param_coordinator.py`` ``__params_to_release`` (once the trace of the
first step is complete): a module's parameters are not released after it runs when they are used again within
``max_reuse_distance`` elements of the modules that follow it in the trace. After a parameter's forward the modules
that follow are the rest of the forward, then the backward from the top: its reuse (its own backward) lies about
twice the elements after it in the model away. So from the end of the forward to its own backward every trainable
tensor with ``2 x (elements after it) < max_reuse_distance`` stays gathered: the last ``max_reuse_distance / 2``
elements of the model, the LM head first. At DeepSpeed's default 1e9 this is the LM head alone on an 8B model, and
every parameter of a 0.5B one.

A module no gradient reaches (before the first trainable parameter: a frozen embedding under LoRA) has no
backward and is not kept. Parameters of at most ``stage3_param_persistence_threshold`` elements are never released
(counted by ``buffers.zero3_persistent_params``). The same rule is replayed event by event by
``fitcheck.torch_adapters.deepspeed_run_zero3`` (checked against real 2-process engines:
``benchmarks/deepspeed_zero3_cpu.py``).

Pure Python.
"""

from __future__ import annotations

from fitcheck.core.states.lora import plan_lora
from fitcheck.spec import ParamEntry, TrainingSpec

__all__ = ["reuse_kept_elements"]


def _ordered(spec: TrainingSpec) -> list[ParamEntry]:
    """Every tensor's entry in ``named_parameters`` order: the entries before the first per-layer one, the layers,
    the rest."""
    params = spec.model.params
    first = next((i for i, p in enumerate(params) if p.per_layer), len(params))
    layer = [p for p in params if p.per_layer]
    layers = max((p.repeat for p in params if p.per_layer), default=0)
    return [*params[:first], *(layer * layers), *(p for p in params[first:] if not p.per_layer)]


def _first_trained(spec: TrainingSpec, ordered: list[ParamEntry]) -> int:
    """Index of the first tensor after which a gradient flows. Full fine-tuning: the embedding. LoRA: just after
    the first wrapped (or ``modules_to_save``) weight, whose adapters (or copy) follow it in ``named_parameters``
    (peft's ``base_layer`` first); the wrapped weight itself, below every adapter, has no backward. Freezing:
    the first layer (not resolved further)."""
    if spec.lora is None and spec.freeze is None:
        return 0
    if spec.lora is None:
        return next((i for i, p in enumerate(ordered) if p.per_layer), len(ordered))
    plan = plan_lora(spec)
    wrapped = {t.entry.name for t in plan.targets} | {s.entry.name for s in plan.saved}
    return next((i + 1 for i, p in enumerate(ordered) if p.name in wrapped), len(ordered))


def reuse_kept_elements(spec: TrainingSpec, persistence_threshold: int, max_reuse_distance: int) -> int:
    """Elements of the parameters kept gathered from the end of the forward into the backward.

    Args:
        spec: The training spec.
        persistence_threshold: ``stage3_param_persistence_threshold`` (these stay gathered anyway).
        max_reuse_distance: ``stage3_max_reuse_distance``.

    Returns:
        Their elements (the trainable tail of the model within half the distance; module docstring).
    """
    ordered = _ordered(spec)
    numels = [p.numel_each for p in ordered]
    first_trained = _first_trained(spec, ordered)
    kept, after = 0, 0
    for k in range(len(numels) - 1, first_trained - 1, -1):
        if 2 * after >= max_reuse_distance:
            break
        if numels[k] > persistence_threshold:
            kept += numels[k]
        after += numels[k]
    return kept
