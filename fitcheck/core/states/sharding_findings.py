"""What the user should know about the sharding setup: ZeRO with one process, ZeRO-3 with LoRA, oversize
DeepSpeed buckets, DeepSpeed's own host-RAM estimate under offload, FSDP accumulation without
``sync_each_batch``, FSDP ``NO_WRAP``, DDP's bucket copy of the gradients.

The divisions and buffers themselves are :mod:`fitcheck.core.states.sharding`'s.
"""

from __future__ import annotations

from fitcheck.core.states.accumulation import fsdp_no_sync, kept_gradients
from fitcheck.core.states.fsdp1_prefetch import fsdp1_forward_prefetch_findings
from fitcheck.core.states.fsdp_mixed_units import mixed_unit_findings, mixed_unit_frozen_params
from fitcheck.core.states.layout import ds_cpu_optimizer
from fitcheck.core.states.sharding import (
    fsdp_unit_params,
    grad_element_bytes,
    param_compute_bytes,
    partition,
    trainable_count,
)
from fitcheck.findings import Finding, Severity
from fitcheck.spec import DeepSpeedSpec, DeviceType, FsdpSpec, OffloadDevice, Strategy, TrainingSpec
from fitcheck.units import format_bytes

_DS_CPU_FACTOR = 1.5  # deepspeed estimate_zero2/3_model_states_mem_needs additional_buffer_factor default


def sharding_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """What the user should know about the sharding setup.

    Args:
        spec: The training spec.

    Returns:
        Findings (LoRA under ZeRO-3, FSDP accumulation without sync_each_batch, oversize DeepSpeed buckets,
        DDP bucket views, host RAM under offload, ZeRO with one process).
    """
    sh = spec.sharding
    n = spec.data_parallel_size
    out: list[Finding] = []
    trainable = trainable_count(spec)
    if sh.strategy is Strategy.DEEPSPEED and sh.deepspeed is not None:
        out.extend(_deepspeed_findings(spec, sh.deepspeed, trainable))
    if sh.strategy is Strategy.FSDP and n > 1:
        out.extend(_fsdp_findings(spec, sh.fsdp))
    out.extend(mixed_unit_findings(spec, param_compute_bytes(spec)))  # FSDP1 units holding frozen and trainable
    if sh.strategy is Strategy.DDP and n > 1 and trainable:
        out.append(
            Finding(
                "ddp-bucket-copy",
                Severity.INFO,
                f"DDP keeps a second copy of all gradients in its buckets "
                f"({format_bytes(trainable * grad_element_bytes(spec))})",
                "pass ddp kwargs gradient_as_bucket_view=True to make gradients views of the buckets",
            )
        )
    return tuple(out)


def _deepspeed_findings(spec: TrainingSpec, ds: DeepSpeedSpec, trainable: int) -> list[Finding]:
    """ZeRO with one process, ZeRO-3 with LoRA, oversize reduce buckets, DeepSpeed's host-RAM reference."""
    n = spec.data_parallel_size
    out: list[Finding] = []
    name = spec.optimizer.name
    if ds_cpu_optimizer(spec) is not None and not name.startswith("adamw_torch"):
        out.append(
            Finding(
                "ds-cpu-optimizer",
                Severity.WARNING if "8bit" in name or name.startswith("paged_") else Severity.INFO,
                f"optim {name} under ZeRO optimizer offload: accelerate replaces it with DeepSpeedCPUAdam "
                "(accelerate utils/deepspeed.py map_pytorch_optim_to_deepspeed): fp32 exp_avg + exp_avg_sq, "
                f"8 B per trainable parameter on the host, are counted, not {name}'s own states",
                "keep it (the host holds the fp32 states), or drop --offload_optimizer to keep this optimizer's "
                "states on the GPU",
            )
        )
    if n == 1 and ds.stage >= 1:
        out.append(
            Finding(
                "zero-single-process",
                Severity.INFO,
                f"ZeRO-{ds.stage} with one process partitions nothing (1/1 of every state)",
                "ZeRO saves memory only with several GPUs, or with offload_optimizer / offload_param",
            )
        )
    if ds.stage == 3 and spec.lora is not None:
        out.append(
            Finding(
                "zero3-shards-frozen",
                Severity.INFO,
                "ZeRO-3 partitions the frozen base weights too; only the adapters have gradients "
                "and optimizer states",
                "",
            )
        )
    if ds.stage in (1, 2) and 0 < trainable < ds.reduce_bucket_size:
        copies = 2 if ds.overlaps_comm else 1
        out.append(
            Finding(
                "deepspeed-bucket-oversize",
                Severity.WARNING,
                f"zero_optimization.reduce_bucket_size {ds.reduce_bucket_size:,} "
                f"exceeds the {trainable:,} trainable "
                f"params, yet DeepSpeed allocates the whole bucket ({copies} x "
                f"{format_bytes(ds.reduce_bucket_size * param_compute_bytes(spec))})",
                f'set reduce_bucket_size to "auto" or to about {max(trainable, 1):,}',
            )
        )
    if ds.offload_optimizer is not OffloadDevice.NONE:
        out.append(_deepspeed_host_reference(spec, trainable))
    return out


def _fsdp_findings(spec: TrainingSpec, fs: FsdpSpec | None) -> list[Finding]:
    """FSDP accumulation without sync_each_batch, and NO_WRAP."""
    out: list[Finding] = []
    if partition(spec).full_gradients_between_microsteps:
        out.append(_accumulation_finding(spec, fs))
    out.extend(fsdp1_forward_prefetch_findings(spec, fsdp_unit_params(spec) * param_compute_bytes(spec)))
    unlimited = _unlimited_gathers_finding(spec, fs)
    if unlimited is not None:
        out.append(unlimited)
    if fs is not None and fs.auto_wrap_policy == "NO_WRAP":
        out.append(
            Finding(
                "fsdp-no-wrap",
                Severity.WARNING,
                "fsdp_auto_wrap_policy NO_WRAP: the whole model is one unit and is gathered in "
                "full for forward and backward",
                "use TRANSFORMER_BASED_WRAP",
            )
        )
    return out


def _unlimited_gathers_finding(spec: TrainingSpec, fs: FsdpSpec | None) -> Finding | None:
    """FSDP1 with ``limit_all_gathers=False`` on CUDA, sharded: not modelled (unpins the answer).

    torch 2.13 ``distributed/fsdp/_runtime_utils.py``: with the limiter, ``_unshard`` waits
    (``event.synchronize()``) for the free event of the flat parameter resharded two gathers back
    (``_free_event_queue.dequeue_if_needed``, ``_limiter_utils.py`` ``_max_num_inflight_all_gathers`` 2;
    ``_reshard`` enqueues one per freed unsharded flat parameter) -- the two in flight that
    ``core/states/fsdp_streams.py``'s unshard-stream pool and the FSDP1 replay assume. Without it nothing holds the
    CPU back in forward or backward until the Trainer's loss check after backward: the device's allocated bytes are
    the same (each flat parameter is freed when the CPU reaches its reshard), but a freed block waits for the device
    to pass its use (``record_stream``) before the unshard stream reuses it, so that pool can grow up to every
    unit's unsharded flat parameter. How far the CPU runs ahead is a matter of timing, not of the source: not
    modelled, bounded in the message."""
    if fs is None or fs.version != 1 or fs.limit_all_gathers or fs.sharding_strategy == "NO_SHARD":
        return None
    if spec.hardware.device_type is not DeviceType.CUDA or partition(spec).weights <= 1:
        return None  # no side streams (CPU), or NO_SHARD (one process): the limiter never waits
    layers = fsdp_unit_params(spec) * spec.model.shape.num_layers * param_compute_bytes(spec)
    return Finding(
        "not-modelled", Severity.WARNING,
        "limit_all_gathers=False (FSDP1): the CPU may issue the all-gathers ahead of the device, so the unshard "
        "stream's cache can hold up to every layer unit's gathered parameters "
        f"({format_bytes(layers)}) where fitcheck counts two in flight; reserved is not modelled beyond that",
        "keep limit_all_gathers true (accelerate's default), or check reserved memory on the GPU",
    )


def _accumulation_finding(spec: TrainingSpec, fs: FsdpSpec | None) -> Finding:
    """FSDP gradient accumulation without ``sync_each_batch``: the bytes the gradient components count, and why."""
    k = spec.batch.grad_accum
    grads = kept_gradients(spec)
    version = fs.version if fs is not None else 2
    if not fsdp_no_sync(spec):
        how = "keeps the unsharded gradients between micro-steps"
    elif version == 2:
        how = (f"accelerate 1.15 Accelerator.no_sync calls set_requires_gradient_sync(False) on every micro-batch "
               f"but the last, so FSDP2 reduce-scatters nothing and keeps each parameter's unsharded gradient in "
               f"param_dtype ({param_compute_bytes(spec)} B per element)")
    else:
        how = (f"accelerate 1.15 Accelerator.no_sync enters FullyShardedDataParallel.no_sync (more than one process) "
               f"on every micro-batch but the last, so FSDP1 keeps each flat parameter's unsharded gradient in "
               f"param_dtype ({param_compute_bytes(spec)} B per element)")
    which = (" (the adapters and modules_to_save: the frozen base gets no gradient)" if spec.lora is not None
             else "")
    text = (f"FSDP{version} with gradient_accumulation_steps={k}: {how}: {grads.numel:,} trainable "
            f"parameters{which}, {format_bytes(grads.kept)} per GPU between micro-steps, where reduced shards "
            f"hold {format_bytes(grads.synced)}")
    frozen = mixed_unit_frozen_params(spec)
    if frozen:
        text += (f"; plus the gradient of the {frozen:,} frozen parameters sharing FSDP1 units with trainable ones, "
                 f"{format_bytes(frozen * param_compute_bytes(spec))} unsharded (fsdp-frozen-in-trainable-units)")
    return Finding(
        "fsdp-accumulation-unsharded-grads",
        Severity.WARNING,
        text + (" (not counted: under offload_params the estimate keeps the gradients on the host)"
                if partition(spec).gradients_on_host else " (counted in the estimate)"),
        'set accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": true}}',
    )


def _deepspeed_host_reference(spec: TrainingSpec, trainable: int) -> Finding:
    """DeepSpeed's own host-RAM formula for the offload case, as a cross-check of the host components."""
    ds = spec.sharding.deepspeed or DeepSpeedSpec()
    per_node = spec.sharding.processes_per_machine
    total_gpus = spec.data_parallel_size
    nodes = spec.sharding.num_machines
    total = spec.model.total_params
    if ds.stage == 3:
        # stage3.py estimate_zero3_model_states_mem_needs, zero_init=True: P x (18 or 16) / nodes x 1.5
        per = 18 if ds.offload_param is not OffloadDevice.NONE else 16
        cpu = total * per / nodes * _DS_CPU_FACTOR
    else:
        # stage_1_and_2.py estimate_zero2_model_states_mem_needs: P x max(4 x total_gpus, 16) x 1.5
        cpu = total * max(4 * total_gpus, 16) * _DS_CPU_FACTOR
    return Finding(
        "deepspeed-host-reference",
        Severity.INFO,
        f"DeepSpeed's own estimator asks for {format_bytes(cpu)} of host RAM per node for this offload setup "
        f"({per_node} GPU(s) per node; it counts all {total:,} params as trainable and adds a "
        f"{_DS_CPU_FACTOR}x buffer factor)",
        "compare with --host_memory; pinned memory needs free physical RAM",
    )
