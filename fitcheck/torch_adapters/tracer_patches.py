"""Fixes for the places where HF code behaves differently on fake tensors than on real ones.

Each fix is proved by a fake-vs-real test in ``tests/test_tracer_fake_vs_real.py``: with the fix the traced
live-tensor peak of a tiny model equals the real CPU step's, without it the two differ (or building fails).

1. ``transformers.masking_utils.find_packed_sequence_indices`` treats a FakeTensor as "tracing"
   (``transformers/utils/import_utils.py::is_tracing``) and, unable to inspect the values, returns a packed-
   sequence index tensor. The mask builders then materialise a (b, 1, s, s) mask and the attention code
   repeat_kv-expands K/V, which a real run with unpacked ``position_ids`` never does (real: returns None).
   Fix: return None, which is what the real function returns for the unpacked inputs the tracer feeds.
   (Measured in design note 04: +8 % per layer at 8B without the fix.)
2. ``torch.nn.Module.to`` on fake parameters fails ("Couldn't swap ... has weakref") when peft moves a new
   adapter to its base layer's device. Fix: make ``Module.to`` a no-op while the model is built under fake
   mode (the fake tensors already sit on the one fake CPU device, in the dtype peft created them in).
3. bitsandbytes' ``create_dynamic_map`` / ``get_4bit_type`` call ``.tolist()`` / build real tables; they are
   computed once outside fake mode (``warm_bitsandbytes``) so that the cached tables are real tensors.
4. ``copy.deepcopy`` of a FakeTensor (peft 0.21.2 ``utils/other.py::ModulesToSaveWrapper.update`` deep-copies
   the head of a seq-cls / token-cls LoRA run, e.g. RoBERTa's ``classifier``) goes through torch 2.13
   ``_tensor.py::Tensor.__deepcopy__``, which reads ``data_ptr()`` of the fake tensor and then deep-copies its
   ``__dict__``, whose ``fake_mode`` entry is the whole FakeTensorMode (its dispatch caches hold tensors and
   C++ state). The copied mode corrupted the heap: the process died with a segfault or "corrupted
   double-linked list" at the next trace or at exit (RoBERTa-large seq-cls LoRA, ``--trace``). Fix
   (``fake_deepcopy``): a FakeTensor copies as ``Tensor.__deepcopy__``'s clone branch does, but the copy shares
   its FakeTensorMode (as torch's own ``fake_tensor.py::FakeCopyMode`` makes copies with ``fake_mode.from_tensor``)
   and no data pointer is read.
5. torch 2.13 ``nn/init.py::_no_grad_trunc_normal_`` samples by rejection (``.item()`` of the bounds,
   ``mask.any()``), which fake tensors cannot answer (``DataDependentOutputException``); transformers 5.23 calls
   it through ``initialization.TORCH_INIT_FUNCTIONS["trunc_normal_"]`` to initialise SigLIP's weights (the
   vision tower of Gemma-3 image-text models). Fix (``fake_trunc_normal``): an in-place ``normal_`` while the
   model is built under fake mode: same tensor, shape and dtype; values mean nothing on fake tensors.

Not a fake-tensor fix but an import made cheaper (``bitsandbytes_uncompiled``): bitsandbytes 0.50.2
``backends/default/ops.py`` wraps four of its default (device-generic) kernels in ``_try_torch_compile`` at
import time, and torch 2.13 ``torch.compile`` -> ``_dynamo/eval_frame.py::_optimize`` looks up the inductor
backend and its config (``get_compiler_fn``, ``get_compiler_config``: ``torch._inductor.compile_fx`` and what it
imports) before anything is compiled. In a cProfile of a cold Qwen3-8B QLoRA report that was 25.6 of 199
profiled seconds; measured, the cold traced answer's CPU time went 18.4 -> 15.6 s (median of 3 fresh processes,
2026-11-27, ``benchmarks/default_path_speed.py`` cases). A fake-tensor trace never runs those kernels
(bitsandbytes registers fake kernels for its ops, ``bitsandbytes/_ops.py``), and peft 0.21.2 imports bitsandbytes
whenever it is installed (``helpers.py``), so every LoRA trace paid the lookup too. A trace on fake tensors
imports bitsandbytes first with ``TORCHDYNAMO_DISABLE=1`` (read at each call of ``_optimize``, which then
returns ``_NullDecorator``: the function itself), so those four kernels stay eager in this process, as
bitsandbytes' own fallback leaves them when ``torch.compile`` raises. Nothing changes when bitsandbytes is
already imported (a training process that loaded a quantized model). A real CPU step later in the same process
runs them eagerly: ``tests/test_tracer_qlora.py``'s fake == real checks give the same bytes that way.

Not a fake-tensor fix but a kernel choice (``cuda_dropout``): a trace describes a CUDA run unless the spec says
``device_type cpu``, and dropout is one op whose CPU and CUDA kernels keep different tensors. torch 2.13
``aten/src/ATen/native/Dropout.cpp`` ``dropout``: when ``is_fused_kernel_acceptable`` (a CUDA/XPU/privateuse1
input, 0 < p < 1) it is ``native_dropout``, whose backward keeps a 1-byte bool mask; otherwise (CPU) it is
``bernoulli_`` noise multiplied in, which keeps the noise in the input's dtype (4 bytes for peft's fp32 adapter
input). Measured on an H100 (benchmarks/data/gpu_truth_nvidia_h100_80gb_hbm3.json, Llama-3.2-1B LoRA all-linear,
dropout 0.05, 4 x 2048): the CPU-kernel trace answered 38.36 GiB against 31.00 GiB measured (+23.7 %).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """Make transformers see unpacked sequences under fake tensors, as it does on real ones (fix 1)."""
    import transformers.masking_utils as mu

    original = mu.find_packed_sequence_indices

    def _unpacked(position_ids: Any) -> None:
        # Real behaviour for position_ids = arange(s) per row: no packed sequence (masking_utils.py).
        return None

    mu.find_packed_sequence_indices = _unpacked
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = original


@contextlib.contextmanager
def module_to_is_noop() -> Iterator[None]:
    """Make ``nn.Module.to`` return the module unchanged (fix 2); only for building under fake mode."""
    import torch

    original = torch.nn.Module.to

    def _to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        return self

    torch.nn.Module.to = _to  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]


def bitsandbytes_uncompiled() -> None:
    """Import bitsandbytes (where installed and not imported yet) without ``torch.compile``'s backend lookup (see
    the module docstring); the tracer calls it before a fake-tensor trace imports peft or bitsandbytes."""
    import importlib.util
    import os
    import sys

    if "bitsandbytes" in sys.modules or importlib.util.find_spec("bitsandbytes") is None:
        return
    import torch._dynamo  # noqa: F401  (imported anyway: transformers' masking_utils imports it)

    saved = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        importlib.import_module("bitsandbytes")
    finally:
        if saved is None:
            del os.environ["TORCHDYNAMO_DISABLE"]
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = saved


def warm_bitsandbytes() -> None:
    """Build bitsandbytes' lookup tables on real tensors, outside fake mode (fix 3)."""
    bitsandbytes_uncompiled()
    import bitsandbytes.functional as bnbf

    if "dynamic" not in bnbf.name2qmap:  # the cache functional.quantize_blockwise fills on first use
        bnbf.name2qmap["dynamic"] = bnbf.create_dynamic_map().to("cpu")  # type: ignore[no-untyped-call]
    for name in ("nf4", "fp4"):
        bnbf.get_4bit_type(name, device="cpu")  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def fake_deepcopy() -> Iterator[None]:
    """Deep-copy a FakeTensor without copying its FakeTensorMode or reading its data pointer (fix 4)."""
    import copy

    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    def _deepcopy(self: Any, memo: dict[int, Any]) -> Any:
        if id(self) in memo:
            return memo[id(self)]
        memo.setdefault(id(self.fake_mode), self.fake_mode)  # the copy lives in the same fake mode
        with torch.no_grad():  # torch/_tensor.py Tensor.__deepcopy__, the branch of a storage-less subclass
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        new.__dict__ = copy.deepcopy(self.__dict__, memo)  # _is_param, the fake device; fake_mode is shared
        memo[id(self)] = new
        return new

    had = "__deepcopy__" in FakeTensor.__dict__
    original = FakeTensor.__dict__.get("__deepcopy__")
    FakeTensor.__deepcopy__ = _deepcopy  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            FakeTensor.__deepcopy__ = original  # type: ignore[assignment,method-assign]
        else:
            del FakeTensor.__deepcopy__


@contextlib.contextmanager
def fake_trunc_normal() -> Iterator[None]:
    """Initialise weights with ``normal_`` instead of rejection-sampled ``trunc_normal_`` (fix 5)."""
    import transformers.initialization as hf_init

    table = hf_init.TORCH_INIT_FUNCTIONS
    original = table["trunc_normal_"]

    def _trunc_normal(tensor: Any, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                      generator: Any = None) -> Any:
        return tensor.normal_(mean, std, generator=generator)

    table["trunc_normal_"] = _trunc_normal
    try:
        yield
    finally:
        table["trunc_normal_"] = original


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """Trace dropout as CUDA runs it: ``torch.native_dropout`` (a bool mask kept for backward), as torch 2.13
    ``Dropout.cpp`` ``dropout`` dispatches for CUDA inputs with 0 < p < 1 (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    original = F.dropout

    def _dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    F.dropout = _dropout
    try:
        yield
    finally:
        F.dropout = original

