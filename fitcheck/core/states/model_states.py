"""Model-state memory: weights, gradients, optimizer states and master weights, as the libraries allocate
them.

Precision regimes (which one applies is said in :func:`describe_regime`):

(a) 16-bit-loaded model + a plain torch optimizer: parameters, gradients and states all in the 16-bit
  dtype, no
    fp32 master copy (``torch/optim/adam.py`` ``zeros_like(p)``; the Trainer never adds one).
(b) fp32-loaded model + bf16 autocast: fp32 parameters, gradients and states (the autocast weight cache is an
    activation-side component, ``fitcheck.core.activations.decoder``).
(c) DeepSpeed with bf16/fp16 enabled: the engine casts the module to 16 bits (``runtime/engine.py``); ZeRO
  1-3 keep
    an fp32 partition clone of the trainable parameters and the optimizer states on it, and build an fp32
    gradient
    partition at the step (``runtime/zero/stage_1_and_2.py``: ``single_partition_of_fp32_groups``,
    ``single_grad_partition``); ZeRO-0 uses ``FP16_Optimizer`` with the same fp32 copies unpartitioned.
(d) fp32-loaded model + fp16 autocast (AMP + GradScaler): as (b).

Gradients exist only for trainable parameters, in their dtype. Phases: absent at the end of forward / start of
backward of the first micro-step (the Trainer's ``zero_grad(set_to_none=True)``) unless gradient accumulation
keeps the previous micro-steps' sums; all present at the end of backward and in the optimizer step.
Partitioning and host placement come from :func:`fitcheck.core.states.sharding.partition`.
"""

from __future__ import annotations

from typing import NamedTuple

from fitcheck.core.optimizers import OptimizerMemory, TensorGroup
from fitcheck.core.states.accumulation import fsdp_unsharded_kept, zero1_offload_grads, zero1_overlap_keeps_grads
from fitcheck.core.states.fsdp_mixed_units import mixed_unit_components
from fitcheck.core.states.fsdp_qlora import SOURCE as FSDP_QUANT_SOURCE
from fitcheck.core.states.fsdp_qlora import quant_placement
from fitcheck.core.states.layout import (
    all_trainable,
    build_layout,
    has_master,
    optimizer_for,
    stepped_groups,
    total_bytes,
    total_numel,
    trainable_params,
    zero_replaced_adagrad_bytes,
)
from fitcheck.core.states.prequant import SOURCE as PREQUANT_SOURCE
from fitcheck.core.states.quantization import SOURCE_4BIT, SOURCE_8BIT, SOURCE_WHICH
from fitcheck.core.states.regimes import describe_regime, model_state_findings
from fitcheck.core.states.sharding import Partition, param_compute_bytes, partition
from fitcheck.core.states.zero3_quant import SOURCE as ZERO3_QUANT_SOURCE
from fitcheck.core.states.zero3_quant import zero3_quant_placement
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import TrainingSpec
from fitcheck.units import format_bytes

__all__ = ["describe_regime", "model_state_components", "model_state_findings", "trainable_params"]

_SRC_WEIGHTS = "parameter inventory x resident dtype (transformers from_pretrained dtype=...)"
_SRC_GRADS = (
    "torch autograd: .grad in the param dtype, requires_grad params only; Trainer zero_grad(set_to_none)"
)
_SRC_Z3_GRADS = (
    "deepspeed 0.19.8 runtime/zero/stage3.py: grad_partitions_flat_buffer (torch.zeros of the partition's numel in "
    "gradient_accumulation_dtype = the model dtype unless data_types.grad_accum_dtype, engine.py get_data_types) "
    "made at optimizer init, never freed; measured on an H200: +2.47e9 B resident for Llama-3.2-1B bf16 "
    "(benchmarks/data/trainer_gpu_nvidia_h200.json)"
)
_SRC_DS = "deepspeed 0.19.8 runtime/zero/stage_1_and_2.py (fp32 partition clone, fp32 grad partition at step)"
_SRC_PEFT = (
    "peft 0.21.2 tuners_utils.py cast_adapter_dtype (adapters fp32); utils/other.py ModulesToSaveWrapper"
)


def _div(n: int, d: int) -> int:
    return -(n // -d) if d > 1 else n


def _phases(value: int, *, only: tuple[Phase, ...] = PHASES) -> dict[Phase, int]:
    return {p: (value if p in only else 0) for p in PHASES}


def _placed(
    name: str,
    category: Category,
    nbytes: int,
    source: str,
    detail: str,
    *,
    on_host: bool,
    per_node: int,
    phases: tuple[Phase, ...] = PHASES,
) -> Component:
    if on_host:
        total = nbytes * per_node
        return Component(
            name,
            category,
            Location.HOST,
            _phases(total, only=phases),
            source,
            f"{detail}; host RAM per node = {per_node} process(es) x {format_bytes(nbytes)}",
        )
    return Component(name, category, Location.DEVICE, _phases(nbytes, only=phases), source, detail)


def model_state_components(spec: TrainingSpec) -> tuple[Component, ...]:
    """Weights, quantization metadata, adapters, gradients, optimizer states, master weights and step
    temporaries.

    Args:
        spec: The training spec.

    Returns:
        One component per kind of model state, on the busiest GPU (and per node for host-resident states).

    Raises:
        NotModelledError: If the optimizer is not modelled.
    """
    layout = build_layout(spec)
    part = partition(spec)
    node = spec.sharding.processes_per_machine
    comps: list[Component] = []
    w_host = part.params_on_host

    def weights(
        name: str, cat: Category, nbytes: int, source: str, detail: str, placed: tuple[int, bool] | None = None
    ) -> None:
        divisor, on_host = placed or (part.weights, w_host)
        if nbytes:
            comps.append(
                _placed(
                    name,
                    cat,
                    _div(nbytes, divisor),
                    source,
                    detail + _share(divisor),
                    on_host=on_host,
                    per_node=node,
                )
            )

    weights(
        "weights.frozen",
        Category.WEIGHTS,
        layout.frozen_bytes,
        _SRC_WEIGHTS,
        f"{layout.frozen_params:,} frozen params",
    )
    weights(
        "weights.trainable",
        Category.WEIGHTS,
        total_bytes(layout.trainable),
        _SRC_WEIGHTS,
        f"{total_numel(layout.trainable):,} trainable params" + _dtypes(layout.trainable),
    )
    if spec.quant is not None and spec.quant.method != "mxfp4":
        src = SOURCE_4BIT if spec.quant.bits == 4 else SOURCE_8BIT
        which = SOURCE_WHICH
        meta_what = "absmax / scales / code tables" + (" (double quant)" if spec.quant.double_quant else "")
        if spec.quant.method in PREQUANT_SOURCE:  # pre-quantized checkpoint (states/prequant.py)
            src = which = PREQUANT_SOURCE[spec.quant.method]
            meta_what = f"{spec.quant.method} scales / zeros / g_idx"
        engine = _quant_sharding(spec, part)
        weights("weights.quantized", Category.WEIGHTS, layout.quant_data,
                (src if which == src else f"{src}; {which}") + engine.data_source,
                f"{layout.quant_params:,} params in {spec.quant.bits}-bit" + engine.data_detail, engine.data_placed)
        if engine.partition_beside:
            weights("weights.quantized_partition", Category.WEIGHTS, layout.quant_data, ZERO3_QUANT_SOURCE,
                    "ZeRO-3's partition (ds_tensor) of the int8 weights kept whole above")
        weights("quantization.metadata", Category.QUANT_META, layout.quant_meta, src + engine.meta_source,
                meta_what + engine.meta_detail, engine.meta_placed)
    weights(
        "adapters.lora",
        Category.ADAPTERS,
        total_bytes(layout.adapters),
        _SRC_PEFT,
        f"{total_numel(layout.adapters):,} adapter params" + _dtypes(layout.adapters),
    )
    weights(
        "adapters.modules_to_save",
        Category.ADAPTERS,
        total_bytes(layout.saved),
        _SRC_PEFT,
        f"{total_numel(layout.saved):,} params in trainable copies (originals stay, frozen)",
    )

    groups = all_trainable(layout)
    opt = optimizer_for(spec, groups)
    comps.extend(_gradient_components(spec, part, groups, opt, node))
    comps.extend(mixed_unit_components(
        spec, part.gradients, param_compute_bytes(spec), spec.precision.load_dtype.nbytes,
        part.full_gradients_between_microsteps and spec.batch.grad_accum > 1))
    comps.extend(_optimizer_components(spec, part, groups, opt, node))
    return tuple(c for c in comps if c.peak_bytes)


class _QuantSharding(NamedTuple):
    """How a sharding engine places a quantized base on one GPU: one row per engine (suffixes of the components'
    sources and details; a placement of None: as the other weights)."""

    data_source: str
    data_detail: str
    data_placed: tuple[int, bool] | None  # (divisor, on host) of the packed / int8 bytes
    partition_beside: bool  # ZeRO-3's partition of int8 weights kept whole beside them
    meta_source: str
    meta_detail: str
    meta_placed: tuple[int, bool] | None


_AS_THE_WEIGHTS = _QuantSharding("", "", None, False, "", "", None)


def _quant_sharding(spec: TrainingSpec, part: Partition) -> _QuantSharding:
    """FSDP-QLoRA (``fsdp_qlora.py``): packed bytes sharded only with a float quant_storage; the quantization state
    a module attribute, whole on every GPU and never offloaded. ZeRO-3 (``zero3_quant.py``): 4-bit packed bytes
    partitioned, 8-bit int8 weights whole beside their partition; the quantization state whole on every GPU."""
    fq = quant_placement(spec, part.weights, part.params_on_host)
    if fq is not None:
        return _QuantSharding("", f" ({fq.detail})", (fq.data_divisor, fq.data_on_host), False,
                              f"; {FSDP_QUANT_SOURCE}", " (not sharded by FSDP: whole on every GPU)", (1, False))
    zq = zero3_quant_placement(spec, part.weights)
    if zq is not None:
        return _QuantSharding(f"; {ZERO3_QUANT_SOURCE}", f" ({zq.detail})", (1, False) if zq.data_whole else None,
                              zq.data_whole, f"; {ZERO3_QUANT_SOURCE}",
                              " (not partitioned by ZeRO-3: whole on every GPU)", (1, False))
    return _AS_THE_WEIGHTS


def _share(divisor: int) -> str:
    return f", 1/{divisor} per GPU" if divisor > 1 else ""


def _dtypes(groups: list[TensorGroup]) -> str:
    kinds = sorted({g.dtype.value for g in groups})
    return f" ({', '.join(kinds)})" if kinds else ""


def _gradient_components(
    spec: TrainingSpec, part: Partition, groups: list[TensorGroup], opt: OptimizerMemory, node: int
) -> list[Component]:
    grad_bytes = total_bytes(groups)
    if not grad_bytes:
        return []
    accum = spec.batch.grad_accum > 1
    if opt.in_backward:
        # LOMO / layer-wise GaLore: each gradient is consumed by its hook as soon as it is produced.
        largest = max(g.nbytes_each for g in groups)
        return [
            Component(
                "gradients",
                Category.GRADIENTS,
                Location.DEVICE,
                _phases(largest, only=(Phase.BACKWARD,)),
                _SRC_GRADS + "; update fused into backward",
                "one parameter's gradient at a time (update in backward)",
            )
        ]
    sharded = _div(grad_bytes, part.gradients)
    if part.gradients_on_host:
        # ZeRO-Offload / FSDP offload: reduced gradients go to host (fp32 partition under DeepSpeed).
        host = _div(total_numel(groups), part.gradients) * 4 if has_master(spec) else sharded
        offloaded = [
            _placed(
                "gradients",
                Category.GRADIENTS,
                host,
                _SRC_DS if has_master(spec) else _SRC_GRADS,
                "gradients offloaded to host" + _share(part.gradients),
                on_host=True,
                per_node=node,
            )
        ]
        on_device = zero1_offload_grads(spec, grad_bytes)  # ZeRO-1 + offload: every .grad there until reduced
        return offloaded if on_device is None else [*offloaded, on_device]
    early = (Phase.FORWARD_END, Phase.BACKWARD_START)
    by_phase: dict[Phase, int] = {}
    kept = fsdp_unsharded_kept(spec, groups, grad_bytes)
    whole = zero1_overlap_keeps_grads(spec)  # ZeRO-1 reducing at the boundary only: every .grad until then
    for p in PHASES:
        if part.full_gradients_between_microsteps and accum and p is not Phase.OPTIMIZER_STEP:
            by_phase[p] = kept  # FSDP no_sync: unsharded gradients kept across micro-steps
        elif whole and p is not Phase.OPTIMIZER_STEP:
            by_phase[p] = grad_bytes
        elif p in early and not accum and not part.gradients_resident:
            by_phase[p] = 0
        else:
            by_phase[p] = sharded
    flat_copy = 0
    steps = stepped_groups(spec, groups) if has_master(spec) else []  # the optimizer's parameter groups
    if has_master(spec) and spec.sharding.zero_stage in (1, 2):
        # ZeRO-1/2 free a group's 16-bit gradients once its fp32 copy is built, before its step (deepspeed 0.19.8
        # stage_1_and_2.py step: free_grad_in_param_list(params_in_partition[i]), averaged_gradients[i] = None):
        # the largest group's step holds only the others'. Real engine (benchmarks/deepspeed_cpu.py): optimizer
        # step without this +7.6 % (--cases zero2-accum2), +7.7 % (ZeRO-1, 256 tokens)
        stepped = max(total_bytes(g for g in steps if g.decay), total_bytes(g for g in steps if not g.decay))
        by_phase[Phase.OPTIMIZER_STEP] = max(sharded - _div(stepped, part.gradients), 0)
        flat_copy = _zero_flat_copy(part, stepped, opt)
    detail = f"{total_numel(groups):,} trainable params{_dtypes(groups)}{_share(part.gradients)}"
    source = _SRC_GRADS
    if part.gradients_resident:
        detail += "; ZeRO-3's flat gradient partition buffer, allocated at initialize and never freed"
        source = _SRC_Z3_GRADS
    elif accum:
        detail += f"; kept across {spec.batch.grad_accum} accumulation micro-steps"
    comps = [Component("gradients", Category.GRADIENTS, Location.DEVICE, by_phase, source, detail)]
    if flat_copy:
        comps.append(Component("gradients.flat_copy", Category.TEMPORARIES, Location.DEVICE,
                               _phases(flat_copy, only=(Phase.OPTIMIZER_STEP,)), _SRC_FLAT_COPY,
                               "the largest group's 16-bit gradients and their flat copy beside its fp32 partition, "
                               "before the step (more than the optimizer's own step temporaries)"))
    if has_master(spec):
        # DeepSpeed: fp32 gradient partition of one param group built for the step (single_grad_partition).
        largest_group = max(
            total_numel(g for g in steps if g.decay), total_numel(g for g in steps if not g.decay)
        )
        comps.append(
            Component(
                "gradients.fp32_partition",
                Category.GRADIENTS,
                Location.DEVICE,
                _phases(_div(largest_group, part.optimizer) * 4, only=(Phase.OPTIMIZER_STEP,)),
                _SRC_DS,
                "fp32 copy of the largest param group's gradient partition during the step",
            )
        )
    return comps


_SRC_FLAT_COPY = ("deepspeed 0.19.8 runtime/zero/stage_1_and_2.py step: flatten_dense_tensors_aligned / flatten "
                  "(torch.cat) of the group's 16-bit gradient partition, then .to(fp32), before "
                  "free_grad_in_param_list; real engine: benchmarks/deepspeed_optimizer_cpu.py")


def _zero_flat_copy(part: Partition, stepped: int, opt: OptimizerMemory) -> int:
    """What ZeRO-1/2's step holds for the largest group beyond the step moment's count: the 16-bit gradients of the
    rank's partition (``free_grad_in_param_list(params_not_in_partition)`` frees the others first; ZeRO-1's too) and
    their flat 16-bit copy, beside the fp32 copy, less the optimizer's own step temporaries that the moment after it
    holds instead (0 when those are larger: torch AdamW's single-tensor sqrt and quotient).

    deepspeed 0.19.8 ``stage_1_and_2.py`` ``step`` (16-bit gradient accumulation, the default: no pre-flattened
    partition). Real engine, tiny Llama, ZeRO-2, one process (``benchmarks/deepspeed_optimizer_cpu.py``): the
    in-place optimizers' step, FusedAdam -18.18 % and torch SGD with momentum -22.22 % without it."""
    held = 2 * _div(stepped, part.optimizer)  # the partition's gradients (the others' freed first) + their copy
    return max(held - _div(opt.step_temporary, part.optimizer), 0)


def _optimizer_components(
    spec: TrainingSpec, part: Partition, groups: list[TensorGroup], opt: OptimizerMemory, node: int
) -> list[Component]:
    comps = _state_components(part, opt, node)
    comps.extend(_step_counter_components(opt, node))
    host = part.optimizer_on_host
    d = part.optimizer
    if has_master(spec):
        master = _div(total_numel(groups), part.master) * 4
        comps.append(
            _placed(
                "master.fp32",
                Category.MASTER,
                master,
                _SRC_DS,
                "fp32 copy of the trainable parameters" + _share(part.master),
                on_host=host,
                per_node=node,
            )
        )
    replaced = zero_replaced_adagrad_bytes(spec, groups)
    if replaced:
        comps.append(Component("optimizer.replaced_states", Category.OPTIMIZER, Location.DEVICE, _phases(replaced),
                               "torch 2.13 optim/adagrad.py __init__; deepspeed 0.19.8 stage_1_and_2.py "
                               "initialize_optimizer_states", "the first torch Adagrad's 'sum' states, kept by "
                               "engine.basic_optimizer after ZeRO replaces it"))
    if opt.step_temporary and not host:
        comps.append(
            Component(
                "optimizer.step_temporaries",
                Category.TEMPORARIES,
                Location.DEVICE,
                _phases(_div(opt.step_temporary, d), only=(Phase.OPTIMIZER_STEP,)),
                opt.source,
                "transient allocations inside optimizer.step()",
            )
        )
    return comps


def _state_components(part: Partition, opt: OptimizerMemory, node: int) -> list[Component]:
    """The optimizer's states (on the device, offloaded, or paged in CUDA managed memory) and projections."""
    comps: list[Component] = []
    host = part.optimizer_on_host
    d = part.optimizer
    if opt.states:
        comps.append(
            _placed(
                "optimizer.states",
                Category.OPTIMIZER,
                _div(opt.states, d),
                opt.source,
                opt.detail + _share(d),
                on_host=host,
                per_node=node,
            )
        )
    if opt.managed:
        if host:
            comps.append(
                _placed(
                    "optimizer.states_paged",
                    Category.OPTIMIZER,
                    _div(opt.managed, d),
                    opt.source,
                    opt.detail,
                    on_host=True,
                    per_node=node,
                )
            )
        else:
            comps.append(
                Component(
                    "optimizer.states_paged",
                    Category.OPTIMIZER,
                    Location.DEVICE_OTHER,
                    _phases(_div(opt.managed, d)),
                    opt.source,
                    "paged states in CUDA managed memory (not in max_memory_allocated; evicted to host "
                    "under pressure)",
                )
            )
    if opt.projections:
        comps.append(
            _placed(
                "optimizer.projections",
                Category.OPTIMIZER,
                _div(opt.projections, d),
                opt.source,
                "GaLore projection matrices",
                on_host=host,
                per_node=node,
            )
        )
    return comps


def _step_counter_components(opt: OptimizerMemory, node: int) -> list[Component]:
    """torch's 0-d ``step`` tensors: on the device (fused) or on the CPU."""
    comps: list[Component] = []
    if opt.step_counters_device:
        comps.append(
            Component(
                "optimizer.step_counters",
                Category.OPTIMIZER,
                Location.DEVICE,
                _phases(opt.step_counters_device),
                "torch 2.13 optim/adam.py _init_group (fused: fp32 0-d step on the device)",
                "one 4-byte step tensor per parameter",
            )
        )
    if opt.step_counters_host:
        comps.append(
            Component(
                "optimizer.step_counters",
                Category.OPTIMIZER,
                Location.HOST,
                _phases(opt.step_counters_host * node),
                "torch 2.13 optim/adam.py _init_group (step on CPU unless fused/capturable)",
                "one 4-byte CPU step tensor per parameter",
            )
        )
    return comps
