"""How the model is spread over processes: the strategy (single, DDP, DeepSpeed, FSDP), DeepSpeed's and FSDP's
memory-relevant settings, and where the effective ZeRO stage is derived (:attr:`ShardingSpec.zero_stage`).

Part of :mod:`fitcheck.spec` (import from there).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, get_args


class Strategy(str, Enum):
    """How the model is replicated or sharded over processes."""

    SINGLE = "single"
    DDP = "ddp"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"


class OffloadDevice(str, Enum):
    """Where DeepSpeed/FSDP offloads to."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


@dataclass(frozen=True)
class DeepSpeedSpec:
    """The memory-relevant part of a DeepSpeed config (after "auto" is resolved).

    Defaults are DeepSpeed's own (deepspeed/runtime/zero/config.py).
    """

    stage: int = 0
    offload_optimizer: OffloadDevice = OffloadDevice.NONE
    offload_param: OffloadDevice = OffloadDevice.NONE
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool | None = None  # None = DeepSpeed default (True for stage 3 only)
    contiguous_gradients: bool = True
    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000
    zero3_init: bool = True
    pin_memory: bool = False
    gather_16bit_on_save: bool = False  # stage3_gather_16bit_weights_on_model_save (DeepSpeed default False)
    # The optimizer class DeepSpeed builds from the config's own ``optimizer`` section (deepspeed 0.19.8
    # runtime/engine.py ``_configure_basic_optimizer``: "FusedAdam", "DeepSpeedCPUAdam", "torch.optim.SGD", ...);
    # None when the Trainer builds it from ``optim`` (readers/deepspeed_optimizer.py). The optimizer's states are
    # ``TrainingSpec.optimizer``'s, which the reader sets to the ``optim`` name with the same states.
    optimizer_class: str | None = None

    @property
    def overlaps_comm(self) -> bool:
        """``overlap_comm`` as DeepSpeed resolves it: the config's value, else on for stage 3 only (deepspeed 0.19.8
        ``runtime/zero/config.py`` ``overlap_comm_valid``)."""
        return self.overlap_comm if self.overlap_comm is not None else self.stage == 3

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_optimization.stage must be 0-3, got {self.stage}")
        if self.offload_param is not OffloadDevice.NONE and self.stage != 3:
            raise ValueError("offload_param needs ZeRO stage 3")


# FSDP sharding strategies (torch ShardingStrategy names; FSDP2 maps reshard_after_forward onto the first two).
ShardingStrategy = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]


SHARDING_STRATEGIES: tuple[ShardingStrategy, ...] = get_args(ShardingStrategy)


# FSDP wrap policies (accelerate fsdp_auto_wrap_policy).
AutoWrapPolicy = Literal["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
# torch 2.13 BackwardPrefetch members (1, 2) and accelerate 1.15's "NO_PREFETCH" (utils/constants.py
# FSDP_BACKWARD_PREFETCH, in its order)
BackwardPrefetchPolicy = Literal["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]


@dataclass(frozen=True)
class FsdpSpec:
    """FSDP settings (accelerate ``fsdp_config``), FSDP1 and FSDP2.

    Attributes:
        version: 1 or 2.
        sharding_strategy: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD.
        reshard_after_forward: FSDP2 flag (FULL_SHARD = True, SHARD_GRAD_OP = False).
        offload_params: CPU offload of parameters, gradients and optimizer states.
        wrap_unit_params: Parameters in the largest wrapped unit (0 = one decoder layer).
        use_orig_params: FSDP1 use_orig_params.
        sync_each_batch: Reduce-scatter gradients at every micro-step (no unsharded grads kept).
        auto_wrap_policy: accelerate's ``fsdp_auto_wrap_policy``: TRANSFORMER_BASED_WRAP (one decoder layer per
            unit), SIZE_BASED_WRAP (units of at least ``min_num_params``) or NO_WRAP (the whole model is one unit).
        min_num_params: ``fsdp_min_num_params`` for SIZE_BASED_WRAP.
        cpu_ram_efficient_loading: ``fsdp_cpu_ram_efficient_loading``: only local rank 0 loads the checkpoint
            into host RAM, the other ranks hold empty weights (accelerate 1.15 ``FullyShardedDataParallelPlugin``).
        state_dict_type: ``fsdp_state_dict_type``: ``FULL_STATE_DICT``, ``SHARDED_STATE_DICT`` or
            ``LOCAL_STATE_DICT``; empty: accelerate 1.15's default (``set_state_dict_type``: FULL for FSDP1,
            SHARDED for FSDP2).
        frozen_shares_units: FSDP1 (``use_orig_params=True``) units hold frozen and trainable parameters together
            (a wrap by decoder block over a LoRA model, e.g. Lightning Fabric's ``auto_wrap_policy={Block}``), so
            each such unit's gradient covers its frozen parameters too. False for the Trainer, which wraps the
            LoRA layers in units of their own (transformers 5.23 ``distributed/fsdp.py``
            ``update_fsdp_plugin_peft``).
        backward_prefetch: FSDP1's ``backward_prefetch``: NO_PREFETCH (transformers 5.23 ``training_args.py``
            ``fsdp_config.get("backward_prefetch", "NO_PREFETCH")``; accelerate 1.15's plugin default None),
            BACKWARD_PRE (a unit's pre-backward hook gathers the next unit) or BACKWARD_POST (its post-backward
            hook, after resharding it). accelerate sets it to None under FSDP2.
        forward_prefetch: FSDP1's ``forward_prefetch`` (accelerate 1.15's plugin and transformers 5.23's
            ``fsdp_config`` default False): a unit's pre-forward gathers the next unit in forward order. FSDP2 has
            none (accelerate reads ``FSDP_FORWARD_PREFETCH`` for ``fsdp_version`` 1 only).
        limit_all_gathers: FSDP1's ``limit_all_gathers`` (accelerate 1.15's default True): the CPU waits before an
            all-gather while two flat parameters' frees are pending on the device. False: not modelled (the CPU
            may run ahead of the device by as many gathers as it issues); FSDP2 has no such setting.
    """

    version: int = 2
    sharding_strategy: ShardingStrategy = "FULL_SHARD"
    reshard_after_forward: bool = True
    offload_params: bool = False
    wrap_unit_params: int = 0
    use_orig_params: bool = True
    sync_each_batch: bool = False
    auto_wrap_policy: AutoWrapPolicy = "TRANSFORMER_BASED_WRAP"
    min_num_params: int = 0
    cpu_ram_efficient_loading: bool = False
    state_dict_type: str = ""
    frozen_shares_units: bool = False
    backward_prefetch: BackwardPrefetchPolicy = "NO_PREFETCH"
    forward_prefetch: bool = False
    limit_all_gathers: bool = True

    @property
    def saves_full_state_dict(self) -> bool:
        """Whether saving gathers the full state dict (``FULL_STATE_DICT``, explicit or accelerate's default)."""
        return (self.state_dict_type or ("FULL_STATE_DICT" if self.version == 1 else "SHARDED_STATE_DICT")) \
            == "FULL_STATE_DICT"


@dataclass(frozen=True)
class ParallelismSpec:
    """accelerate's ``ParallelismConfig`` sizes (accelerate 1.15 ``parallelism_config.py``), as applied.

    World = ``dp_replicate * dp_shard * tp * cp * sp``. FSDP2 shards over the flattened ``dp_shard x cp``
    mesh and replicates over ``dp_replicate`` (HSDP); ``tp`` splits weights by transformers' ``tp_plan``;
    ``cp`` is torch ring attention over the sequence (FSDP2 only); ``sp`` is DeepSpeed Ulysses/ALST.

    Attributes:
        dp_replicate: ``dp_replicate_size``.
        dp_shard: ``dp_shard_size``.
        tp: ``tp_size``.
        cp: ``cp_size``.
        sp: ``sp_size``.
        sp_backend: ``sp_backend`` (accelerate accepts only ``"deepspeed"``).
        cp_comm_strategy: ``cp_handler.cp_comm_strategy``: ``"allgather"`` (default) or ``"alltoall"``.
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    cp: int = 1
    sp: int = 1
    sp_backend: str = "deepspeed"
    cp_comm_strategy: str = "allgather"

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}_size must be at least 1, but got {getattr(self, name)}")

    @property
    def total(self) -> int:
        """Product of all sizes (accelerate ``total_size``)."""
        return self.dp_replicate * self.dp_shard * self.tp * self.cp * self.sp

    @property
    def non_data_parallel(self) -> int:
        """``tp * cp * sp``: ranks that see the same batch."""
        return self.tp * self.cp * self.sp

    @property
    def active(self) -> bool:
        """True when any model-parallel axis (tp, cp, sp) or HSDP replication is used."""
        return self.non_data_parallel > 1 or self.dp_replicate > 1

    def as_dict(self) -> dict[str, int]:
        """``{dp_replicate, dp_shard, tp, cp, sp}`` (the ``parallelism`` key of ``--json``)."""
        return {
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "tp": self.tp,
            "cp": self.cp,
            "sp": self.sp,
        }


@dataclass(frozen=True)
class ShardingSpec:
    """Processes and the sharding strategy.

    Attributes:
        strategy: single / DDP / DeepSpeed / FSDP.
        num_processes: Total processes over all machines (as accelerate counts them).
        num_machines: Nodes.
        deepspeed: DeepSpeed settings when strategy is DEEPSPEED.
        fsdp: FSDP settings when strategy is FSDP.
        parallelism: accelerate ``ParallelismConfig`` sizes (tensor/context/sequence parallel, HSDP), if any.
    """

    strategy: Strategy = Strategy.SINGLE
    num_processes: int = 1
    num_machines: int = 1
    deepspeed: DeepSpeedSpec | None = None
    fsdp: FsdpSpec | None = None
    parallelism: ParallelismSpec | None = None

    def __post_init__(self) -> None:
        if self.num_processes <= 0 or self.num_machines <= 0:
            raise ValueError("num_processes and num_machines must be positive")
        if self.num_processes % self.num_machines:
            raise ValueError(
                f"num_processes ({self.num_processes}) must be a multiple of num_machines ({self.num_machines})"
            )

    @property
    def processes_per_machine(self) -> int:
        """GPUs per node."""
        return self.num_processes // self.num_machines

    @property
    def zero_stage(self) -> int | None:
        """The ZeRO stage DeepSpeed runs, or None when the run is not under DeepSpeed.

        The one place the stage is derived: a DeepSpeed run without settings runs DeepSpeed's defaults
        (stage 0, :class:`DeepSpeedSpec`).
        """
        if self.strategy is not Strategy.DEEPSPEED:
            return None
        return (self.deepspeed or DeepSpeedSpec()).stage

    @property
    def zero_equivalent_stage(self) -> int:
        """What is sharded, on ZeRO's scale: the ZeRO stage, FSDP's strategy mapped onto it (NO_SHARD 0,
        SHARD_GRAD_OP 2, the full and hybrid strategies 3), 0 for DDP and a single GPU."""
        if self.strategy is Strategy.FSDP:
            strategy = (self.fsdp or FsdpSpec()).sharding_strategy
            return {"NO_SHARD": 0, "SHARD_GRAD_OP": 2}.get(strategy, 3)
        return self.zero_stage or 0
