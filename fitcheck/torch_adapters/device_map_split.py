"""Per-GPU estimates of a multi-GPU ``device_map`` (naive model parallelism): the placement from
:func:`fitcheck.torch_adapters.device_map.predict_placement`, split by :mod:`fitcheck.advice.device_map_gpus`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.advice import GpuShare, device_of_map, gpu_shares
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.device_map import parse_max_memory, predict_placement


def multi_gpu_shares(
    spec: TrainingSpec, device_map: str, max_memory: str | Mapping[str, int] | None
) -> tuple[GpuShare, ...]:
    """One estimate per GPU when the predicted map spreads the model over several GPUs (else empty).

    Budgets: the per-GPU ``max_memory`` values the user gave, else the GPU's memory. Errors building the
    placement are reported by ``device_map_check``; here they mean no split (empty).
    """
    try:
        placement = predict_placement(spec, device_map, max_memory)
    except (ImportError, ValueError, KeyError, AttributeError, TypeError, RuntimeError):
        return ()
    given = parse_max_memory(max_memory)
    budgets = {k: v for k, v in given.items() if isinstance(k, int)}
    return gpu_shares(spec, device_of_map(placement.device_map), budgets)
