"""Peak live-tensor bytes of real steps on a CPU, where ``torch.cuda.max_memory_allocated`` does not exist.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every ATen op's outputs; each storage is
counted once (views share their base's storage, as in the caching allocator) and uncounted when Python frees
it (``weakref.finalize`` on the storage). Tensors that exist before the mode starts (parameters, buffers,
optimizer states) are registered with :meth:`LiveTensorTracker.track`. The result is the CPU analogue of
``max_memory_allocated`` without the allocator's 512-byte rounding — the quantity ``fitcheck estimate
--device_type cpu`` predicts. Method from shared/design/04-measured-feasibility.md (a storage-deduplicating
dispatch mode reproduced real CPU steps to the byte).

The mode is entered and left explicitly (:meth:`start` / :meth:`stop`) so that a Trainer callback can span
several callback events; it must be stopped on the thread that started it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorTracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts live storage bytes and their peak.

    Attributes:
        current: Live bytes now (tracked storages only).
        peak: Largest ``current`` since the last :meth:`reset_peak`.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}  # id(storage object) -> bytes
        self._active = False

    def _add(self, tensor: Any) -> None:
        import torch

        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse / nested / subclasses without storage
            return
        key = id(storage)  # torch keeps one Python object per live storage (PyObject preservation)
        if key in self._live:
            return
        nbytes = int(storage.nbytes())
        self._live[key] = nbytes
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        with contextlib.suppress(TypeError):  # not weak-referenceable: stays counted (conservative)
            weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        nbytes = self._live.pop(key, 0)
        self.current -= nbytes

    def track(self, tensors: Iterable[Any]) -> None:
        """Register tensors created outside the mode (parameters, buffers, optimizer states)."""
        for t in tensors:
            self._add(t)

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes."""
        self.peak = self.current

    def start(self) -> LiveTensorTracker:
        """Enter the mode (idempotent)."""
        if not self._active:
            self.__enter__()  # type: ignore[no-untyped-call]
            self._active = True
        return self

    def stop(self) -> None:
        """Leave the mode (idempotent)."""
        if self._active:
            self._active = False
            self.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            self._add(leaf)
        return out


def _quant_state_tensors(state: Any, depth: int = 0) -> list[Any]:
    """bitsandbytes ``QuantState`` tensors (absmax, code, nested ``state2``): live, but not parameters/buffers."""
    import torch

    if state is None or depth > 2:
        return []
    out: list[Any] = []
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif type(value).__name__ == "QuantState":
            out.extend(_quant_state_tensors(value, depth + 1))
    return out


def model_state_tensors(model: Any, optimizer: Any = None) -> list[Any]:
    """Parameters, their gradients, buffers and optimizer state tensors of a model (for :meth:`track`)."""
    import torch

    out: list[Any] = []
    for p in model.parameters():
        out.append(p)
        if p.grad is not None:
            out.append(p.grad)
        out.extend(_quant_state_tensors(getattr(p, "quant_state", None)))
    out.extend(model.buffers())
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the torch one
    state = getattr(inner, "state", None)
    if isinstance(state, dict):
        for per_param in state.values():
            if isinstance(per_param, dict):
                out.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
    return out
