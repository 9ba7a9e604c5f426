"""The caching allocator: what ``max_memory_reserved`` adds to ``max_memory_allocated``.

Block and segment rounding from torch 2.13 ``c10/core/AllocatorConfig.h`` and
``c10/cuda/CUDACachingAllocator.cpp``; the free-block gap as a fraction of the bytes allocated and freed within
each step (:data:`FRAGMENTATION_OF_TRANSIENT`, with what it rests on). On ``device_type cpu`` reserved ==
allocated.

Pure: no torch import, no environment reads. The allocator setting comes in through
``HardwareSpec.expandable_segments``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fitcheck.core.step import collect_components, transient_at_peak
from fitcheck.findings import Finding, Severity
from fitcheck.report import Phase
from fitcheck.spec import DeviceType, OffloadDevice, TrainingSpec
from fitcheck.units import format_bytes

KIB = 1024
MIB = 1024**2

# --- caching allocator constants: torch 2.13 c10/core/AllocatorConfig.h ----------------------------
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
K_SMALL_SIZE = 1 * MIB  # kSmallSize: largest "small" allocation (small pool)
K_SMALL_BUFFER = 2 * MIB  # kSmallBuffer: small allocations are packed in 2 MiB segments
K_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: 1-10 MiB requests share 20 MiB segments
K_LARGE_BUFFER = 20 * MIB  # large_segment_size_ default (kLargeBuffer): 20 MiB segments, also the page size
#                            an expandable segment grows by (AllocatorConfig.h large_segment_size_)
K_ROUND_LARGE = 2 * MIB  # kRoundLarge: segments for requests >= 10 MiB are rounded up to 2 MiB

# --- fragmentation: what the reserved-vs-allocated gap rests on ------------------------------------
# Persistent tensors (weights, optimizer states) are allocated once at fixed sizes and are not fragmented:
# torchtune's QLoRA tutorial measured 13.96 GB allocated vs 13.98 GB reserved right after loading a bf16
# Llama-2-7B (calibration row TTQ-1 notes: +0.14%); torchtune PR #961 measured "20.2 GB peak allocated (and
# similar reserved)" for a full fine-tune with optimizer-in-backward (row TT2-4 notes).
# Tensors freed and re-allocated within every step (activations, logits, temporaries, gradients under
# zero_grad(set_to_none=True)) leave free blocks in segments that later, differently sized requests cannot use
# (PyTorch docs, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF", expandable_segments).
# Published whole-step pairs of peak allocated -> peak reserved: pytorch/pytorch#40989 15006 -> 16726 MB
# (+11.5%) and 17402 -> 19354 MB (+11.2%); ecmwf/WeatherGenerator PR #2628 15.10 -> 17.35 GiB (+14.9%);
# GMLake (Guo et al., ASPLOS 2024) reports the allocator's fragmentation on LLM fine-tuning reduced by 15% on
# average (up to 33%) by defragmentation. Since the persistent part barely fragments, the whole-step ratios
# bound the transient part's ratio from below; we take the smallest of them, applied to transient bytes only.
# Not fitted to benchmarks/published.py (that benchmark reports how it does).
FRAGMENTATION_OF_TRANSIENT = 0.11

# --- what reserved measured on a GPU, where the model above is known to be low ----------------------------
# max_memory_reserved / max_memory_allocated of our own H100 runs (torch 2.11.0+cu130, expandable segments off),
# by the regimes where fitcheck's reserved was under the measurement. Not used for the number: a warning when a
# run "fits" by the model but would not at the measured ratio (reserved_risk_findings).
MEASURED_RESERVED_RATIO: dict[str, tuple[float, str]] = {
    "gradient checkpointing": (
        1.258, "H100, Llama-3.2-1B: full fine-tune 8 x 2048 1.258, QLoRA nf4 4 x 2048 1.228 "
        "(benchmarks/data/gpu_truth_nvidia_h100_80gb_hbm3.json)"),
    # FSDP2's side-stream pools are modelled (core/states/fsdp_streams.py) and its traced run replayed
    # (torch_adapters/fsdp2_run_events.py: FSDP2 -0.1 % / +0.6 % with checkpointing on these rows); FSDP1 stays
    # under by 5 %
    "FSDP1": (
        1.300, "H100, 1 GPU, Llama-3.2-1B, bf16 mixed precision, FSDP1 (NO_SHARD at one process) "
        "(benchmarks/data/fsdp_gpu_nvidia_h100_80gb_hbm3.json)"),
}


@dataclass(frozen=True)
class ReplayedGap:
    """What a replay of the run through the caching allocator (``fitcheck.core.caching``, driven by
    ``fitcheck.torch_adapters.allocator_replay``) measured, as the estimate takes it.

    Attributes:
        fraction: The replay's gap over its transient bytes at its allocated peak:
            ``(peak_reserved - peak_allocated) / (peak_allocated - persistent)``; applied to the estimate's own
            transient bytes at each phase (:func:`phase_reserved`).
        reserved: The replay's own ``max_memory_reserved`` in bytes (its default stream: DeepSpeed's and FSDP's side
            streams are :class:`~fitcheck.core.states.SidePools`, added by the estimator), where the replayed run is
            the answered run itself: this rank's, at this micro-batch, every layer. 0 where the replay stands in for
            it (two layer groups; the plain run of an FSDP spec its rewrites decline; a replay reused for another
            micro-batch or optimizer): only ``fraction`` carries over.
    """

    fraction: float
    reserved: int = 0


def phase_reserved(spec: TrainingSpec, totals: Mapping[Phase, int], transients: Mapping[Phase, int],
                   replayed: ReplayedGap | None = None) -> dict[Phase, int]:
    """The default stream's reserved bytes at each phase of the step: the one rule for formula and replayed gaps.

    At a phase, :func:`reserved_bytes` of its allocated bytes and its transient bytes (the published
    :data:`FRAGMENTATION_OF_TRANSIENT`, or the replay's ``fraction``), and never below what the replay itself held
    (``replayed.reserved``): a block freed stays cached (``CUDACachingAllocator.cpp`` ``free_block`` returns it to
    its pool; only ``release_cached_blocks``, on a failed ``cudaMalloc`` or ``empty_cache``, gives segments back), so
    reserved does not fall within a run, and the step's reserved is the largest phase's. A formula change that moves
    the allocated peak to a phase with fewer transient bytes cannot lower it below a phase's reserved, nor below the
    bytes the replay measured.

    Args:
        spec: The training spec (its rank-local view).
        totals: Allocated bytes per phase of the step (phases with none are left out).
        transients: Transient bytes per phase (:func:`fitcheck.core.step.transient_bytes_at`).
        replayed: What the run's replay measured; None: the published fraction.

    Returns:
        Reserved bytes per phase with allocated bytes.
    """
    fraction = None if replayed is None else replayed.fraction
    floor = 0 if replayed is None or spec.hardware.device_type is DeviceType.CPU else replayed.reserved
    return {p: max(reserved_bytes(spec, n, transient_bytes=transients.get(p, 0), gap_fraction=fraction), floor)
            for p, n in totals.items() if n > 0}


def reserved_risk_findings(spec: TrainingSpec, peak_allocated: int, peak_reserved: int, outside: int,
                           budget: int) -> tuple[Finding, ...]:
    """A warning when a run fits by the allocator model but not at the reserved ratio measured for its regime.

    Args:
        spec: The training spec.
        peak_allocated: The estimate's peak allocated bytes.
        peak_reserved: The estimate's peak reserved bytes.
        outside: Device bytes outside the allocator (CUDA context).
        budget: The GPU's usable bytes.

    Returns:
        ``reserved-measured-higher`` (warning), or nothing.
    """
    if spec.hardware.device_type is DeviceType.CPU or spec.hardware.expandable_segments:
        return ()
    regimes = [r for r, on in (("gradient checkpointing", spec.activations.checkpointing),
                               ("FSDP1", spec.sharding.fsdp is not None and spec.sharding.fsdp.version == 1))
               if on]
    if not regimes or peak_reserved + outside > budget:
        return ()
    regime = max(regimes, key=lambda r: MEASURED_RESERVED_RATIO[r][0])
    ratio, where = MEASURED_RESERVED_RATIO[regime]
    at_ratio = int(peak_allocated * ratio)
    if at_ratio <= peak_reserved or at_ratio + outside <= budget:
        return ()
    return (
        Finding(
            "reserved-measured-higher",
            Severity.WARNING,
            f"fits by fitcheck's allocator model (reserved {format_bytes(peak_reserved)}), but runs with {regime} "
            f"measured reserved at {ratio:.3f} x allocated ({where}); at that ratio this run needs "
            f"{format_bytes(at_ratio + outside)} of {format_bytes(budget)}",
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch environment (reserved then stays "
            "within a 20 MiB page of allocated), or leave that much headroom (a smaller micro-batch)"
            + (", or estimate again with --reserved_replay (this run's whole step replayed through the allocator; "
               "needs torch; a traced answer has replayed it already)" if regime == "gradient checkpointing"
               else ""),
        ),
    )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plus_side_pools(reserved: int, side_bytes: int) -> int:
    """``reserved`` plus what other streams' pools keep cached (FSDP's side streams), in 2 MiB segments."""
    return reserved if side_bytes <= 0 else _round_up(reserved + side_bytes, K_ROUND_LARGE)


def block_bytes(request: int) -> int:
    """Bytes the caching allocator charges one request (``round_size``: multiple of 512 B).

    Args:
        request: Bytes asked for.

    Returns:
        The block size, counted by ``max_memory_allocated``.
    """
    return max(K_MIN_BLOCK_SIZE, _round_up(request, K_MIN_BLOCK_SIZE))


def segment_bytes(request: int) -> int:
    """Size of the segment ``cudaMalloc``'ed when no cached block fits (``get_allocation_size``).

    Args:
        request: Bytes asked for.

    Returns:
        2 MiB for small requests (<= 1 MiB), 20 MiB for 1-10 MiB, else the request rounded up to 2 MiB.
    """
    if request <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if request < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return _round_up(request, K_ROUND_LARGE)


def reserved_bytes(
    spec: TrainingSpec, peak_allocated: int, *, transient_bytes: int | None = None, gap_fraction: float | None = None
) -> int:
    """``max_memory_reserved`` at the peak: allocated + the allocator's cached free blocks.

    Model (see the constants above for what each number rests on):
    reserved = round_up(peak_allocated + FRAGMENTATION_OF_TRANSIENT x transient, 2 MiB). With expandable
    segments and a replayed ``gap_fraction`` (the replay ran with ``expandable_segments:True``:
    ``core/caching`` maps pages onto one segment per pool, splits every block and keeps the free holes inside it
    mapped, ``CUDACachingAllocator.cpp`` ``should_split`` / ``free_block``) the same sum; the holes are real: the
    H200's Llama-3.2-1B bf16 4 x 1024 step with ``expandable_segments:True`` reserved 1086 MiB above allocated
    (``benchmarks/data/gpu_truth_nvidia_h200.json``), the replay 1090 MiB. Without a replay (the formulas),
    reserved is allocated rounded up to the 20 MiB page an expandable segment grows by: a lower bound.
    On ``device_type cpu``, reserved == allocated.

    Args:
        spec: The training spec.
        peak_allocated: Peak bytes in the allocator (``max_memory_allocated``).
        transient_bytes: Part of ``peak_allocated`` allocated and freed within each step (from
            :func:`transient_bytes_at` on the estimate's components at the peak phase). None: computed here
            from the spec's components (:func:`fitcheck.core.step.collect_components`, formula path).
        gap_fraction: The allocator's gap over the transient bytes, replayed from the traced step's own
            allocation sequence through torch's allocator rules (``fitcheck.torch_adapters.allocator_replay``);
            None: :data:`FRAGMENTATION_OF_TRANSIENT` (no trace).

    Returns:
        Peak reserved bytes (>= peak_allocated).
    """
    if peak_allocated < 0:
        raise ValueError(f"peak_allocated must be >= 0, got {peak_allocated}")
    if spec.hardware.device_type is DeviceType.CPU or peak_allocated == 0:
        return peak_allocated
    if spec.hardware.expandable_segments and gap_fraction is None:
        return _round_up(peak_allocated, K_LARGE_BUFFER)
    if transient_bytes is None:
        transient_bytes = transient_at_peak(collect_components(spec))
    transient = min(max(transient_bytes, 0), peak_allocated)
    fraction = FRAGMENTATION_OF_TRANSIENT if gap_fraction is None else max(gap_fraction, 0.0)
    gap = int(fraction * transient)
    return _round_up(peak_allocated + gap, K_ROUND_LARGE)


# ms-swift's benchmark, Qwen-7B-Chat LoRA r8 on c_attn, checkpointing, flash-attn 2, A100, torch 2.1.1,
# torch.cuda.max_memory_reserved over the run: docs/source/LLM/Benchmark.md @cfcb672 line 71 (samples over 2048
# cut to 2048, truncation_left: 19362 MiB) and @97e4d198b (samples over 2048 deleted, 'delete': 27.74 GiB);
# benchmarks/calibration/published_measurements.json SWIFT-D1 / SWIFT-1.
_VARIABLE_LENGTHS_MEASURED = (
    "ms-swift's Qwen-7B LoRA benchmark at max_length 2048 reserved 27.74 GiB with lengths varying up to 2048 "
    "against 18.91 GiB with most batches cut to 2048"
)


def allocator_findings(spec: TrainingSpec, gap_fraction: float | None = None) -> tuple[Finding, ...]:
    """Findings about the caching allocator.

    Args:
        spec: The training spec.
        gap_fraction: The replayed gap fraction, when the step was traced.

    Returns:
        An ``alloc-fragmentation`` hint when expandable segments are off and the run uses techniques known to
        fragment the caching allocator (checkpointing, LoRA, offload; GMLake, ASPLOS 2024), else nothing.
    """
    if spec.hardware.device_type is DeviceType.CPU or spec.hardware.expandable_segments:
        return ()
    reasons = []
    if spec.activations.checkpointing:
        reasons.append("gradient checkpointing")
    if spec.lora is not None:
        reasons.append("LoRA")
    if spec.quant is not None:
        reasons.append(f"{spec.quant.bits}-bit base")
    ds = spec.sharding.deepspeed
    fsdp = spec.sharding.fsdp
    ds_offload = ds is not None and (
        ds.offload_optimizer is not OffloadDevice.NONE or ds.offload_param is not OffloadDevice.NONE
    )
    if ds_offload or (fsdp is not None and fsdp.offload_params):
        reasons.append("offload")
    if not reasons:
        return ()
    rule = (
        f"{FRAGMENTATION_OF_TRANSIENT:.0%} of the per-step tensors (a published ratio; no trace)"
        if gap_fraction is None
        else f"{gap_fraction:.0%} of the per-step tensors (the traced step's allocations replayed through torch's "
        "caching-allocator rules)"
    )
    return (
        Finding(
            "alloc-fragmentation",
            Severity.INFO,
            f"{', '.join(reasons)} {'make' if len(reasons) > 1 else 'makes'} many differently sized allocations; "
            f"the caching allocator's reserved memory is modelled at allocated + {rule}",
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment before Python imports "
            "torch (in the launch command, not in the script after `import torch`) to shrink that gap; this "
            f"answer runs every step at {spec.batch.seq_len} tokens: where batches are padded to their longest, "
            "each new longest batch adds blocks while the shorter ones' stay cached, so give their lengths with "
            f"--seq_lengths to replay them ({_VARIABLE_LENGTHS_MEASURED})",
        ),
    )
