"""The load phase: what ``from_pretrained`` and the preparation before step 1 allocate on the device.

- :mod:`.events`: the allocations and frees, in order (transformers' loader, bitsandbytes' quantize-on-load,
  peft's k-bit preparation);
- :mod:`.phase`: those events replayed through the caching allocator (``fitcheck.core.caching``): peak allocated,
  peak reserved, and the cache that stays reserved.
"""

from fitcheck.core.loading.events import (
    LoadEvent,
    load_events,
    load_order,
    natural_key,
    prepare_events,
    warmup_bytes,
)
from fitcheck.core.loading.phase import (
    SOURCE,
    LoadPhase,
    allocator_conf,
    load_component,
    load_findings,
    load_phase,
    loads_on_one_device,
    run_reserved,
)

__all__ = [
    "SOURCE",
    "LoadEvent",
    "LoadPhase",
    "allocator_conf",
    "load_component",
    "load_events",
    "load_findings",
    "load_order",
    "load_phase",
    "loads_on_one_device",
    "natural_key",
    "prepare_events",
    "run_reserved",
    "warmup_bytes",
]
