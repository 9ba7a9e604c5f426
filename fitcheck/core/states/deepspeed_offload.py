"""What a DeepSpeed ``offload_optimizer`` run keeps on the device of what it offloads (pure).

deepspeed 0.19.8 (every line read from the installed source), checked on the real engine on CPU with its host-side
tensors told apart by identity (``benchmarks/deepspeed_offload_cpu.py``, tiny Llama, one gloo process):

- **The gradients.** ZeRO-2 (``runtime/zero/stage_1_and_2.py``, ``partition_gradients``) reduces each gradient at
  its hook (``process_gradients`` -> ``reduce_independent_p_g_buckets_and_remove_grads``: copied into the ipg bucket,
  ``.grad`` left a view of it; one above ``reduce_bucket_size`` kept whole until the next hook, cloned there by
  ``_offload_gradient_safety_enabled``), and ``reduce_ipg_grads``' ``cpu_offload`` branch copies the rank's part to
  the host fp32 partition (``copy_grads_in_partition`` -> ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` into
  ``single_partition_of_fp32_groups[i].grad``, on ``self.device`` = cpu). ZeRO-3 (``stage3.py``) keeps its flat
  gradient partition buffer on the host (``partition_grads``). So the device never holds the gradients made so far
  (:func:`gradients_never_on_device`); ZeRO-1 with ``overlap_comm`` reduces so in its boundary micro-step.
  ZeRO-1 otherwise reduces nothing at its hooks (``process_gradients``: ``if self.partition_gradients or
  self.overlap_comm``) and every whole ``.grad`` stays on the device until the boundary's ``reduce_gradients``
  (``accumulation.zero1_offload_keeps_grads``, ``model_states``' ``gradients.zero1_offload_whole``).
- **The staging buffer.** ``temp_grad_buffer_for_gpu_offload = torch.zeros(largest_param_numel)`` on the device, made
  in the ZeRO-1/2 optimizer's ``__init__`` and never freed (the forward's device bytes -12.8 % without it).
- **The norm copy.** Each reduced gradient's part on this rank is copied to fp64 for its norm on the device:
  ``set_norm_for_param_grad_in_gpu`` (ZeRO-1/2) and ``_offload_grad_partition_at_boundary`` ->
  ``_constant_buffered_norm2`` (ZeRO-3, in parts of 250M elements): ``.to(get_norm_dtype()).norm(2)``,
  ``runtime/zero/utils.py`` ``get_norm_dtype``: ``torch.double`` where the accelerator supports fp64 (CUDA and CPU,
  ``abstract_accelerator.py``; not MPS). The largest one is counted (:func:`offload_grad_norm_bytes`): beside the
  activations where the reduction runs at the hooks, in ZeRO-1's end-of-backward reduction moment otherwise
  (``zero_reduce.zero1_reduction_bytes``).
- **The gradient in flight.** Where the reduction runs at the hooks, the largest tensor's whole gradient between its
  ``AccumulateGrad`` and the hook that reduces it (:func:`offload_gradient_in_flight`; ZeRO-3's is
  ``sharding.zero3_gradient_in_flight``).

Real engine, device bytes, estimate vs real (forward; backward = the larger of its start and during it):
ZeRO-1 -0.02 % / -0.01 %, ZeRO-1 accumulation 2 -0.01 % / -0.01 %, ZeRO-2 -0.02 % / +2.66 %, ZeRO-2 at 64 tokens
-0.03 % / +1.51 %, ZeRO-3 -0.02 % / +2.91 % (the head moment's logits-side tensors, freed before the final norm's
hook reduces the head with its norm copy). Not modelled: on CUDA, ZeRO-3's ``grad_buffer.to(device)`` copy of each
partition beside its norm copy (a no-op on CPU), and a LoRA run's adapters (small).
"""

from __future__ import annotations

from fitcheck.core.states.sharding import largest_tensor, param_compute_bytes, partition, trainable_count
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import OffloadDevice, Strategy, TrainingSpec

_SRC_STAGING = ("deepspeed 0.19.8 runtime/zero/stage_1_and_2.py __init__: temp_grad_buffer_for_gpu_offload = "
                "torch.zeros(largest_param_numel, device=current_device_name()), never freed")
_SRC_NORM = (
    "deepspeed 0.19.8 runtime/zero/stage_1_and_2.py set_norm_for_param_grad_in_gpu and stage3.py "
    "_offload_grad_partition_at_boundary -> _constant_buffered_norm2: grad.to(get_norm_dtype()).norm(2), "
    "utils.py get_norm_dtype: torch.double where the accelerator supports fp64 (benchmarks/deepspeed_offload_cpu.py)"
)
_SRC_FLIGHT = ("deepspeed 0.19.8 runtime/zero/stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads: a "
               "gradient is whole from its AccumulateGrad to its hook, one above reduce_bucket_size until the next")


def gradients_never_on_device(spec: TrainingSpec) -> bool:
    """Whether a DeepSpeed run with ``offload_optimizer`` reduces each gradient at its hook, so that its device
    never holds the gradients made so far (ZeRO-2/3, and ZeRO-1 with ``overlap_comm``: the module docstring)."""
    sh = spec.sharding
    ds = sh.deepspeed
    if sh.strategy is not Strategy.DEEPSPEED or ds is None or not partition(spec).gradients_on_host:
        return False
    return (sh.zero_stage or 0) >= 2 or ds.overlaps_comm


def offload_grad_norm_bytes(spec: TrainingSpec) -> int:
    """Bytes of the fp64 copy of the largest gradient's part on this rank, made on the device for its norm when it
    is reduced (the module docstring); 0 for a run without ``offload_optimizer`` or without a full fine-tune."""
    sh = spec.sharding
    ds = sh.deepspeed
    if sh.strategy is not Strategy.DEEPSPEED or ds is None or not partition(spec).optimizer_on_host:
        return 0
    largest = largest_tensor(spec) if spec.lora is None and trainable_count(spec) else 0
    n = spec.data_parallel_size
    if ds.stage == 3:  # each parameter's partition, normed in parts of 250M elements
        return 8 * min(-(-largest // n), 250_000_000)
    return 8 * min(largest, -(-trainable_count(spec) // n))  # the part of it in the rank's flat partition


def offload_gradient_in_flight(spec: TrainingSpec) -> int:
    """Bytes of the largest tensor's whole gradient a ZeRO-1/2 ``offload_optimizer`` run that reduces at its hooks
    (:func:`gradients_never_on_device`) holds until its hook reduces it; 0 otherwise (ZeRO-3's:
    ``sharding.zero3_gradient_in_flight``)."""
    if not gradients_never_on_device(spec) or spec.sharding.zero_stage == 3 or spec.lora is not None:
        return 0
    return largest_tensor(spec) * param_compute_bytes(spec) if trainable_count(spec) else 0


def offload_components(spec: TrainingSpec) -> list[Component]:
    """The device buffers of a DeepSpeed ``offload_optimizer`` run (the module docstring): ZeRO-1/2's staging
    buffer, and in ``Phase.BACKWARD`` the norm copy and the gradient in flight where the reduction runs at the
    hooks."""
    ds = spec.sharding.deepspeed
    if spec.sharding.strategy is not Strategy.DEEPSPEED or ds is None or ds.offload_optimizer is OffloadDevice.NONE:
        return []
    out: list[Component] = []
    largest = largest_tensor(spec) if spec.lora is None and trainable_count(spec) else 0
    if ds.stage in (1, 2) and largest:
        out.append(Component.persistent(
            "buffers.deepspeed_offload_staging", Category.BUFFERS, largest * param_compute_bytes(spec), _SRC_STAGING,
            f"device staging buffer of the largest parameter ({largest:,} elements), from initialize on"))
    norm = offload_grad_norm_bytes(spec)
    if norm and gradients_never_on_device(spec):
        out.append(Component("buffers.deepspeed_offload_grad_norm", Category.BUFFERS, Location.DEVICE,
                             {p: norm if p is Phase.BACKWARD else 0 for p in PHASES}, _SRC_NORM,
                             "fp64 copy of the largest gradient's part on this rank, for its norm"))
    flight = offload_gradient_in_flight(spec)
    if flight:
        out.append(Component("buffers.deepspeed_offload_gradient_in_flight", Category.BUFFERS, Location.DEVICE,
                             {p: flight if p is Phase.BACKWARD else 0 for p in PHASES}, _SRC_FLIGHT,
                             "the largest tensor's whole gradient until its hook reduces it"))
    return out
