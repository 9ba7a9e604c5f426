"""Advice: what to change so that a run fits, each change with its own estimate.

Above the readers and the core: it turns a spec and its report into changed specs and estimates them again.

- :mod:`.advisor_changes`: the changes (levers) the advisor tries (micro-batch with accumulation,
  checkpointing, ZeRO/FSDP, offload, 8-bit optimizers, QLoRA, fused losses, more GPUs, ...), each a spec
  transform with the flags that describe it;
- :mod:`.advisor`: ranks the levers' estimates into :class:`Suggestion` rows;
- :mod:`.batch_search`: the largest micro-batch that fits, and keeping the global batch;
- :mod:`.device_map_gpus`: one estimate per GPU of a multi-GPU ``device_map`` (naive model parallelism);
- :mod:`.device_map_plan`: findings about ``device_map="auto"`` placements;
- :mod:`.series`: memory vs micro-batch and sequence length, for plots.

Where a new lever goes: a function in :mod:`.advisor_changes` returning
:class:`~fitcheck.advice.advisor_changes.Lever` rows.
"""

from fitcheck.advice.advisor import Suggestion, advise
from fitcheck.advice.advisor_changes import Tier
from fitcheck.advice.batch_search import (
    BatchPlan,
    keep_global_batch,
    max_micro_batch,
    plan_global_batch,
    with_micro_batch,
)
from fitcheck.advice.device_map_gpus import GpuShare, busiest, device_of_map, gpu_shares
from fitcheck.advice.device_map_plan import weights_only_finding
from fitcheck.advice.series import MAX_POINTS, Curve, EstimateFn, MemorySeries, memory_series

__all__ = [
    "MAX_POINTS",
    "BatchPlan",
    "Curve",
    "EstimateFn",
    "GpuShare",
    "MemorySeries",
    "Suggestion",
    "Tier",
    "advise",
    "busiest",
    "device_of_map",
    "gpu_shares",
    "keep_global_batch",
    "max_micro_batch",
    "memory_series",
    "plan_global_batch",
    "weights_only_finding",
    "with_micro_batch",
]
