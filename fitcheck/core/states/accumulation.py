"""Gradient accumulation: whether a later micro-step adds its gradients into the ``.grad`` the window holds (pure).

The one home of that rule (:func:`accumulates_in_grad`), read by the backward moments
(``core/activations/backward.py`` and the moments that are not modelled for an accumulating micro-step) and by the
traced default path (``torch_adapters/run_scope.py``, which reads its one traced pass as such a micro-step).

torch 2.13 ``torch/csrc/autograd/functions/accumulate_grad.h``: in the first micro-step after
``zero_grad(set_to_none=True)`` each new gradient is stolen and becomes ``.grad``; where ``.grad`` already exists
the new gradient is a temporary added into it in place. Whether it exists at a later micro-step depends on what the
engine does with ``.grad`` between micro-steps. Measured by ``benchmarks/accumulation_engines_cpu.py`` (the real
engines on CPU gloo, the tiny Llama h128 x 2 layers, 2 x 32 tokens, accumulation 2: a tensor hook on every leaf
autograd accumulates into sees, before its ``AccumulateGrad``, the ``.grad`` the leaf holds), micro-step 2:

============================  =======================================================  =========
run                           ``.grad`` held when the new gradient arrives             rule
============================  =======================================================  =========
one process, DDP (no_sync)    all 21, whole, bf16 (1,115,392 B)                        True
DeepSpeed ZeRO-0 (bf16)       all 21, whole, bf16                                      True
DeepSpeed ZeRO-1              all 21, whole, bf16                                      True
DeepSpeed ZeRO-1 overlap      all 21, whole, bf16                                      True
DeepSpeed ZeRO-2              none (the carried partition: ``zero_reduce``)            False
DeepSpeed ZeRO-3              none (the resident flat partition buffer)                False
FSDP2 (Trainer, 1 / 2 ranks)  all 21 unsharded parameters, whole, bf16                 True
FSDP1 (Trainer, 2 ranks)      all 3 flat parameters, whole (unsharded), bf16           True
FSDP1 (Trainer, 1 rank)       all 3 flat parameters, whole, fp32 (reduced, NO_SHARD)   True
FSDP2, ``sync_each_batch``    none (reduced into the sharded ``.grad`` each step)      False
FSDP1 2 ranks, sync_each      none (the shard moved to ``_saved_grad_shard``)          False
============================  =======================================================  =========

Sources of each row:

- DDP: transformers 5.23 ``trainer.py`` l.1896-1908 runs every micro-step but the last under
  ``accelerator.no_sync(model)``; accelerate 1.15 ``accelerator.py`` l.1172-1178 enters ``model.no_sync`` (DDP
  keeps ``.grad`` and skips the all-reduce). One process without a wrapper: ``.grad`` is never touched.
- DeepSpeed: the Trainer runs it under ``nullcontext`` (``trainer.py`` l.1896-1903). deepspeed 0.19.8
  ``runtime/engine.py`` ``allreduce_gradients`` reduces ZeRO-0/1 only at the accumulation boundary; ZeRO-1's hook
  (``runtime/zero/stage_1_and_2.py`` ``reduce_ready_partitions_and_remove_grads``: ``if self.partition_gradients or
  self.is_gradient_accumulation_boundary()``) moves nothing on a micro-step before the boundary, with or without
  ``overlap_comm``; ZeRO-2's hook moves every gradient into the bucket and the epilogue clears ``.grad``
  (``independent_gradient_partition_epilogue``); ZeRO-3 reduces each gradient into ``grad_partitions_flat_buffer``
  (``stage3.py`` ``partition_grads``: ``copy_`` at micro-step 0, ``add_`` after) and frees it. Not measured: a
  ZeRO-1 ``data_types.grad_accum_dtype`` other than the model's (``use_grad_accum_attribute`` moves each gradient
  into an fp32 ``grad_accum`` attribute; not read by fitcheck).
- FSDP: accelerate's ``no_sync`` is FSDP2's ``set_requires_gradient_sync(False)`` on any number of processes
  (torch 2.13 ``_fsdp_param_group.py`` ``post_backward`` returns before the reduce, the unsharded ``.grad`` stays)
  and FSDP1's ``model.no_sync`` on more than one (``_flat_param.py`` ``prepare_gradient_for_backward`` keeps an
  unsharded ``.grad``). On one process FSDP1 clamps to ``NO_SHARD`` (``_init_utils.py`` l.427) and reduces every
  micro-step into ``.grad`` itself (``_runtime_utils.py`` ``_reduce_grad_no_shard``: "directly covers any gradient
  accumulation"), which ``prepare_gradient_for_backward`` leaves in place (its size is the unsharded one). With
  accelerate's ``sync_each_batch`` no ``no_sync`` is entered: FSDP2 reduces into the sharded parameter's ``.grad``
  and frees the unsharded one; a sharded FSDP1 moves its shard to ``_saved_grad_shard`` and sets ``.grad = None``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.optimizers import TensorGroup
from fitcheck.core.states.deepspeed_offload import gradients_never_on_device
from fitcheck.core.states.layout import all_trainable, build_layout, total_bytes, total_numel
from fitcheck.core.states.sharding import contiguous_reduction, param_compute_bytes, partition
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import Strategy, TrainingSpec

_SRC_ZERO1_OFFLOAD = ("deepspeed 0.19.8 runtime/zero/stage_1_and_2.py process_gradients (no reduction at a ZeRO-1 "
                      "hook without overlap_comm), engine.py allreduce_gradients (reduce_gradients at the boundary)")


def accumulates_in_grad(spec: TrainingSpec) -> bool:
    """Whether a later micro-step of the run's gradient accumulation window holds every trainable leaf's ``.grad``
    from its start, each new gradient a temporary beside it until its ``AccumulateGrad`` adds it in place.

    Args:
        spec: The training spec.

    Returns:
        False without accumulation (``gradient_accumulation_steps`` 1), under DeepSpeed ZeRO-2/3 and under FSDP with
        accelerate's ``sync_each_batch`` (but an FSDP1 ``NO_SHARD`` or one-process run); True otherwise (one process,
        DDP, DeepSpeed ZeRO-0/1, FSDP1 and FSDP2 under ``no_sync``). The module docstring has the measurements.
    """
    if spec.batch.grad_accum <= 1:
        return False
    sh = spec.sharding
    if sh.strategy is Strategy.DEEPSPEED:
        return (sh.zero_stage or 0) < 2
    fs = sh.fsdp
    if sh.strategy is not Strategy.FSDP or fs is None or not fs.sync_each_batch:
        return True
    return fs.version == 1 and (fs.sharding_strategy == "NO_SHARD" or spec.data_parallel_size == 1)


def gradients_held_from_start(spec: TrainingSpec) -> bool:
    """Whether a micro-step starts its backward with every byte the gradients component counts (``model_states``)
    already held, so that a moment of backward subtracts no gradient "not made yet".

    - A later micro-step of an accumulation window (``gradient_accumulation_steps`` > 1), whether it holds each
      ``.grad`` (:func:`accumulates_in_grad`), FSDP's reduced shards (``sync_each_batch``) or ZeRO-3's resident flat
      buffer (micro-step 2's end of forward less micro-step 1's, ``benchmarks/accumulation_engines_cpu.py``, 2 x 32
      tokens: ZeRO-3 0 B, FSDP2 ``sync_each_batch`` on one process the 2,230,784 B of fp32 shards, DDP, ZeRO-0,
      FSDP2 and two-rank FSDP1 the 1,115,392 B of bf16 ``.grad``). ZeRO-2's partition carried beside the new one is
      ``zero_reduce.zero2_backward_grads``' (the moments read it first).
    - Every micro-step of a run whose gradient partition is a buffer allocated once and never freed
      (``sharding.Partition.gradients_resident``: ZeRO-3 on the device; deepspeed 0.19.8 ``runtime/zero/stage3.py``
      ``grad_partitions_flat_buffer = torch.zeros(...)`` at optimizer init, each reduced gradient ``copy_``-ed into
      its ``narrow`` by ``partition_grads``), the first one and runs without accumulation included: the counted
      bytes exist before any gradient is made. The real engine's micro-step 1 equals its micro-step 2 byte for byte
      (``accumulation_engines_cpu.json``, ``zero3`` rows). Each new whole gradient on its way into that buffer is
      ``buffers.zero3_gathered_params``' (the largest tensor's gradient, ``sharding._zero3``).

    - Every micro-step of a DeepSpeed ZeRO-2/3 run with ``offload_optimizer`` (:func:`gradients_never_on_device`):
      the gradients component counts no device byte (``Location.HOST``), so there is nothing to subtract; each new
      gradient in flight is the moment's own (the head's ``head_grad``) or ZeRO-3's ``zero3_gradient_in_flight``.

    Args:
        spec: The training spec.

    Returns:
        True with gradient accumulation, with ZeRO-3's resident gradient buffer, or with ZeRO-2/3 gradients offloaded.
    """
    return spec.batch.grad_accum > 1 or partition(spec).gradients_resident or gradients_never_on_device(spec)


def zero1_offload_keeps_grads(spec: TrainingSpec) -> bool:
    """Whether a DeepSpeed ZeRO-1 run with ``offload_optimizer`` (without ``overlap_comm``, or accumulating: the
    micro-steps before the boundary reduce nothing, ``reduce_ready_partitions_and_remove_grads``) holds every whole
    ``.grad`` on the device in the module's dtype until the boundary's end-of-backward reduction, while its
    gradients component counts only the host fp32 partition: deepspeed 0.19.8 ``stage_1_and_2.py``
    ``process_gradients`` reduces at a hook only ``if self.partition_gradients or self.overlap_comm``, and
    ``engine.py`` ``allreduce_gradients`` calls ``reduce_gradients`` only at the accumulation boundary; there each
    gradient is copied into the ipg bucket (``.grad`` becomes its view) and the rank's part to the host
    (``reduce_ipg_grads``' ``cpu_offload`` branch; ``core/states/deepspeed_offload.py``). ``model_states`` counts
    these ``.grad`` as the device component ``gradients.zero1_offload_whole`` (in ``Phase.BACKWARD``; from the end
    of forward only in a later micro-step). Real engine (``benchmarks/deepspeed_offload_cpu.py``): backward -48.1 %
    without it, -0.01 % with it and the norm copy."""
    sh = spec.sharding
    ds = sh.deepspeed
    if sh.strategy is not Strategy.DEEPSPEED or sh.zero_stage != 1 or ds is None:
        return False
    return partition(spec).gradients_on_host and (not ds.overlaps_comm or accumulates_in_grad(spec))


def zero1_offload_grads(spec: TrainingSpec, grad_bytes: int) -> Component | None:
    """``model_states``' device component of the whole ``.grad`` a ZeRO-1 + offload run holds
    (:func:`zero1_offload_keeps_grads`; ``grad_bytes``: every trainable gradient in the module's dtype), or None."""
    if not zero1_offload_keeps_grads(spec):
        return None
    held = (Phase.BACKWARD, *((Phase.FORWARD_END, Phase.BACKWARD_START) if accumulates_in_grad(spec) else ()))
    return Component("gradients.zero1_offload_whole", Category.GRADIENTS, Location.DEVICE,
                     {p: grad_bytes if p in held else 0 for p in PHASES}, _SRC_ZERO1_OFFLOAD,
                     "every whole .grad, kept on the device until the boundary's reduction")


def zero1_overlap_keeps_grads(spec: TrainingSpec) -> bool:
    """Whether a DeepSpeed ZeRO-1 run that reduces during backward (``overlap_comm``, ``contiguous_gradients``, no
    offload: its gradients counted as the rank's partition, ``sharding.partition``) keeps every ``.grad`` whole
    between accumulation micro-steps: its hook reduces only at the boundary (the module docstring), so until then
    the rank holds the whole model's gradients in the module's dtype. Real engine, tiny Llama (h128, 16 tokens),
    rank 1 of 8 on torch's fake process group, accumulation 2 (``benchmarks/deepspeed_cpu.py``
    ``CASES["zero1-overlap-8-ranks-accum2"]``): forward -27.35 % with the partition counted, -1.73 % with this,
    -0.01 % with its ipg buckets held until the boundary too (``sharding.py``)."""
    return (spec.sharding.zero_stage == 1 and contiguous_reduction(spec, during_backward=True) is not None
            and accumulates_in_grad(spec))


# --- what FSDP keeps between accumulation micro-steps (the gradient component and sharding_findings read it) ---


def fsdp_unsharded_kept(spec: TrainingSpec, groups: list[TensorGroup], grad_bytes: int) -> int:
    """Bytes of the unsharded gradients FSDP keeps between accumulation micro-steps (``no_sync``).

    FSDP2 keeps each unsharded parameter's ``.grad``, in ``MixedPrecisionPolicy.param_dtype`` (torch 2.13
    ``_fsdp_param_group.py`` ``post_backward``: returns before the reduce when ``reduce_grads`` is False;
    ``_fsdp_param.py`` ``to_accumulated_grad_if_needed``: no upcast while ``reduce_dtype`` equals ``param_dtype``),
    not in the fp32 of accelerate's upcast shards: the real runs of ``benchmarks/fsdp2_run_events_cpu.py``
    (``benchmarks/data/fsdp2_run_events_cpu.json``, ``accum2``: 2 bytes per parameter after the first
    micro-batch at world sizes 1 and 2).

    FSDP1 on more than one process keeps each flat parameter's unsharded ``.grad`` in ``param_dtype`` too: torch
    2.13 ``distributed/fsdp/_runtime_utils.py`` ``_post_backward_hook`` returns after the reshard when
    ``state._sync_gradients`` is False, before the ``.to(reduce_dtype)`` and the reduction, so ``.grad`` stays the
    gradient autograd made for the unsharded ``param_dtype`` flat parameter (``_finalize_params`` keeps it; the
    real runs of ``benchmarks/fsdp2_run_events_cpu.py --version 1``, ``benchmarks/data/fsdp1_run_events_cpu.json``,
    ``accum2`` / ``lora_accum2``: 2 bytes per trainable parameter after the first micro-batch at world sizes 2 and
    3). On one process accelerate 1.15 ``accelerator.py`` ``no_sync`` is a ``nullcontext`` (``use_distributed``
    is False), so every micro-batch is reduced and cast (``_reduce_grad_no_shard``): the trainable groups' own
    bytes (fp32 after the upcast), the same as ``grad_bytes``.
    """
    if fsdp_no_sync(spec):
        return total_numel(groups) * param_compute_bytes(spec)
    return grad_bytes


def fsdp_no_sync(spec: TrainingSpec) -> bool:
    """Whether accelerate skips FSDP's gradient reduction on accumulation micro-steps.

    accelerate 1.15 ``accelerator.py`` ``Accelerator.no_sync``: FSDP2 ``set_requires_gradient_sync(False)`` on any
    number of processes; FSDP1 ``model.no_sync`` only where ``use_distributed`` (more than one process).

    Args:
        spec: The training spec.

    Returns:
        True for FSDP2, and for FSDP1 on more than one process.
    """
    fs = spec.sharding.fsdp
    no_sync = fs is not None and (fs.version == 2 or spec.sharding.num_processes > 1)
    return spec.sharding.strategy is Strategy.FSDP and no_sync


@dataclass(frozen=True)
class KeptGradients:
    """The trainable parameters' gradients across FSDP accumulation micro-steps, as the gradient component counts
    them.

    Attributes:
        numel: Trainable parameters.
        kept: Bytes per GPU kept between micro-steps (unsharded).
        synced: Bytes per GPU of the reduced gradient shards (every micro-step reduced: ``sync_each_batch``).
    """

    numel: int
    kept: int
    synced: int


def kept_gradients(spec: TrainingSpec) -> KeptGradients:
    """What :func:`model_state_components`' ``gradients`` holds between micro-steps and after a synced one.

    Args:
        spec: The training spec.

    Returns:
        The trainable count and both byte counts (the same functions as the component: no second formula).
    """
    groups = all_trainable(build_layout(spec))
    grad_bytes = total_bytes(groups)
    return KeptGradients(total_numel(groups), fsdp_unsharded_kept(spec, groups, grad_bytes),
                         -(-grad_bytes // partition(spec).gradients))
