"""The load phase: ``from_pretrained`` (and peft's k-bit preparation) replayed through the caching allocator.

The events (:mod:`.events`) drive :class:`fitcheck.core.caching.CachingAllocator` with the run's allocator
settings. What comes out:

* the peak allocated while loading (a 4-bit model quantized on load holds one 16-bit weight at a time on top of
  what is already quantized),
* what stays reserved after loading: the freed 16-bit weights stay in the allocator's cache (torch returns cached
  memory only on ``empty_cache`` or when a ``cudaMalloc`` fails, ``CUDACachingAllocator.cpp`` ``malloc``),
* the part of that cache that no later allocation can release: free blocks inside segments that also hold live
  weights (``inactive_split_bytes``, reported); the unsplit cached segments are released when the step needs the
  room (``release_cached_blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.caching import AllocatorConf, CachingAllocator, OutOfMemory, parse_alloc_conf
from fitcheck.core.loading.events import LoadEvent, load_events, prepare_events
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import DeviceType, Strategy, TrainingSpec
from fitcheck.units import format_bytes

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
        oversize_cached: Cached free blocks of at least ``max_split_size_mb`` when loading ends
            (``CachingAllocator.oversize_cached_bytes``: ``caching_allocator_warmup``'s block, which no smaller
            weight may take): the step's tensors cannot take them either (unless within
            ``max_non_split_rounding_mb`` of their size), so they stay reserved beside the step's segments until
            a ``cudaMalloc`` fails.
    """

    peak_allocated: int
    peak_reserved: int
    end_allocated: int
    end_reserved: int
    stuck: int
    detail: str
    oversize_cached: int = 0


def allocator_conf(spec: TrainingSpec) -> AllocatorConf:
    """The run's caching-allocator settings (``HardwareSpec.cuda_alloc_conf``, or the expandable-segments flag)."""
    text = spec.hardware.cuda_alloc_conf
    conf = parse_alloc_conf(text) if text else AllocatorConf()
    if spec.hardware.expandable_segments and not conf.expandable_segments:
        conf = parse_alloc_conf(",".join(filter(None, (text, "expandable_segments:True"))))
    return conf


def loads_on_one_device(spec: TrainingSpec) -> bool:
    """Whether the whole model is loaded onto the (each) GPU: one device or plain data parallel, on CUDA; and
    DeepSpeed over a bitsandbytes base, which every rank loads and quantizes whole on its own GPU before
    ``deepspeed.initialize`` partitions (ZeRO-3) or keeps it (ZeRO-0/1/2): transformers 5.23 ``modeling_utils.py``
    ``get_init_context`` enters ``deepspeed.zero.Init`` only ``if not is_quantized`` (a quantized model is built on
    the meta device), and ``quantizers/quantizer_bnb_4bit.py`` / ``quantizer_bnb_8bit.py`` ``update_device_map``
    give ``device_map = {"": torch.cuda.current_device()}`` when none is passed (``quantizers/auto.py``
    ``get_hf_quantizer``; ``core/states/zero3_quant.py``). Recorded on the real libraries at tiny size:
    ``benchmarks/data/deepspeed_zero3_quant_load_cpu.json`` (a plain model partitioned at load, an nf4 one whole).
    deepspeed 0.19.8 calls no ``empty_cache`` in ``initialize`` (``stage3.py``: only ``offload_states``; ``engine.py``:
    only ``empty_partition_cache``), so the load's blocks stay reserved into training."""
    if spec.hardware.device_type is not DeviceType.CUDA or spec.sharding.parallelism is not None:
        return False
    if spec.sharding.strategy is Strategy.DEEPSPEED:
        return spec.quant is not None and spec.quant.method == "bitsandbytes"
    return spec.sharding.strategy is not Strategy.FSDP


def _replay(alloc: CachingAllocator, events: list[LoadEvent]) -> None:
    for ev in events:
        if ev.kind == "alloc":
            alloc.malloc(ev.handle, ev.nbytes)
        else:
            alloc.free(ev.handle)


# The replay reads only these parts of a spec (``load_events``, ``prepare_events``, ``allocator_conf``); the advisor
# and the micro-batch search estimate 100+ candidates that share them, so one replay answers them all.
_MEMO: dict[tuple[object, ...], LoadPhase] = {}
_MEMO_LIMIT = 64


def load_phase(spec: TrainingSpec, capacity: int | None = None) -> LoadPhase | None:
    """Replay ``from_pretrained`` and peft's preparation through the caching allocator.

    Args:
        spec: The training spec.
        capacity: Bytes torch's allocator can get (the GPU less what lives outside it). Near it, the allocator
            releases its unsplit cached segments and retries (``release_cached_blocks``), as on the GPU; a load
            that does not fit even then is replayed without the limit, so its need shows.

    Returns:
        The load phase's peaks and what it leaves reserved; None where the model is not loaded whole onto one
        GPU (FSDP, DeepSpeed, tp/cp/sp layouts, CPU runs: their own rules apply).
    """
    if not loads_on_one_device(spec):
        return None
    key = (spec.model, spec.quant, spec.precision.load_dtype, spec.hardware.cuda_alloc_conf,
           spec.hardware.expandable_segments, capacity)
    try:
        hit = _MEMO.get(key)
    except TypeError:  # a pre-quantized checkpoint's quantization_config keeps dicts: replay without the memo
        return _load_phase(spec, capacity)
    if hit is None:
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        hit = _MEMO[key] = _load_phase(spec, capacity)
    return hit


def _load_phase(spec: TrainingSpec, capacity: int | None) -> LoadPhase:
    events = load_events(spec, capacity)
    prep = prepare_events(spec, events)
    alloc = CachingAllocator(allocator_conf(spec), capacity)
    try:
        _replay(alloc, events)
        _replay(alloc, prep)
    except OutOfMemory:
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
                     how, alloc.oversize_cached_bytes())


def load_component(lp: LoadPhase) -> Component:
    """The load phase as a component of ``Phase.LOAD``: the allocated peak while loading and preparing."""
    cached = lp.end_reserved - lp.end_allocated
    return Component(
        "load.from_pretrained", Category.WEIGHTS, Location.DEVICE, {Phase.LOAD: lp.peak_allocated}, SOURCE,
        f"{lp.detail}; peak {format_bytes(lp.peak_allocated)} allocated / {format_bytes(lp.peak_reserved)} "
        f"reserved; {format_bytes(cached)} stays cached after loading, {format_bytes(lp.stuck)} of it in "
        "segments that hold weights",
    )


def run_reserved(step_reserved: int, lp: LoadPhase | None, released: bool = False) -> int:
    """``max_memory_reserved`` over the run: the larger of the load's peak and the step's.

    Reserved memory only grows between ``empty_cache`` calls, so the load's peak stays in
    ``max_memory_reserved``. The step's own figure is not raised by the load's ordinary cache: the unsplit cached
    segments are reused or released when a ``cudaMalloc`` fails (``release_cached_blocks``), and the free blocks
    left inside segments that hold weights (``LoadPhase.stuck``, reported in the component's detail) take step
    tensors of their size (best fit), which the step's allocated peak already counts. The oversize blocks
    ``max_split_size_mb`` leaves cached (``LoadPhase.oversize_cached``) are neither reused nor released while
    every ``cudaMalloc`` succeeds: they add to the step's figure (H200, Llama-3.2-1B with
    ``max_split_size_mb:128``: the 2358 MiB warm-up block stayed reserved through the steps).

    Args:
        step_reserved: The step's reserved bytes on a fresh allocator.
        lp: The load phase (None: no load phase modelled).
        released: Above the GPU, a failed ``cudaMalloc`` returns the oversize blocks first
            (``release_available_cached_blocks``): they do not add.

    Returns:
        Peak reserved bytes of the run.
    """
    if lp is None:
        return step_reserved
    return max(lp.peak_reserved, step_reserved + (0 if released else lp.oversize_cached))


def load_findings(lp: LoadPhase | None, step_reserved: int) -> tuple[Finding, ...]:
    """A finding when loading reserves more than the training step (the run's peak is before step 1)."""
    if lp is None or lp.peak_reserved <= step_reserved:
        return ()
    return (
        Finding(
            "load-peak",
            Severity.INFO,
            f"loading reserves {format_bytes(lp.peak_reserved)} ({format_bytes(lp.peak_allocated)} allocated at "
            f"its peak), more than the training step's {format_bytes(step_reserved)}: {lp.detail}; "
            "torch.cuda.max_memory_reserved and nvidia-smi show the load's figure",
            "call torch.cuda.empty_cache() after loading to return the cached blocks before training",
        ),
    )
