"""torch's CUDA caching allocator, replayed: what ``max_memory_reserved`` holds for a sequence of allocations.

- :mod:`.conf`: ``PYTORCH_CUDA_ALLOC_CONF`` parsed from a string the caller passes in (torch's ``AllocatorConfig``);
- :mod:`.simulator`: the allocator's pools, rounding, best-fit, splitting, merging and releasing (torch's
  ``CUDACachingAllocator.cpp``), driven by ``(alloc, free)`` events; :mod:`.blocks` its blocks and pools;
  :mod:`.expandable` expandable segments (pages mapped and unmapped anywhere in one segment per pool).

Pure: no torch, no environment.
"""

from fitcheck.core.caching.conf import AllocatorConf, AllocConfError, parse_alloc_conf
from fitcheck.core.caching.simulator import (
    AllocatorStats,
    CachingAllocator,
    OutOfMemory,
    allocation_size,
    replay,
    round_size,
)

__all__ = [
    "AllocConfError",
    "AllocatorConf",
    "AllocatorStats",
    "CachingAllocator",
    "OutOfMemory",
    "allocation_size",
    "parse_alloc_conf",
    "replay",
    "round_size",
]
