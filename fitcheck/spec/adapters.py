"""A PEFT adapter other than LoRA (IA3, LoHa, LoKr, OFT, VeRA, AdaLoRA, prompt / prefix / p-tuning, ...).

Which ``peft_type`` values fitcheck estimates is :data:`fitcheck.readers.peft_config.TRACED_PEFT_TYPES` (one home);
LoRA itself (and DoRA / rsLoRA) is :class:`fitcheck.spec.LoraSpec`, which the formulas model. A
:class:`PeftAdapterSpec` is estimated only by building the real peft model (``torch_adapters/peft_build.py``:
peft's own config class and ``get_peft_model``; ``torch_adapters/peft_adapters.py``: the tensors): its tensor
inventory (:class:`AdapterTensor`) is what the model states count, and the traced step is what the activations
are. Without torch (or with ``--no_trace``) the formulas cannot answer it and refuse it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fitcheck.spec.model import Dtype


@dataclass(frozen=True)
class AdapterTensor:
    """``repeat`` tensors of one shape that ``get_peft_model`` added (or made trainable) on the base model.

    Attributes:
        name: Parameter or buffer name in the peft model, layer indices as ``*``.
        shape: Shape of one tensor.
        dtype: Its torch dtype's name in the built model (peft's ``autocast_adapter_dtype`` upcast included;
            a buffer may be an integer one, OFT's ``int64`` indices).
        itemsize: Bytes per element.
        repeat: How many such tensors.
        trainable: ``requires_grad`` (gradients and optimizer states); False: a frozen parameter or a buffer
            (VeRA's shared random projections, BOFT's permutation matrices).
        in_base: A base model parameter peft made trainable in place (not a new tensor): counted once.
        buffer: A registered buffer, not a parameter (frozen; not in the parameter count).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    repeat: int = 1
    trainable: bool = True
    in_base: bool = False
    buffer: bool = False

    @property
    def numel_each(self) -> int:
        """Elements of one tensor."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of all ``repeat`` tensors."""
        return self.numel_each * self.repeat * self.itemsize

    @property
    def float_dtype(self) -> Dtype:
        """The dtype as fitcheck's :class:`Dtype` (a trainable tensor is always a floating one)."""
        return Dtype(self.dtype)


@dataclass(frozen=True)
class PeftAdapterSpec:
    """An ``adapter_config.json`` of a PEFT method other than LoRA.

    Attributes:
        peft_type: peft's ``PeftType`` value (``"IA3"``, ``"PROMPT_TUNING"``, ...).
        config_json: The adapter config as canonical JSON (sorted keys): what peft's config class is built from.
        source: Where it was read (the file), for messages.
        tensors: The tensors ``get_peft_model`` adds, from the built peft model; empty until built
            (``torch_adapters.peft_adapters.with_adapter_inventory``).
    """

    peft_type: str
    config_json: str
    source: str = "adapter_config.json"
    tensors: tuple[AdapterTensor, ...] = ()

    @property
    def config(self) -> dict[str, Any]:
        """The adapter config as a fresh dict."""
        loaded: dict[str, Any] = json.loads(self.config_json)
        return loaded

    @staticmethod
    def canonical(raw: Mapping[str, Any]) -> str:
        """``raw`` as the canonical JSON ``config_json`` holds (a live ``PeftConfig``'s sets, peft's
        ``target_modules`` after ``__post_init__``, as sorted lists; other non-JSON values as their ``str``)."""
        return json.dumps(dict(raw), sort_keys=True, default=_json_value)


def _json_value(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)
