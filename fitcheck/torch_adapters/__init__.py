"""Adapters that need torch: around the pure core, never inside it. Imported lazily (PEP 562).

- :mod:`.meta_inventory`: any transformers architecture built on the meta device -> ``ModelInventory``;
- :mod:`.tracer` (+ ``tracer_build``, ``tracer_patches``, ``tracer_quant``, ``tracer_recorder``): one
  training step under ``FakeTensorMode``, read as activation components;
- :mod:`.live_model`: facts of a loaded model (dtypes, adapters, quantized layers, device map);
- :mod:`.live_tracker`: live-tensor peak of a real step (a dispatch mode);
- :mod:`.device_map`, :mod:`.device_map_check`: accelerate's ``infer_auto_device_map`` and its findings;
  :mod:`.device_map_split`: one estimate per GPU of a multi-GPU map (naive model parallelism).

Importing this package imports no torch; each name imports its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fitcheck.torch_adapters.device_map_check import device_map_findings
    from fitcheck.torch_adapters.device_map_split import multi_gpu_shares
    from fitcheck.torch_adapters.live_model import (
        config_mapping,
        inspect_model,
        live_device_map_findings,
        unwrap_model,
    )
    from fitcheck.torch_adapters.live_tracker import LiveTensorTracker, model_state_tensors
    from fitcheck.torch_adapters.meta_device import meta_inventory
    from fitcheck.torch_adapters.pinned_path import PinnedPath
    from fitcheck.torch_adapters.tracer import trace_components

_WHERE = {
    "device_map_findings": "device_map_check",
    "multi_gpu_shares": "device_map_split",
    "config_mapping": "live_model",
    "inspect_model": "live_model",
    "live_device_map_findings": "live_model",
    "unwrap_model": "live_model",
    "LiveTensorTracker": "live_tracker",
    "model_state_tensors": "live_tracker",
    "meta_inventory": "meta_device",
    "PinnedPath": "pinned_path",
    "trace_components": "tracer",
}

__all__ = [
    "LiveTensorTracker",
    "PinnedPath",
    "config_mapping",
    "device_map_findings",
    "inspect_model",
    "live_device_map_findings",
    "meta_inventory",
    "model_state_tensors",
    "multi_gpu_shares",
    "trace_components",
    "unwrap_model",
]


def __getattr__(name: str) -> Any:
    """Import the adapter module that defines ``name`` on first use."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"fitcheck.torch_adapters.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'fitcheck.torch_adapters' has no attribute {name!r}")
