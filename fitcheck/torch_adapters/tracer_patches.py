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


def warm_bitsandbytes() -> None:
    """Build bitsandbytes' lookup tables on real tensors, outside fake mode (fix 3)."""
    import bitsandbytes.functional as bnbf

    if "dynamic" not in bnbf.name2qmap:  # the cache functional.quantize_blockwise fills on first use
        bnbf.name2qmap["dynamic"] = bnbf.create_dynamic_map().to("cpu")  # type: ignore[no-untyped-call]
    for name in ("nf4", "fp4"):
        bnbf.get_4bit_type(name, device="cpu")  # type: ignore[no-untyped-call]
