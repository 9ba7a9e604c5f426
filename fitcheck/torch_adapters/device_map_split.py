"""Per-GPU estimates of a multi-GPU ``device_map`` (naive model parallelism): the placement from
:func:`fitcheck.torch_adapters.device_map.predict_placement`, split by :mod:`fitcheck.advice.device_map_gpus`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.advice import GpuShare, device_of_map, gpu_shares
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.device_map import predict_placement


def multi_gpu_shares(
    spec: TrainingSpec, device_map: str, max_memory: str | Mapping[str, int] | None
) -> tuple[GpuShare, ...]:
    """One estimate per GPU when the predicted map spreads the model over several GPUs (else empty).

    Budgets: each GPU's memory (the card), as on one GPU. ``max_memory`` only bounds where accelerate places
    the weights (accelerate 1.15 utils/modeling.py ``infer_auto_device_map`` fills each device up to it with
    parameters); the activations, gradients and optimizer states of the step may use the rest of the card.
    Errors building the placement are reported by ``device_map_check``; here they mean no split (empty).
    """
    try:
        placement = predict_placement(spec, device_map, max_memory)
    except (ImportError, ValueError, KeyError, AttributeError, TypeError, RuntimeError):
        return ()
    return gpu_shares(spec, device_of_map(placement.device_map), {})
