"""DeepSpeed's side CUDA streams: the caching-allocator pools that stay reserved beside the step's own.

torch's caching allocator keeps a freed block for the stream it was allocated on ("Allocations are associated with
a stream. Once freed, blocks can be re-allocated on the same stream, but not on any other stream": the header of
``c10/cuda/CUDACachingAllocator.cpp``; ``get_free_block`` looks up blocks keyed by stream first, the order of
``BlockComparatorSize``). What DeepSpeed allocates inside ``with get_accelerator().stream(side_stream)`` therefore
stays cached in that stream's pool after it is freed, and the default stream's activations cannot use it. Nothing
calls ``empty_cache`` between steps. Reserved = the default stream's reserved + these pools (the same composition
as FSDP's, :mod:`.fsdp_streams`).

What DeepSpeed 0.19.8 allocates on its side streams (on CUDA; ``is_synchronized_device`` accelerators have none):

* ZeRO-1/2 (``runtime/zero/stage_1_and_2.py``) with ``overlap_comm``: ``reduce_ipg_grads`` runs ``with
  get_accelerator().stream(self.reduction_stream)`` and, with ``contiguous_gradients``, calls
  ``copy_grads_in_partition``, whose first call of each backward allocates ``self.grads_in_partition =
  torch.empty(total numel of params_in_partition, dtype=self.dtype)`` there: this rank's gradient partition in
  the model dtype. It is dropped by ``_release_ipg_buffers`` and the gradients that view it are cleared after the
  optimizer step, so it is freed into the reduction stream's pool every step and allocated there again in the
  next backward (the ipg buckets themselves are made in ``setup_buckets`` on the default stream). Without
  ``contiguous_gradients`` the reduction stream flattens one bucket at a time (``allreduce_and_copy`` ->
  ``allreduce_bucket``: at most ``reduce_bucket_size`` elements). ``overlap_comm`` defaults to off for these
  stages (``zero/config.py`` ``overlap_comm_valid``); off, everything runs on the default stream.
* ZeRO-3 (``runtime/zero/stage3.py``): ``__reduce_and_partition_ipg_grads`` runs in
  ``reduce_and_partition_stream``; ``reduce_scatter_coalesced`` (``runtime/comm/coalesced_collectives.py``)
  concatenates a bucket of several gradients (at most ``reduce_bucket_size`` elements) into a new flat tensor there
  (one gradient that needs no padding is reduced in place), which ``partition_grads`` then copies into the
  persistent ``grad_partitions_flat_buffer`` (default stream, allocated at initialize: ``Partition.
  gradients_resident``). With more than one process the parameter gathers run ``with
  get_accelerator().stream(self.__allgather_stream)`` (``partitioned_param_coordinator.py`` ``fetch_sub_module``
  / ``__all_gather_params``: ``partition_parameters.py`` ``_all_gather_coalesced`` allocates the gathered flat
  tensors there); at one process nothing is gathered (``_no_gather_coalesced``).

What this does not model: the default stream's own fragmentation by DeepSpeed's flat buffers (the fp32 master
and gradient partitions, the flat bf16 copy at initialize), which the published gap of ``core/allocator.py``
stands for, and the gather pool's own fragmentation (its peak live bytes are taken as its size).

Pure: no torch, no environment.
"""

from __future__ import annotations

from collections.abc import Iterator

from fitcheck.core.caching import AllocatorConf, replay
from fitcheck.core.states.fsdp_streams import SidePools
from fitcheck.core.states.layout import all_trainable, build_layout
from fitcheck.core.states.sharding import buffer_components, param_compute_bytes, partition
from fitcheck.report import PHASES, Phase
from fitcheck.spec import DeviceType, OffloadDevice, Strategy, TrainingSpec
from fitcheck.units import format_bytes

_SRC = ("torch CUDACachingAllocator.cpp (a freed block is re-allocated on its own stream only: get_free_block); "
        "deepspeed 0.19.8 runtime/zero/stage_1_and_2.py reduce_ipg_grads / copy_grads_in_partition "
        "(grads_in_partition in reduction_stream), stage3.py __reduce_and_partition_ipg_grads "
        "(reduce_and_partition_stream), comm/coalesced_collectives.py reduce_scatter_coalesced, "
        "partitioned_param_coordinator.py (__allgather_stream) (fitcheck/core/states/deepspeed_streams.py)")
_STEPS = 2  # two steps, so that what step 1 freed is reused in step 2, as on the GPU


def _each_step(nbytes: int, count: int = 1) -> Iterator[tuple[str, int, int]]:
    """``count`` blocks of ``nbytes`` allocated one after the other (each freed before the next) per step."""
    h = 0
    for _ in range(_STEPS):
        for _ in range(count):
            h += 1
            yield "alloc", h, nbytes
            yield "free", h, 0


def _pool(nbytes: int, conf: AllocatorConf) -> int:
    """The reserved bytes a side stream keeps for blocks of ``nbytes`` allocated and freed every step."""
    return replay(_each_step(nbytes), conf).peak_reserved if nbytes > 0 else 0


def deepspeed_side_pools(spec: TrainingSpec, conf: AllocatorConf) -> SidePools | None:
    """The bytes DeepSpeed's side streams keep reserved on one GPU.

    Args:
        spec: The training spec.
        conf: The run's caching-allocator settings.

    Returns:
        The side pools, or None when the run is not DeepSpeed ZeRO on CUDA or allocates nothing on a side stream.
    """
    sh = spec.sharding
    ds = sh.deepspeed
    if sh.strategy is not Strategy.DEEPSPEED or ds is None or spec.hardware.device_type is DeviceType.CPU:
        return None
    stage = sh.zero_stage or 0
    overlap = ds.overlaps_comm
    trainable = all_trainable(build_layout(spec))
    numel = sum(g.numel_each * g.repeat for g in trainable)
    if not numel or stage == 0:
        return None
    part = partition(spec)
    elem = param_compute_bytes(spec)
    n = max(spec.data_parallel_size, 1)
    live = dict.fromkeys(PHASES, 0)
    gather = reduce = 0
    what = ""
    if stage in (1, 2):
        if not overlap or ds.offload_optimizer is not OffloadDevice.NONE:
            return None  # the default stream does the reduction (cpu offload copies on the default stream too)
        if ds.contiguous_gradients:
            grads = -(-numel // n) * elem  # this rank's partition (whole parameters: ~numel / n)
            reduce = _pool(grads, conf)
            # the sharded gradients the step counts as allocated (model_states "gradients") are this block
            live = {p: 0 if p in (Phase.FORWARD_END, Phase.BACKWARD_START) and spec.batch.grad_accum == 1
                    else grads for p in PHASES}
            what = f"ZeRO-{stage} reduction stream: the gradient partition {format_bytes(grads)} (grads_in_partition)"
        else:
            bucket = min(ds.reduce_bucket_size, numel) * elem
            reduce = _pool(bucket, conf)
            what = f"ZeRO-{stage} reduction stream: one flattened bucket {format_bytes(bucket)}"
    else:
        if not overlap:  # stage3.py / parameter_offload.py: both streams are the default stream then
            return None
        bucket = min(ds.reduce_bucket_size, numel) * elem
        reduce = _pool(bucket, conf)
        what = f"ZeRO-3 reduce-and-partition stream: one concatenated bucket {format_bytes(bucket)}"
        if n > 1 and not part.params_on_host:
            comps = [c for c in buffer_components(spec) if c.name == "buffers.zero3_gathered_params"]
            peak = max((c.at(p) for c in comps for p in PHASES), default=0)
            gather = _pool(peak, conf)
            for c in comps:
                for p in PHASES:
                    live[p] += c.at(p)
            what += f"; allgather stream: gathered parameters {format_bytes(peak)}"
    if gather + reduce == 0:
        return None
    return SidePools(gather=gather, reduce=reduce, live=live, code="deepspeed-side-streams",
                     detail=f"DeepSpeed side streams: {what}, cached beside the step's own pool", source=_SRC)
