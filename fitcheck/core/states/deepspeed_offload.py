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
  (``zero_reduce.zero1_reduction_bytes``). It is alive only inside a hook's reduction, never inside an autograd node:
  the largest one (the LM head's) is made at the final norm's hook (ZeRO-2 ``extra_large_param_to_reduce``; ZeRO-3
  ``reduce_independent_p_g_buckets_and_remove_grads`` reduces the bucket holding the head when the next gradient
  does not fit), after the head's backward freed the logits-side tensors, beside forward's saved activations and
  the final norm's input gradient (real engine listing, ZeRO-2 and ZeRO-3: ``_to_copy`` fp64 of the head's
  gradient, the head's gradient, the ipg bucket, no logits). So it counts in ``Phase.BACKWARD`` by what that
  reduction moment holds above the activations' worst backward moment (:func:`offload_grad_norm_component`; session
  22 added it to every moment, the head's with its logits: +1.5 .. +2.9 % on the real engine).
- **The gradient in flight.** Where the reduction runs at the hooks, the largest tensor's whole gradient between its
  ``AccumulateGrad`` and the hook that reduces it (:func:`offload_gradient_in_flight`; ZeRO-3's is
  ``sharding.zero3_gradient_in_flight``).

Real engine, device bytes, estimate vs real (forward; backward = the larger of its start and during it):
ZeRO-1 -0.02 % / -0.01 %, ZeRO-1 accumulation 2 -0.01 % / -0.01 %, ZeRO-2 -0.02 % / +0.52 %, ZeRO-2 at 64 tokens
-0.03 % / -0.00 %, ZeRO-3 -0.02 % / +0.57 % (forward's saved activations as the start of backward counts them: the
final norm's own saved input, freed by its backward before its hook, is still in). Not modelled: on CUDA, ZeRO-3's
``grad_buffer.to(device)`` copy of each partition beside its norm copy (a no-op on CPU), and a LoRA run's adapters
(small).
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


def offload_grad_norm_component(spec: TrainingSpec, activations: tuple[Component, ...]) -> Component | None:
    """The fp64 norm copy where the reduction runs at the hooks (:func:`gradients_never_on_device`), as what the
    head's reduction at the final norm's hook holds above the activations' worst backward moment (the module
    docstring): forward's saved activations (``activations``' device ``Category.ACTIVATIONS`` bytes at the start of
    backward, the logits left out: freed by the head's backward), the final norm's input gradient (b·s·h in the
    compute dtype: DeepSpeed casts the module, ``engine.py`` ``_cast_module_mixed_precision``) and the copy, less
    ``activations``' own ``Phase.BACKWARD`` bytes (the whole copy where the head's moment, logits included, holds
    more than the saved activations and the input gradient: always on the real engine); None when that moment is
    not above them or there is no copy.

    Args:
        spec: The step's spec.
        activations: The activation components, formula or traced.

    Returns:
        The component (``Phase.BACKWARD`` only), or None.
    """
    norm = offload_grad_norm_bytes(spec)
    if not norm or not gradients_never_on_device(spec):
        return None
    device = [c for c in activations if c.location is Location.DEVICE]
    saved = sum(c.at(Phase.BACKWARD_START) for c in device if c.category is Category.ACTIVATIONS)
    residual = spec.batch.micro_batch * spec.batch.seq_len * spec.model.shape.hidden_size * param_compute_bytes(spec)
    extra = saved + residual + norm - sum(c.at(Phase.BACKWARD) for c in device)
    if extra <= 0:
        return None
    return Component("buffers.deepspeed_offload_grad_norm", Category.BUFFERS, Location.DEVICE,
                     {p: extra if p is Phase.BACKWARD else 0 for p in PHASES}, _SRC_NORM,
                     f"fp64 copy of the largest gradient's part on this rank ({norm:,} B), made at the final norm's "
                     "hook beside forward's saved activations, above the activations' worst backward moment")


def offload_components(spec: TrainingSpec) -> list[Component]:
    """The device buffers of a DeepSpeed ``offload_optimizer`` run (the module docstring): ZeRO-1/2's staging
    buffer, and in ``Phase.BACKWARD`` the gradient in flight where the reduction runs at the hooks (the norm copy
    there: :func:`offload_grad_norm_component`, which needs the activations)."""
    ds = spec.sharding.deepspeed
    if spec.sharding.strategy is not Strategy.DEEPSPEED or ds is None or ds.offload_optimizer is OffloadDevice.NONE:
        return []
    out: list[Component] = []
    largest = largest_tensor(spec) if spec.lora is None and trainable_count(spec) else 0
    if ds.stage in (1, 2) and largest:
        out.append(Component.persistent(
            "buffers.deepspeed_offload_staging", Category.BUFFERS, largest * param_compute_bytes(spec), _SRC_STAGING,
            f"device staging buffer of the largest parameter ({largest:,} elements), from initialize on"))
    flight = offload_gradient_in_flight(spec)
    if flight:
        out.append(Component("buffers.deepspeed_offload_gradient_in_flight", Category.BUFFERS, Location.DEVICE,
                             {p: flight if p is Phase.BACKWARD else 0 for p in PHASES}, _SRC_FLIGHT,
                             "the largest tensor's whole gradient until its hook reduces it"))
    return out
