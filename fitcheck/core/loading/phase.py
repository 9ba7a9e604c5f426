"""The load phase: ``from_pretrained`` (and peft's k-bit preparation) replayed through the caching allocator.

The events (:mod:`.events`) drive :class:`fitcheck.core.caching.CachingAllocator` with the run's allocator
settings. What comes out:

* the peak allocated while loading (a 4-bit model quantized on load holds one 16-bit weight at a time on top of
  what is already quantized),
* what stays reserved after loading: the freed 16-bit weights stay in the allocator's cache (torch returns cached
  memory only on ``empty_cache`` or when a ``cudaMalloc`` fails, ``CUDACachingAllocator.cpp`` ``malloc``),
* the part of that cache that no later allocation can release: free blocks inside segments that also hold live
  weights (``inactive_split_bytes``); the unsplit cached segments are released when the step needs the room
  (``release_cached_blocks``), so only the split part adds to the step's reserved memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.caching import AllocatorConf, CachingAllocator, parse_alloc_conf
from fitcheck.core.loading.events import LoadEvent, load_events, prepare_events
from fitcheck.spec import DeviceType, Strategy, TrainingSpec

SOURCE = (
    "transformers 5.23 core_model_loading.py convert_and_load_state_dict_in_model + integrations/bitsandbytes.py; "
    "bitsandbytes 0.50.2 Params4bit/Int8Params._quantize; peft 0.21.2 prepare_model_for_kbit_training; replayed "
    "through torch's CUDACachingAllocator.cpp rules (fitcheck.core.caching)"
)


@dataclass(frozen=True)
class LoadPhase:
    """Memory on the device while the model is loaded and prepared, before step 1.

    Attributes:
        peak_allocated: ``max_memory_allocated`` during loading and preparation.
        peak_reserved: ``max_memory_reserved`` during loading and preparation.
        end_allocated: Allocated when preparation ends (the resident base weights).
        end_reserved: Reserved when preparation ends (what nvidia-smi shows before step 1, less the context).
        stuck: Cached free bytes in segments that also hold weights (``inactive_split_bytes``): they stay
            reserved through training.
        detail: How it was counted.
    """

    peak_allocated: int
    peak_reserved: int
    end_allocated: int
    end_reserved: int
    stuck: int
    detail: str


def allocator_conf(spec: TrainingSpec) -> AllocatorConf:
    """The run's caching-allocator settings (``HardwareSpec.cuda_alloc_conf``, or the expandable-segments flag)."""
    text = spec.hardware.cuda_alloc_conf
    conf = parse_alloc_conf(text) if text else AllocatorConf()
    if spec.hardware.expandable_segments and not conf.expandable_segments:
        conf = parse_alloc_conf(",".join(filter(None, (text, "expandable_segments:True"))))
    return conf


def loads_on_one_device(spec: TrainingSpec) -> bool:
    """Whether the whole model is loaded onto the (each) GPU: one device or plain data parallel, on CUDA."""
    return (
        spec.hardware.device_type is DeviceType.CUDA
        and spec.sharding.strategy not in (Strategy.FSDP, Strategy.DEEPSPEED)
        and spec.sharding.parallelism is None
    )


def _replay(alloc: CachingAllocator, events: list[LoadEvent]) -> None:
    for ev in events:
        if ev.kind == "alloc":
            alloc.malloc(ev.handle, ev.nbytes)
        else:
            alloc.free(ev.handle)


def load_phase(spec: TrainingSpec) -> LoadPhase | None:
    """Replay ``from_pretrained`` and peft's preparation through the caching allocator.

    Args:
        spec: The training spec.

    Returns:
        The load phase's peaks and what it leaves reserved; None where the model is not loaded whole onto one
        GPU (FSDP, DeepSpeed, tp/cp/sp layouts, CPU runs: their own rules apply).
    """
    if not loads_on_one_device(spec):
        return None
    events = load_events(spec)
    prep = prepare_events(spec, events)
    alloc = CachingAllocator(allocator_conf(spec))
    _replay(alloc, events)
    _replay(alloc, prep)
    s = alloc.stats
    q = spec.quant
    how = "parameters materialised in their resident dtype"
    if q is not None and q.method == "bitsandbytes" and not q.pre_quantized:
        how = (f"{q.bits}-bit quantized on load: each weight materialised in {spec.precision.load_dtype.value}, "
               "quantized, the copy freed (its blocks stay cached)")
    if prep:
        how += "; prepare_model_for_kbit_training's fp32 copies"
    return LoadPhase(s.peak_allocated, s.peak_reserved, s.allocated, s.reserved, alloc.inactive_split_bytes(),
                     how)
