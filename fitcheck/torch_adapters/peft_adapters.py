"""A PEFT adapter other than LoRA: its tensors, from the model peft builds (:mod:`.peft_build`).

The tensor inventory (:func:`with_adapter_inventory`) is the model built on fake tensors at the full depth and
wrapped: every parameter or buffer that was not the base model's is an adapter tensor, with its dtype as peft left
it (``autocast_adapter_dtype=True`` upcasts 16-bit adapter weights to fp32). AdaLoRA adds the state of its rank
allocator, which a training loop updates every step (``tuners/adalora/layer.py`` ``RankAllocator.update_ipt``:
``ipt``, ``exp_avg_ipt``, ``exp_avg_unc``, one ``zeros_like`` each per ``lora_`` parameter).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from fitcheck.spec import AdapterTensor, PeftAdapterSpec, TrainingSpec
from fitcheck.torch_adapters.peft_build import wrap_adapter

# tuners/adalora/layer.py RankAllocator.update_ipt: ipt, exp_avg_ipt, exp_avg_unc per lora_ parameter
_ADALORA_ALLOCATOR_STATES = ("ipt", "exp_avg_ipt", "exp_avg_unc")

_INVENTORIES: dict[str, tuple[AdapterTensor, ...]] = {}

def _dtype(t: Any) -> tuple[str, int]:
    return str(t.dtype).removeprefix("torch."), int(t.element_size())


def adapter_tensors(config: Mapping[str, Any], adapter: PeftAdapterSpec, dtype: str, task: str) -> tuple[
        AdapterTensor, ...]:
    """The tensors ``get_peft_model`` adds to the model of ``config`` (at its full depth, on fake tensors), grouped
    by name with layer indices as ``*``.

    Raises:
        Exception: Whatever transformers or peft raise building the model (the caller reports it).
    """
    from fitcheck.torch_adapters.tracer import fake_mode, torch_dtype
    from fitcheck.torch_adapters.tracer_build import build_model
    from fitcheck.torch_adapters.tracer_patches import fake_deepcopy, fake_trunc_normal, module_to_is_noop
    from fitcheck.torch_adapters.tracer_task import task_trace_config

    with fake_mode(True):
        model = build_model(task_trace_config(dict(config), task), dtype=torch_dtype(dtype), fake=True, task=task,
                            attn_implementation="sdpa", checkpointing=False)
        base = {id(t): bool(getattr(t, "requires_grad", False)) for t in (*model.parameters(), *model.buffers())}
        with module_to_is_noop(), fake_deepcopy(), fake_trunc_normal():  # as build_model wraps on fake tensors
            model = wrap_adapter(model, adapter)
        groups: dict[tuple[Any, ...], int] = {}
        for name, p in model.named_parameters():
            was_trainable = base.get(id(p))
            if was_trainable is None or (p.requires_grad and not was_trainable):
                key = (re.sub(r"\.\d+\.", ".*.", name), tuple(p.shape), _dtype(p), p.requires_grad,
                       was_trainable is not None, False)
                groups[key] = groups.get(key, 0) + 1
        for name, b in model.named_buffers():
            if id(b) not in base:
                key = (re.sub(r"\.\d+\.", ".*.", name), tuple(b.shape), _dtype(b), False, False, True)
                groups[key] = groups.get(key, 0) + 1
    tensors = [AdapterTensor(n, shape, dt[0], dt[1], repeat, trainable, in_base, buffer)
               for (n, shape, dt, trainable, in_base, buffer), repeat in groups.items()]
    if adapter.peft_type == "ADALORA":
        tensors += [AdapterTensor(f"rank_allocator.{state}:{t.name}", t.shape, t.dtype, t.itemsize, t.repeat, False,
                                  False, True)
                    for t in list(tensors) if t.trainable and ".lora_" in t.name
                    for state in _ADALORA_ALLOCATOR_STATES]
    return tuple(tensors)


def with_adapter_inventory(spec: TrainingSpec) -> TrainingSpec:
    """``spec`` with its PEFT adapter's tensors built (unchanged without ``TrainingSpec.peft`` or with them)."""
    peft = spec.peft
    if peft is None or peft.tensors or not spec.model.config:
        return spec
    dtype, task = spec.precision.load_dtype.value, spec.model.shape.task
    key = repr((spec.model.model_id, sorted(spec.model.config.items()), peft.config_json, dtype, task))
    if key not in _INVENTORIES:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _INVENTORIES[key] = adapter_tensors(spec.model.config, peft, dtype, task)
    return dataclasses.replace(spec, peft=dataclasses.replace(peft, tensors=_INVENTORIES[key]))
