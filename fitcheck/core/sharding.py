"""Which model states each strategy partitions over the data-parallel group, and which it offloads.

Pure policy: :func:`partition` says, for the spec's strategy, by how much each kind of model state is divided
per GPU and whether it lives on the host. ``fitcheck.core.model_states`` applies it; communication buffers
are separate components (:func:`buffer_components`).

Sources: ZeRO paper (Rajbhandari et al. 2020, sec. 5: P_os, P_os+g, P_os+g+p); DeepSpeed
``deepspeed/runtime/zero/stage_1_and_2.py`` / ``stage3.py``; PyTorch FSDP docs (ShardingStrategy).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.findings import Finding
from fitcheck.report import Component
from fitcheck.spec import OffloadDevice, Strategy, TrainingSpec


@dataclass(frozen=True)
class Partition:
    """How model states are split and placed on one GPU.

    Attributes:
        weights: Divisor of the (16-bit / quantized) weights resident on the GPU between uses.
        gradients: Divisor of the gradients kept after reduction.
        optimizer: Divisor of optimizer states.
        master: Divisor of fp32 master weights.
        optimizer_on_host: Optimizer states and master weights live in host RAM (offload_optimizer).
        params_on_host: Weights live in host RAM between uses (offload_param / FSDP cpu offload).
        gradients_on_host: Reduced gradients are copied to host (ZeRO-Offload, FSDP offload).
        full_gradients_between_microsteps: Unsharded gradients are kept across accumulation micro-steps.
        description: One line for the report.
    """

    weights: int = 1
    gradients: int = 1
    optimizer: int = 1
    master: int = 1
    optimizer_on_host: bool = False
    params_on_host: bool = False
    gradients_on_host: bool = False
    full_gradients_between_microsteps: bool = False
    description: str = "single GPU: every state replicated in full"


def partition(spec: TrainingSpec) -> Partition:
    """The partition policy for a spec's strategy.

    Args:
        spec: The training spec.

    Returns:
        Divisors and placement per model-state kind.
    """
    sh = spec.sharding
    n = spec.data_parallel_size
    if sh.strategy is Strategy.SINGLE or n == 1 and sh.strategy is Strategy.DDP:
        return Partition()
    if sh.strategy is Strategy.DDP:
        return Partition(description=f"DDP over {n} GPUs: full replica per GPU")
    if sh.strategy is Strategy.DEEPSPEED:
        ds = sh.deepspeed
        stage = ds.stage if ds is not None else 0
        off_opt = ds is not None and ds.offload_optimizer is not OffloadDevice.NONE
        off_par = ds is not None and ds.offload_param is not OffloadDevice.NONE
        # ZeRO-1 partitions optimizer states (+fp32 master), ZeRO-2 adds gradients, ZeRO-3 adds parameters.
        return Partition(
            weights=n if stage >= 3 else 1,
            gradients=n if stage >= 2 else 1,
            optimizer=n if stage >= 1 else 1,
            master=n if stage >= 1 else 1,
            optimizer_on_host=off_opt,
            params_on_host=off_par,
            gradients_on_host=off_opt,
            description=f"DeepSpeed ZeRO-{stage} over {n} GPUs"
            + (" + optimizer offload" if off_opt else "")
            + (" + parameter offload" if off_par else ""),
        )
    fs = sh.fsdp
    strategy = fs.sharding_strategy if fs is not None else "FULL_SHARD"
    offload = fs is not None and fs.offload_params
    if strategy == "NO_SHARD":
        return Partition(description=f"FSDP NO_SHARD over {n} GPUs (DDP-like)")
    group = n
    if strategy == "HYBRID_SHARD":
        group = sh.processes_per_machine  # shard within a node, replicate across nodes
    return Partition(
        weights=group,
        gradients=group,
        optimizer=group,
        master=group,
        optimizer_on_host=offload,
        params_on_host=offload,
        gradients_on_host=offload,
        full_gradients_between_microsteps=(
            spec.batch.grad_accum > 1 and not (fs is not None and fs.sync_each_batch)
        ),
        description=f"FSDP{fs.version if fs else 2} {strategy} over {group} GPUs" + (" + CPU offload" if offload else ""),
    )


def buffer_components(spec: TrainingSpec) -> tuple[Component, ...]:
    """Communication buffers of the strategy (DDP buckets, DeepSpeed buckets, FSDP unsharded units).

    Args:
        spec: The training spec.

    Returns:
        Components for the buffers (none for a single GPU).
    """
    return ()


def sharding_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """Findings about the sharding setup (unmodelled parallelism, inconsistent settings).

    Args:
        spec: The training spec.

    Returns:
        Findings (none for a plain single-GPU run).
    """
    return ()
