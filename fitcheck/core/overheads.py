"""CUDA-side memory a CPU trace cannot see: context, library workspaces, NCCL, and the caching allocator.

Three numbers describe a step on a GPU (see ``fitcheck.report.Report``):

- ``peak_allocated``: live tensors in torch's caching allocator (``torch.cuda.max_memory_allocated``).
  The cuBLAS/cuBLASLt workspaces belong here: torch allocates them through the caching allocator
  (``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``getNewWorkspace`` ->
  ``CUDACachingAllocator::get()->allocate``), so they are :class:`Location.DEVICE` components.
- ``peak_reserved``: segments the allocator holds (``torch.cuda.max_memory_reserved``), from
  :func:`fitcheck.core.allocator.reserved_bytes`.
- ``device_used`` (nvidia-smi): reserved + memory outside the allocator: the CUDA context and NCCL's
  buffers (:class:`Location.DEVICE_OTHER` components from :func:`overhead_components`).

On ``device_type cpu`` there is none of this: no components, and reserved == allocated.

Pure: no torch import, no environment reads. The allocator setting comes in through
``HardwareSpec.expandable_segments``.
"""

from __future__ import annotations

from fitcheck.report import Category, Component, Location
from fitcheck.spec import DeviceType, Strategy, TrainingSpec
from fitcheck.units import format_bytes

KIB = 1024
MIB = 1024**2

# --- CUDA context (outside the allocator: visible to nvidia-smi, not to torch) ---------------------
# torch sets CUDA_MODULE_LOADING=LAZY unless the user set it (pytorch/pytorch PR #86509, torch >= 1.13), and
# CUDA >= 12.2 loads lazily by default on Linux (CUDA C++ Programming Guide, "Lazy Loading").
# Measured in this repo (benchmarks/data/gpu_truth_nvidia_h100_80gb_hbm3.json and gpu_truth_nvidia_h200.json,
# torch 2.11.0+cu130, driver 580.159): nvidia-smi-style used memory (mem_get_info total - free) minus
# max_memory_reserved at a training step's peak is 766.8 MiB on all 8 H100 rows and on 9 of 21 H200 rows
# (750.8 on 5 eager/GPT-2/Gemma-2 rows, 768.8 on 4, 830.8 on the 3 LLM.int8 rows, whose bitsandbytes kernels
# load on top). Right after torch.cuda.init() it is 526.8 MiB (`used_at_init`): the step's kernels (cuBLAS,
# attention, optimizer) load lazily on top of the bare context. Published bare-context figures are lower:
# 426 MiB, PyTorch 2.10.0+cu130, RTX 6000 Ada (unslothai/unsloth-zoo PR #1053); 287,047,680 B after one small
# op with LAZY vs 666,632,192 B with EAGER (pytorch/pytorch PR #86509); "~400MB" (ptrblck, pytorch#109888).
# The step-time figure is what a run shows; no per-generation split was measured, so it serves every GPU.
CUDA_CONTEXT_LAZY_BYTES = 767 * MIB

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
# DeepSpeed initialises a NCCL process group even for one process (deepspeed.init_distributed, which the
# Trainer's accelerate state calls), and its engine's collectives create communicators on it. Measured in this repo
# (benchmarks/data/trainer_gpu_nvidia_h200.json, a real Trainer + ZeRO-2 and ZeRO-3 on one H200 process):
# used minus max_memory_reserved at steps 2-3 is 1716.8 MiB, the CUDA context (767 MiB) plus 950 MiB.
NCCL_DEEPSPEED_ONE_PROCESS_BYTES = 950 * MIB


def _gpu_family(spec: TrainingSpec) -> str:
    """``"sm90"`` (Hopper), ``"gfx94"`` (MI300), or ``"default"`` from the GPU name."""
    name = (spec.hardware.gpu_name or "").upper()
    if any(tag in name for tag in ("H100", "H200", "H800", "H20")):
        return "sm90"
    if "MI300" in name or "MI325" in name:
        return "gfx94"
    return "default"


def cublas_thread_workspaces(spec: TrainingSpec) -> tuple[int, ...]:
    """The workspaces one thread allocates through the caching allocator at its first cuBLAS call, in order.

    ``CublasHandlePool.cpp`` ``getCurrentCUDABlasHandle`` allocates the cuBLAS workspace (``getNewWorkspace``) the
    first time a thread's handle is used on a stream, before the op's kernel runs and after its output exists
    (the structured kernel allocates the output first); the cuBLASLt workspace (``getCUDABlasLtWorkspace``) comes
    on the thread's first cuBLASLt call, counted here with the first call. Both stay allocated for the process.
    The tracer's CUDA emulation records them where the step makes those calls
    (``torch_adapters/cuda_emulation.py`` item 4), so the allocator replay places them as the GPU does.

    Args:
        spec: The training spec (GPU name decides the default size).

    Returns:
        (cuBLAS workspace, cuBLASLt workspace) bytes, or () on CPU.
    """
    if spec.hardware.device_type is DeviceType.CPU:
        return ()
    family = _gpu_family(spec)
    if family == "sm90":
        return (CUBLAS_WORKSPACE_SM90, CUBLASLT_WORKSPACE)
    if family == "gfx94":
        return (HIPBLAS_WORKSPACE_GFX94, HIPBLASLT_WORKSPACE)
    return (CUBLAS_WORKSPACE_DEFAULT, CUBLASLT_WORKSPACE)


def cublas_workspace_bytes(spec: TrainingSpec) -> int:
    """Per-GPU bytes of the cuBLAS(+Lt) workspaces a training step creates.

    Args:
        spec: The training spec (GPU name decides the default size).

    Returns:
        Bytes allocated through the caching allocator (0 on CPU).
    """
    return CUBLAS_THREADS * sum(cublas_thread_workspaces(spec))


def nccl_group_bytes(ranks: int) -> int:
    """NCCL buffers per GPU of one more communicator of ``ranks`` ranks (0 for one rank; NVIDIA/nccl#964)."""
    return 0 if ranks <= 1 else NCCL_TWO_RANKS_BYTES if ranks == 2 else NCCL_MANY_RANKS_BYTES


def nccl_bytes(spec: TrainingSpec) -> int:
    """NCCL buffers per GPU for the data-parallel process group (0 for one process).

    Args:
        spec: The training spec.

    Returns:
        Bytes outside torch's allocator.
    """
    n = spec.sharding.num_processes
    if spec.hardware.device_type is DeviceType.CPU:
        return 0
    if n <= 1 and spec.sharding.strategy is Strategy.DEEPSPEED:
        return NCCL_DEEPSPEED_ONE_PROCESS_BYTES
    if n <= 1 or spec.sharding.strategy is Strategy.SINGLE:
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
            "767 MiB: nvidia-smi used minus max_memory_reserved at a step's peak, measured on H100 and H200, "
            "torch 2.11+cu130 (benchmarks/data/gpu_truth_nvidia_*.json); lazy module loading (pytorch PR #86509)",
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
                "NCCL buffers: DeepSpeed on one process, 950 MiB measured on an H200 (benchmarks/data/"
                "trainer_gpu_nvidia_h200.json)" if spec.sharding.num_processes <= 1 else
                "NCCL buffers measured per process group after an all-reduce, 4x A100 NVLink: 544 MiB for 2 "
                "ranks, 688 MiB for 3+ (NVIDIA/nccl#964)",
                f"{spec.sharding.num_processes} processes; not in max_memory_allocated/reserved",
                location=Location.DEVICE_OTHER,
            )
        )
    return tuple(out)
