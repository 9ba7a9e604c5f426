"""CUDA-side memory a CPU trace cannot see: context, library workspaces, NCCL, and the caching allocator.

Three numbers describe a step on a GPU (see ``fitcheck.report.Report``):

- ``peak_allocated``: live tensors in torch's caching allocator (``torch.cuda.max_memory_allocated``).
  The cuBLAS/cuBLASLt workspaces belong here: torch allocates them through the caching allocator
  (``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``getNewWorkspace`` ->
  ``CUDACachingAllocator::get()->allocate``), so they are :class:`Location.DEVICE` components.
- ``peak_reserved``: segments the allocator holds (``torch.cuda.max_memory_reserved``), from
  :func:`reserved_bytes`.
- ``device_used`` (nvidia-smi): reserved + memory outside the allocator: the CUDA context and NCCL's
  buffers (:class:`Location.DEVICE_OTHER` components from :func:`overhead_components`).

On ``device_type cpu`` there is none of this: no components, and reserved == allocated.

Pure: no torch import, no environment reads. The allocator setting comes in through
``HardwareSpec.expandable_segments``.
"""

from __future__ import annotations

from collections.abc import Iterable

from fitcheck.findings import Finding, Severity
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import DeviceType, OffloadDevice, Strategy, TrainingSpec
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

# --- CUDA context (outside the allocator: visible to nvidia-smi, not to torch) ---------------------
# torch sets CUDA_MODULE_LOADING=LAZY unless the user set it (pytorch/pytorch PR #86509, torch >= 1.13), and
# CUDA >= 12.2 loads lazily by default on Linux (CUDA C++ Programming Guide, "Lazy Loading").
# Most recent published figure: 426 MiB in nvidia-smi for a bare context, PyTorch 2.10.0+cu130, RTX 6000 Ada
# (unslothai/unsloth-zoo PR #1053); 287,047,680 B after one small op with LAZY vs 666,632,192 B with EAGER in
# PR #86509; "~400MB" with lazy loading (ptrblck, pytorch/pytorch#109888). Kernels that the step loads later
# (cuBLAS, attention, optimizer) add to it; no published per-generation split was found, so one number serves
# every GPU generation.
CUDA_CONTEXT_LAZY_BYTES = 426 * MIB

# --- cuBLAS workspaces (inside the allocator) ------------------------------------------------------
# aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize(): default ":4096:2:16:8" =
# 2 x 4096 KiB + 8 x 16 KiB, or 4096 KiB x 8 = 32 MiB on sm90 (Hopper: H100/H200); ROCm: 32 MiB, 128 MiB on
# gfx94x/gfx95x (MI300). One workspace per (handle, stream); handles are per thread (thread-local pool
# window).
CUBLAS_WORKSPACE_DEFAULT = 4096 * KIB * 2 + 16 * KIB * 8
CUBLAS_WORKSPACE_SM90 = 4096 * KIB * 8
HIPBLAS_WORKSPACE_GFX94 = 128 * MIB
# parseCUDABlasLtWorkspaceSize(): cuBLASLt gets its own workspace of CUBLASLT_WORKSPACE_SIZE = 1024 KiB unless
# TORCH_CUBLASLT_UNIFIED_WORKSPACE=1 (capped at the cuBLAS size); hipBLASLt: 76 MiB.
CUBLASLT_WORKSPACE = 1024 * KIB
HIPBLASLT_WORKSPACE = 76 * MIB
# Forward and optimizer run on the Python thread; autograd runs CUDA backward on its own per-device worker
# thread (torch/csrc/autograd/engine.cpp, device threads), which gets a second handle and so a second
# workspace.
CUBLAS_THREADS = 2

# --- NCCL (outside the allocator) ------------------------------------------------------------------
# Measured per process group after one all-reduce through PyTorch on 4x A100 NVLink (NVIDIA/nccl#964): 544 MB
# for a 2-GPU group, 688 MB for groups of 3 or more (nvidia-smi units, MiB). NCCL's maintainers: memory grows
# with channels; Ring uses 2 connections regardless of scale, and beyond 2 nodes it no longer grows
# (NVIDIA/nccl#986, sjeaugey). Each extra communicator adds its own buffers (NVIDIA/nccl#864).
NCCL_TWO_RANKS_BYTES = 544 * MIB
NCCL_MANY_RANKS_BYTES = 688 * MIB


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


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


def _gpu_family(spec: TrainingSpec) -> str:
    """``"sm90"`` (Hopper), ``"gfx94"`` (MI300), or ``"default"`` from the GPU name."""
    name = (spec.hardware.gpu_name or "").upper()
    if any(tag in name for tag in ("H100", "H200", "H800", "H20")):
        return "sm90"
    if "MI300" in name or "MI325" in name:
        return "gfx94"
    return "default"


def cublas_workspace_bytes(spec: TrainingSpec) -> int:
    """Per-GPU bytes of the cuBLAS(+Lt) workspaces a training step creates.

    Args:
        spec: The training spec (GPU name decides the default size).

    Returns:
        Bytes allocated through the caching allocator (0 on CPU).
    """
    if spec.hardware.device_type is DeviceType.CPU:
        return 0
    family = _gpu_family(spec)
    if family == "sm90":
        per_thread = CUBLAS_WORKSPACE_SM90 + CUBLASLT_WORKSPACE
    elif family == "gfx94":
        per_thread = HIPBLAS_WORKSPACE_GFX94 + HIPBLASLT_WORKSPACE
    else:
        per_thread = CUBLAS_WORKSPACE_DEFAULT + CUBLASLT_WORKSPACE
    return CUBLAS_THREADS * per_thread


def nccl_bytes(spec: TrainingSpec) -> int:
    """NCCL buffers per GPU for the data-parallel process group (0 for one process).

    Args:
        spec: The training spec.

    Returns:
        Bytes outside torch's allocator.
    """
    n = spec.sharding.num_processes
    if spec.hardware.device_type is DeviceType.CPU or n <= 1 or spec.sharding.strategy is Strategy.SINGLE:
        return 0
    per_group = NCCL_TWO_RANKS_BYTES if n == 2 else NCCL_MANY_RANKS_BYTES
    groups = 1
    fsdp = spec.sharding.fsdp
    hybrid = fsdp is not None and "HYBRID" in fsdp.sharding_strategy.upper()
    if spec.sharding.strategy is Strategy.FSDP and hybrid:
        groups = 2  # HYBRID_SHARD: a shard group inside the node and a replicate group across nodes
    return groups * per_group


def overhead_components(spec: TrainingSpec) -> tuple[Component, ...]:
    """CUDA context, cuBLAS workspaces and NCCL buffers on one GPU.

    Args:
        spec: The training spec.

    Returns:
        Components (none on ``device_type cpu``). The context and NCCL are outside torch's allocator
        (``Location.DEVICE_OTHER``); the cuBLAS workspaces are inside it (``Location.DEVICE``).
    """
    if spec.hardware.device_type is DeviceType.CPU:
        return ()
    out = [
        Component.persistent(
            "overhead.cuda_context",
            Category.OVERHEAD,
            CUDA_CONTEXT_LAZY_BYTES,
            "426 MiB bare context with lazy module loading, torch 2.10+cu130 (unsloth-zoo PR #1053); torch "
            "sets CUDA_MODULE_LOADING=LAZY (pytorch PR #86509)",
            "CUDA context (driver state and loaded kernels); not in max_memory_allocated/reserved",
            location=Location.DEVICE_OTHER,
        )
    ]
    ws = cublas_workspace_bytes(spec)
    family = _gpu_family(spec)
    out.append(
        Component.persistent(
            "overhead.cublas_workspace",
            Category.OVERHEAD,
            ws,
            "aten/src/ATen/cuda/CublasHandlePool.cpp (default CUBLAS_WORKSPACE_CONFIG :4096:2:16:8, 32 MiB "
            "on sm90; CUBLASLT_WORKSPACE_SIZE 1 MiB), allocated through the caching allocator",
            f"{CUBLAS_THREADS} threads (forward + autograd backward) x {format_bytes(ws // CUBLAS_THREADS)}"
            f" ({family})",
        )
    )
    nccl = nccl_bytes(spec)
    if nccl:
        out.append(
            Component.persistent(
                "overhead.nccl",
                Category.OVERHEAD,
                nccl,
                "NCCL buffers measured per process group after an all-reduce, 4x A100 NVLink: 544 MiB for 2 "
                "ranks, 688 MiB for 3+ (NVIDIA/nccl#964)",
                f"{spec.sharding.num_processes} processes; not in max_memory_allocated/reserved",
                location=Location.DEVICE_OTHER,
            )
        )
    return tuple(out)


def transient_bytes_at(components: Iterable[Component], phase: Phase) -> int:
    """Bytes at ``phase`` of device components allocated and freed within each step.

    A component is transient when its bytes differ between phases (activations, logits, temporaries,
    gradients freed by ``zero_grad(set_to_none=True)``); a component constant over the step (weights,
    optimizer states, workspaces) is persistent.

    Args:
        components: The step's components.
        phase: The peak phase.

    Returns:
        Sum of the transient device components' bytes in that phase.
    """
    total = 0
    for c in components:
        if c.location is not Location.DEVICE:
            continue
        values = {c.at(p) for p in PHASES}
        if len(values) > 1:
            total += c.at(phase)
    return total


def _transient_from_spec(spec: TrainingSpec) -> int:
    """Transient bytes at the peak phase of the spec's own components (formula path)."""
    from fitcheck.core.estimate import collect_components  # late import: estimate imports this module

    components = collect_components(spec)
    totals = {p: sum(c.at(p) for c in components if c.location is Location.DEVICE) for p in PHASES}
    phase = max(PHASES, key=lambda p: (totals[p], -PHASES.index(p)))
    return transient_bytes_at(components, phase)


def reserved_bytes(spec: TrainingSpec, peak_allocated: int, *, transient_bytes: int | None = None) -> int:
    """``max_memory_reserved`` at the peak: allocated + the allocator's cached free blocks.

    Model (see the constants above for what each number rests on):
    reserved = round_up(peak_allocated + FRAGMENTATION_OF_TRANSIENT x transient, 2 MiB); with expandable
    segments, the free-block gap goes (segments grow in place, PyTorch docs) and reserved is allocated rounded
    up to the 20 MiB page an expandable segment grows by. On ``device_type cpu``, reserved == allocated.

    Args:
        spec: The training spec.
        peak_allocated: Peak bytes in the allocator (``max_memory_allocated``).
        transient_bytes: Part of ``peak_allocated`` allocated and freed within each step (from
            :func:`transient_bytes_at` on the estimate's components at the peak phase). None: computed here
            from the spec's components (``fitcheck.core.estimate.collect_components``, formula path).

    Returns:
        Peak reserved bytes (>= peak_allocated).
    """
    if peak_allocated < 0:
        raise ValueError(f"peak_allocated must be >= 0, got {peak_allocated}")
    if spec.hardware.device_type is DeviceType.CPU or peak_allocated == 0:
        return peak_allocated
    if spec.hardware.expandable_segments:
        return _round_up(peak_allocated, K_LARGE_BUFFER)
    if transient_bytes is None:
        transient_bytes = _transient_from_spec(spec)
    transient = min(max(transient_bytes, 0), peak_allocated)
    gap = int(FRAGMENTATION_OF_TRANSIENT * transient)
    return _round_up(peak_allocated + gap, K_ROUND_LARGE)


def overhead_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """Findings about CUDA-side overheads and the allocator.

    Args:
        spec: The training spec.

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
    return (
        Finding(
            "alloc-fragmentation",
            Severity.INFO,
            f"{', '.join(reasons)} make many differently sized allocations; the caching allocator's reserved "
            f"memory is modelled at allocated + {FRAGMENTATION_OF_TRANSIENT:.0%} of the per-step tensors",
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment before Python imports "
            "torch (in the launch command, not in the script after `import torch`) to shrink that gap",
        ),
    )
