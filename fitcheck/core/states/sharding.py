"""Which model states each strategy partitions over the data-parallel group, which it offloads, and its
buffers.

:func:`partition` says, for the spec's strategy, by how much each kind of model state is divided per GPU and
whether it lives on the host; ``fitcheck.core.states.model_states`` applies it (to every weight, frozen ones
included; to gradients/optimizer states of trainable parameters only). :func:`buffer_components` adds what
the strategy allocates on top: DDP gradient buckets, DeepSpeed reduce buckets and ZeRO-3 gathered
parameters, FSDP unsharded units. :mod:`.sharding_findings` says what the user should know.

Sources: ZeRO paper (Rajbhandari et al. 2020, sec. 5: P_os, P_os+g, P_os+g+p); DeepSpeed 0.19.8
``deepspeed/runtime/zero/stage_1_and_2.py`` / ``stage3.py`` / ``parameter_offload.py``; torch 2.13
``torch/nn/parallel/distributed.py`` (DDP) and ``torch/distributed/fsdp`` (FSDP1 ``_runtime_utils.py``,
FSDP2 ``_fully_shard``); accelerate 1.15 (gradient accumulation ``no_sync``, ``sync_each_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.states.fsdp1_prefetch import fsdp1_prefetched_units
from fitcheck.core.states.fsdp2_units import fsdp2_components, fsdp_backward_applies
from fitcheck.core.states.fsdp_mixed_units import mixed_unit_frozen_params
from fitcheck.core.states.fsdp_qlora import compute_dtype_override, gathered_layer_bytes, is_fsdp_4bit
from fitcheck.core.states.layout import trainable_params
from fitcheck.core.states.zero3_reuse import reuse_kept_elements
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import DeepSpeedSpec, DeviceType, MixedPrecision, OffloadDevice, Strategy, TrainingSpec
from fitcheck.units import format_bytes

_SRC_DDP = (
    "torch/nn/parallel/distributed.py: Reducer buckets hold a flat copy of every gradient unless "
    "gradient_as_bucket_view=True ('the saved memory size will be equal to the total gradients size'); "
    "accelerate DistributedDataParallelKwargs default gradient_as_bucket_view=False"
)
_SRC_IPG = (
    "deepspeed runtime/zero/stage_1_and_2.py setup_buckets: torch.empty(reduce_bucket_size) per comm dtype, "
    "a second one when overlap_comm (double buffering); released at the backward epilogue"
)
_SRC_Z3 = (
    "deepspeed runtime/zero/stage3.py (ipg bucket of reduce_bucket_size at init), partition_parameters.py "
    "all_gather_coalesced (no gather at partition world size 1) and partitioned_param_coordinator.py (fetch the "
    "current module + prefetch_bucket_size, capped by max_live_parameters); estimate_zero3_model_states_mem_needs "
    "counts 4 x largest layer"
)
_SRC_PERSIST = "deepspeed runtime/zero/parameter_offload.py mark_persistent_parameters (numel <= threshold)"
_SRC_FSDP = (
    "torch FSDP: each wrapped unit is all-gathered into a separate unsharded "
    "buffer for its forward and again "
    "for its backward, with the next unit prefetched; the root unit is not resharded after forward "
    "(fsdp/_runtime_utils.py _post_forward_reshard; FSDP2 _fsdp_state.py 'For the root, do not reshard')"
)


@dataclass(frozen=True)
class Partition:
    """How model states are split and placed on one GPU.

    Attributes:
        weights: Divisor of the (16-bit / quantized) weights resident on the GPU between uses (all weights,
            frozen ones included: ZeRO-3 and FSDP shard a LoRA run's frozen base too).
        gradients: Divisor of the gradients kept after reduction.
        optimizer: Divisor of optimizer states.
        master: Divisor of fp32 master weights.
        optimizer_on_host: Optimizer states and master weights live in host RAM (offload_optimizer).
        params_on_host: Weights live in host RAM between uses (offload_param / FSDP cpu offload).
        gradients_on_host: Reduced gradients are copied to host (ZeRO-Offload, FSDP offload).
        full_gradients_between_microsteps: Unsharded gradients are kept across accumulation micro-steps.
        gradients_resident: The gradient partition lives in a flat buffer allocated once and never freed (ZeRO-3
            on the device: deepspeed 0.19.8 ``runtime/zero/stage3.py`` ``grad_partitions_flat_buffer =
            torch.zeros(sum(p.partition_numel()), dtype=gradient_accumulation_dtype)`` at optimizer init; every
            parameter's reduced gradient is a ``narrow`` of it), so it is alive in every phase, evaluation and
            saving included.
        description: One line for the report.
        shard_group: Processes one copy of the states is split over (N, or GPUs per node for HYBRID_SHARD).
    """

    weights: int = 1
    gradients: int = 1
    optimizer: int = 1
    master: int = 1
    optimizer_on_host: bool = False
    params_on_host: bool = False
    gradients_on_host: bool = False
    full_gradients_between_microsteps: bool = False
    gradients_resident: bool = False
    description: str = "single GPU: every state replicated in full"
    shard_group: int = 1


def partition(spec: TrainingSpec) -> Partition:
    """The partition policy for a spec's strategy.

    Args:
        spec: The training spec.

    Returns:
        Divisors and placement per model-state kind.
    """
    sh = spec.sharding
    n = spec.data_parallel_size
    if sh.strategy is Strategy.SINGLE or (n == 1 and sh.strategy is Strategy.DDP):
        return Partition()
    if sh.strategy is Strategy.DDP:
        return Partition(description=f"DDP over {n} GPUs: full replica per GPU")
    if sh.strategy is Strategy.DEEPSPEED:
        ds = sh.deepspeed
        stage = sh.zero_stage or 0
        # Offload is done by the ZeRO optimizers (stage >= 1); offload_param only by ZeRO-3 (stage3.py).
        off_opt = ds is not None and stage >= 1 and ds.offload_optimizer is not OffloadDevice.NONE
        off_par = ds is not None and stage == 3 and ds.offload_param is not OffloadDevice.NONE
        # ZeRO-1 partitions optimizer states (+fp32 master), ZeRO-2 adds gradients, ZeRO-3 adds parameters.
        return Partition(
            weights=n if stage >= 3 else 1,
            # With offload_optimizer, ZeRO-1 also keeps only its partition's
            # gradients, in the fp32 host partition
            # (stage_1_and_2.py copy_grads_in_partition -> single_partition_of_fp32_groups[i].grad).
            # ZeRO-1 with overlap_comm reduces during backward as ZeRO-2 does: each gradient is copied into the
            # ipg bucket (its own storage freed; one outside the rank's partition is left a view of the bucket,
            # reduce_ipg_grads' stage-1 branch), the rank's into grads_in_partition (zero_reduce.py)
            gradients=n if stage >= 2 or off_opt or _zero1_overlapped(spec) else 1,
            optimizer=n if stage >= 1 else 1,
            master=n if stage >= 1 else 1,
            optimizer_on_host=off_opt,
            params_on_host=off_par,
            gradients_on_host=off_opt,
            # offload_optimizer: the flat buffer is on the host (stage3.py self.device = cpu), pinned
            gradients_resident=stage == 3 and not off_opt,
            description=f"DeepSpeed ZeRO-{stage} over {n} GPUs"
            + (f" + optimizer offload ({ds.offload_optimizer.value})" if off_opt and ds else "")
            + (f" + parameter offload ({ds.offload_param.value})" if off_par and ds else ""),
            shard_group=n if stage >= 1 else 1,
        )
    fs = sh.fsdp
    strategy = fs.sharding_strategy if fs is not None else "FULL_SHARD"
    offload = fs is not None and fs.offload_params
    if strategy == "NO_SHARD":
        return Partition(description=f"FSDP NO_SHARD over {n} GPUs (DDP-like)")
    group = n
    if strategy in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        group = sh.processes_per_machine  # shard within a node, replicate across nodes
    return Partition(
        weights=group,
        gradients=group,
        optimizer=group,
        master=group,
        optimizer_on_host=offload,
        params_on_host=offload,
        gradients_on_host=offload,
        # accelerate accumulate() -> no_sync / set_requires_gradient_sync(False): unsharded grads accumulate
        # until the sync micro-step unless GradientAccumulationPlugin(sync_each_batch=True).
        full_gradients_between_microsteps=(
            spec.batch.grad_accum > 1 and not (fs is not None and fs.sync_each_batch)
        ),
        description=f"FSDP{fs.version if fs else 2} {strategy} over {group} GPUs"
        + (" + CPU offload" if offload else ""),
        shard_group=group,
    )


def contiguous_reduction(spec: TrainingSpec, during_backward: bool) -> DeepSpeedSpec | None:
    """The DeepSpeed settings of a ZeRO-1/2 run that copies its gradients into ``grads_in_partition``
    (``contiguous_gradients``, no optimizer offload: ``copy_grads_in_partition``'s GPU branch) during backward
    (``during_backward``: ZeRO-2, or ZeRO-1 with ``overlap_comm``, ``process_gradients``' hook path) or at its end
    (ZeRO-1 without ``overlap_comm``, ``reduce_gradients``); None for any other run."""
    sh = spec.sharding
    ds = sh.deepspeed
    if sh.strategy is not Strategy.DEEPSPEED or ds is None or sh.zero_stage not in (1, 2):
        return None
    if (sh.zero_stage == 2 or ds.overlaps_comm) is not during_backward:
        return None
    if not ds.contiguous_gradients or ds.offload_optimizer is not OffloadDevice.NONE:
        return None
    return ds


def _zero1_overlapped(spec: TrainingSpec) -> bool:
    """ZeRO-1 reducing during backward (``overlap_comm``, ``contiguous_gradients``, no offload)."""
    return spec.sharding.zero_stage == 1 and contiguous_reduction(spec, during_backward=True) is not None


# --------------------------------------------------------------------------------------------------------
# Shapes the buffers depend on


def param_compute_bytes(spec: TrainingSpec) -> int:
    """Bytes per element of parameters as computed (and of their gradients before reduction)."""
    forced = compute_dtype_override(spec)  # FSDP-QLoRA: transformers sets FSDP mixed precision to quant_storage
    if forced is not None:
        return forced.nbytes
    if spec.precision.mixed_precision is not MixedPrecision.NO and spec.sharding.strategy in (
        Strategy.DEEPSPEED,
        Strategy.FSDP,
    ):
        return 2  # DeepSpeed casts the model to bf16/fp16; accelerate's FSDP MixedPrecision param_dtype
    return spec.precision.load_dtype.nbytes


def _weight_bytes_per_param(spec: TrainingSpec) -> float:
    """Bytes per element of a gathered weight (4-bit/8-bit storage for a quantized base)."""
    if spec.quant is not None:
        return spec.quant.bits / 8  # packed storage; absmax metadata is < 2% and left out here
    return float(param_compute_bytes(spec))


def trainable_count(spec: TrainingSpec) -> int:
    return trainable_params(spec)


def _layer_params(spec: TrainingSpec) -> int:
    """Parameters of one decoder layer (the per-layer entries of the inventory)."""
    return sum(p.numel_each for p in spec.model.params if p.per_layer)


def _root_params(spec: TrainingSpec) -> int:
    """Parameters outside the decoder layers (embeddings, final norm, untied LM head): FSDP's root unit."""
    return sum(p.numel for p in spec.model.params if not p.per_layer)


def largest_tensor(spec: TrainingSpec) -> int:
    """Largest single parameter: ZeRO-3 fetches parameters module by module."""
    return max((p.numel_each for p in spec.model.params), default=0)


def zero3_gradient_in_flight(spec: TrainingSpec) -> int:
    """Bytes of the whole gradient a ZeRO-3 full fine-tune holds in backward on its way into the resident gradient
    buffer, bounded by the largest tensor's: ``buffers.zero3_gathered_params`` in ``Phase.BACKWARD``; 0 elsewhere.

    deepspeed 0.19.8 ``runtime/zero/stage3.py``: autograd makes each parameter's gradient whole, in the module's
    dtype; its hook (``reduce_independent_p_g_buckets_and_remove_grads``) copies one that fits into the ipg bucket,
    freeing it, and keeps one that does not (the embedding, the LM head) until the next hook reduces it
    (``__reduce_and_partition_ipg_grads`` -> ``partition_grads``: ``copy_`` into ``grad_partitions_flat_buffer``,
    ``param.grad = None``). The backward moments count no other new gradient of such a run
    (``core/activations/backward.py``, ``accumulation.gradients_held_from_start``).
    """
    ds = spec.sharding.deepspeed
    if spec.sharding.strategy is not Strategy.DEEPSPEED or ds is None or ds.stage != 3:
        return 0
    if not trainable_count(spec) or spec.lora is not None:
        return 0
    return largest_tensor(spec) * param_compute_bytes(spec)


def fsdp_unit_params(spec: TrainingSpec) -> int:
    """Parameters of the largest non-root FSDP unit under the wrap policy.

    TRANSFORMER_BASED_WRAP: one decoder layer. NO_WRAP: the whole model is one unit. SIZE_BASED_WRAP
    (torch ``size_based_auto_wrap_policy``): a decoder layer becomes its own unit when it holds at least
    ``min_num_params``; smaller layers stay unwrapped and are gathered with their parent ModuleList, so
    every layer forms one unit.
    """
    fs = spec.sharding.fsdp
    if fs is not None and fs.wrap_unit_params > 0:
        return fs.wrap_unit_params
    layer = _layer_params(spec)
    policy = fs.auto_wrap_policy if fs is not None else "TRANSFORMER_BASED_WRAP"
    if policy == "NO_WRAP":
        return spec.model.total_params
    if policy == "SIZE_BASED_WRAP" and fs is not None and layer < fs.min_num_params:
        return layer * spec.model.shape.num_layers
    return layer


def _phases(values: dict[Phase, int]) -> dict[Phase, int]:
    return {p: int(values.get(p, 0)) for p in PHASES}


# --------------------------------------------------------------------------------------------------------
# Buffers


def buffer_components(spec: TrainingSpec) -> tuple[Component, ...]:
    """Communication buffers of the strategy (DDP buckets, DeepSpeed buckets, FSDP unsharded units).

    Args:
        spec: The training spec.

    Returns:
        Components for the buffers (none for a single GPU).
    """
    sh = spec.sharding
    if sh.strategy is Strategy.DDP and spec.data_parallel_size > 1:
        return _ddp(spec)
    if sh.strategy is Strategy.DEEPSPEED:
        return _deepspeed(spec)
    if sh.strategy is Strategy.FSDP:
        return _fsdp(spec)
    return ()


def _ddp(spec: TrainingSpec) -> tuple[Component, ...]:
    grads = trainable_count(spec) * grad_element_bytes(spec)
    return (
        Component.persistent(
            "buffers.ddp_buckets",
            Category.BUFFERS,
            grads,
            _SRC_DDP,
            f"flat all-reduce buckets covering all {trainable_count(spec):,} trainable params "
            "(bucket_cap_mb only sets how many buckets, not their total)",
        ),
    )


def grad_element_bytes(spec: TrainingSpec) -> int:
    if spec.lora is not None:
        return 4  # peft autocast_adapter_dtype=True keeps adapters (and their grads) in fp32
    return spec.precision.load_dtype.nbytes


def _deepspeed(spec: TrainingSpec) -> tuple[Component, ...]:
    ds = spec.sharding.deepspeed
    if ds is None:
        return ()
    n = spec.data_parallel_size
    elem = param_compute_bytes(spec)
    trainable = trainable_count(spec)
    out: list[Component] = []
    overlap = ds.overlaps_comm
    # contiguous_gradients is forced on by cpu offload (stage_1_and_2.py: contiguous_gradients or cpu_offload)
    if ds.stage in (1, 2) and trainable and (ds.contiguous_gradients or ds.offload_optimizer is not OffloadDevice.NONE):
        copies = 2 if overlap else 1
        nbytes = copies * ds.reduce_bucket_size * elem
        # ZeRO-1 with accumulation: the first micro-step's first hook allocates them (process_gradients ->
        # setup_buckets, whatever overlap_comm) and only the boundary's epilogue releases them
        # (independent_gradient_partition_epilogue -> _release_ipg_buffers; engine.py allreduce_gradients
        # runs no epilogue before the boundary under ZeRO-1): a later micro-step's forward and start of
        # backward hold them. Real engine (benchmarks/accumulation_engines_cpu.json), micro-step 2's forward
        # less ZeRO-0's: ZeRO-1 +39,924 B, with overlap_comm +79,924 B (one / two 40,000 B buckets)
        held = ds.stage == 1 and spec.batch.grad_accum > 1
        out.append(
            Component(
                "buffers.deepspeed_reduce_bucket",
                Category.BUFFERS,
                Location.DEVICE,
                _phases({p: nbytes for p in (Phase.FORWARD_END, Phase.BACKWARD_START) if held}
                        | {Phase.BACKWARD: nbytes}),
                _SRC_IPG,
                f"{copies} x reduce_bucket_size {ds.reduce_bucket_size:,} x {elem} B "
                "(allocated in full even when fewer parameters are trainable)"
                + ("; ZeRO-1: held across the accumulation micro-steps until the boundary" if held else ""),
            )
        )
    if ds.stage == 3:
        out.extend(_zero3(spec, ds.reduce_bucket_size, elem, n, trainable))
    return tuple(out)  # an offload_optimizer run's own device buffers: deepspeed_offload.offload_components


def _zero3(spec: TrainingSpec, reduce_bucket: int, elem: int, n: int, trainable: int) -> list[Component]:
    ds = spec.sharding.deepspeed
    out: list[Component] = []
    if ds is None:
        return out
    if trainable and ds.contiguous_gradients:
        out.append(
            Component.persistent(
                "buffers.deepspeed_reduce_bucket",
                Category.BUFFERS,
                reduce_bucket * elem,
                _SRC_Z3,
                f"ipg bucket: reduce_bucket_size {reduce_bucket:,} x {elem} B, allocated at init",
            )
        )
    largest = largest_tensor(spec)
    w = _weight_bytes_per_param(spec)
    # The current module is always fetched; prefetching adds up to prefetch_bucket_size, within
    # max_live_parameters in total.
    live = max(largest, min(ds.max_live_parameters, largest + ds.prefetch_bucket_size))
    # One process: nothing is gathered. partition_parameters.py all_gather_coalesced returns
    # _no_gather_coalesced when every partition world size is 1; its NoGatherHandle sets
    # param.data = ds_tensor.data.to(current device): a view where the partition is on the device (measured on a
    # real ZeRO-3 engine on CPU, benchmarks/deepspeed_cpu.py: forward peak = ZeRO-2's + the flat gradient buffer +
    # the ipg bucket, to 0.1 MiB), but a full copy on CUDA when offload_param keeps ds_tensor in host memory
    # (deepspeed 0.19.8 partition_parameters.py NoGatherHandle.__init__): then the fetched modules are as
    # n > 1's.
    fetched = n > 1 or (ds.offload_param is not OffloadDevice.NONE
                        and spec.hardware.device_type is DeviceType.CUDA)
    gathered = int(live * w) if fetched else 0
    # from the end of the forward into the backward the trainable tail within half of stage3_max_reuse_distance
    # stays gathered too (zero3_reuse); the module fetched and its prefetch come on top, within max_live
    kept = reuse_kept_elements(spec, ds.param_persistence_threshold, ds.max_reuse_distance) if fetched else 0
    on_top = min(ds.prefetch_bucket_size, max(ds.max_live_parameters - kept, 0))
    held = int(max(live, kept + on_top) * w) if fetched else 0
    grad_of_largest = zero3_gradient_in_flight(spec)
    out.append(
        Component(
            "buffers.zero3_gathered_params",
            Category.BUFFERS,
            Location.DEVICE,
            _phases(
                {
                    Phase.FORWARD_END: held,
                    Phase.BACKWARD_START: held,
                    # the largest tensor's gradient comes at its own backward, by when the kept tail above it is
                    # released (an embedding at the bottom): the start of backward or that moment, whichever is more
                    Phase.BACKWARD: max(held, gathered + grad_of_largest),
                }
            ),
            _SRC_Z3,
            (f"largest module {largest:,} params + prefetch {ds.prefetch_bucket_size:,} (max_live_parameters "
             f"{ds.max_live_parameters:,}) " + ("gathered in full" if n > 1 else
                                                "copied in full from host memory (one process, offload_param)")
             if gathered else "one process: nothing gathered")
            + (f"; from the end of forward {kept:,} params kept gathered for their backward (reused within "
               f"stage3_max_reuse_distance {ds.max_reuse_distance:,}: partitioned_param_coordinator.py "
               "__params_to_release, core/states/zero3_reuse.py)" if held != gathered else "")
            + (", plus its full gradient in backward" if grad_of_largest else ""),
        )
    )
    small = sum(p.numel for p in spec.model.params if p.numel_each <= ds.param_persistence_threshold)
    if small and n > 1 and ds.offload_param is OffloadDevice.NONE:
        extra = int(small * w) - int(small * w) // n  # model_states counts 1/n of them
        out.append(
            Component.persistent(
                "buffers.zero3_persistent_params",
                Category.BUFFERS,
                extra,
                _SRC_PERSIST,
                f"{small:,} params in tensors <= stage3_param_persistence_threshold "
                f"{ds.param_persistence_threshold:,} stay unpartitioned",
            )
        )
    return out


def frozen_at_param_dtype(spec: TrainingSpec) -> bool:
    """A LoRA run whose every base unit is frozen in FSDP's ``param_dtype`` (loaded in the mixed-precision dtype, no
    unit shared with the adapters, nothing else trained): FSDP1 on one process (NO_SHARD) makes no copy of such a
    unit. torch 2.13 ``distributed/fsdp/_flat_param.py``: ``_uses_param_mixed_precision`` is ``_fwd_bwd_param_dtype
    != _orig_param_dtype``, and ``pre_unshard`` / ``unshard`` make a low-precision shard only where it is true and
    gather only under a sharded strategy; accelerate 1.15 upcasts only the trainable flat parameters (the adapters'
    own units: a few r-wide rows, not counted). Real Trainer, FSDP1, one process, bf16 (``benchmarks/fsdp_kinds_cpu.py``
    ``lora-fsdp1``): no gathered copy of the root or of a layer at any moment."""
    lora = spec.lora
    mp = {MixedPrecision.BF16: "bfloat16", MixedPrecision.FP16: "float16"}.get(spec.precision.mixed_precision)
    return (lora is not None and not lora.modules_to_save and spec.freeze is None and spec.peft is None
            and mp == spec.precision.load_dtype.value and mixed_unit_frozen_params(spec) == 0)


def _fsdp(spec: TrainingSpec) -> tuple[Component, ...]:
    fs = spec.sharding.fsdp
    part = partition(spec)
    if part.weights == 1 and (spec.precision.mixed_precision is MixedPrecision.NO or spec.quant is not None
                              or frozen_at_param_dtype(spec)) and (fs is not None and fs.version == 1):
        # FSDP1 on one process runs NO_SHARD (torch 2.13 fsdp/_init_utils.py l.430: "switching to use NO_SHARD")
        # and without a cast its local shard is the whole parameter. FSDP2 has no such switch: at one rank
        # wait_for_unshard copies every parameter into its own unsharded storage (_fsdp_param_group.py, the
        # world_size == 1 branch), measured on an H200 (benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json)
        return ()
    # One process with mixed precision still unshards every unit into param_dtype copies (torch's
    # MixedPrecisionPolicy cast in the all-gather): measured on an H100, FSDP1 and FSDP2, Llama-3.2-1B, 1 GPU:
    # step peak 524.4 MB above the estimate without them = the tied embedding/LM-head tail unit in bf16
    # (benchmarks/data/fsdp_gpu_nvidia_h100_80gb_hbm3.json)
    if fs is None or fs.version == 2:
        return fsdp2_components(spec, param_compute_bytes(spec), fsdp_unit_params(spec), _SRC_FSDP, part.weights)
    w = _weight_bytes_per_param(spec)
    unit = int(fsdp_unit_params(spec) * w)
    root = int(_root_params(spec) * w)
    if is_fsdp_4bit(spec):  # packed 4-bit layers, unquantized root (fsdp_qlora.py)
        unit = gathered_layer_bytes(spec, param_compute_bytes(spec))
        root = _root_params(spec) * param_compute_bytes(spec)
    layers_total = int(_layer_params(spec) * spec.model.shape.num_layers * w)
    reshard = fs.reshard_after_forward if fs is not None else True
    trainable = trainable_count(spec)
    # Unsharded gradients of the unit in backward before its reduce-scatter (full fine-tune, or a LoRA unit whose
    # flat parameter holds the frozen weights too: fsdp_mixed_units.py; a separately wrapped LoRA unit's trainable
    # part is small and left out).
    whole_unit = spec.lora is None or mixed_unit_frozen_params(spec) > 0
    unit_grads = int(fsdp_unit_params(spec) * param_compute_bytes(spec)) if trainable and whole_unit else 0
    # the gradients and the layer being computed: backward's moments' (core/states/fsdp_backward.py); the root
    # stays gathered through backward
    modelled = fsdp_backward_applies(spec)
    if reshard:
        fwd_end = root  # every layer resharded; the root unit stays gathered until its backward
        # no layer gathered until a unit's pre-backward (torch 2.13 fsdp/_runtime_utils.py), but BACKWARD_PRE's top
        # layer (real Trainer, FSDP1, 1-2 gloo ranks: accumulation_engines_cpu.py; root + 2 units was +5.4 / +9.1 %)
        bwd_start = root + fsdp1_prefetched_units(spec)[0] * unit
    else:
        fwd_end = bwd_start = (
            root + layers_total
        )  # SHARD_GRAD_OP / reshard_after_forward=False: kept gathered
    ahead = max(fsdp1_prefetched_units(spec)) * unit  # FSDP1's backward_prefetch (modelled runs: in their moments)
    bwd = root if modelled else root + unit + unit_grads + ahead
    out = [
        Component(
            "buffers.fsdp_unsharded_params",
            Category.BUFFERS,
            Location.DEVICE,
            _phases({Phase.FORWARD_END: fwd_end, Phase.BACKWARD_START: bwd_start, Phase.BACKWARD: bwd}),
            _SRC_FSDP,
            f"root unit {format_bytes(root)} + unit of {fsdp_unit_params(spec):,} params "
            f"({fs.auto_wrap_policy if fs else 'TRANSFORMER_BASED_WRAP'}); "
            + ("reshard_after_forward" if reshard else "kept gathered between forward and backward"),
        )
    ]
    return tuple(out)


# --------------------------------------------------------------------------------------------------------
# Findings
