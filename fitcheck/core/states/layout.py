"""The resident tensors of a training run, classified: frozen, quantized, trainable, adapters, saved copies.

Shared by :mod:`fitcheck.core.states.model_states` (components) and :mod:`fitcheck.core.states.regimes` (regime,
findings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from fitcheck.core.optimizers import (
    OptimizerMemory,
    TensorGroup,
    canonical_optimizer,
    optimizer_memory,
    trainer_decays,
)
from fitcheck.core.states.fsdp_upcast import fsdp_fp32_upcast
from fitcheck.core.states.lora import LoraPlan, plan_lora
from fitcheck.core.states.peft_adapter import peft_adapter_tensors
from fitcheck.core.states.quantization import base_weights
from fitcheck.core.states.trl_adapters import trl_bf16_trainables
from fitcheck.spec import (
    DeviceType,
    Dtype,
    Kind,
    MixedPrecision,
    OffloadDevice,
    ParamEntry,
    Strategy,
    TrainingSpec,
)


@dataclass
class Layout:
    """Every resident tensor, classified (one process, before partitioning)."""

    frozen_bytes: int = 0
    frozen_params: int = 0
    quant_data: int = 0
    quant_meta: int = 0
    quant_params: int = 0
    unquantized_params: int = 0
    upcast_params: int = 0
    trainable: list[TensorGroup] = field(default_factory=list)  # base params trained in place
    adapters: list[TensorGroup] = field(default_factory=list)  # LoRA A/B, DoRA magnitudes
    saved: list[TensorGroup] = field(default_factory=list)  # modules_to_save copies
    plan: LoraPlan | None = None
    frozen_experts_bytes: int = 0


def ds_mixed_dtype(spec: TrainingSpec) -> Dtype | None:
    """The 16-bit dtype DeepSpeed casts the model to, or None."""
    sh = spec.sharding
    if sh.strategy is not Strategy.DEEPSPEED:
        return None
    if spec.precision.mixed_precision is MixedPrecision.BF16:
        return Dtype.BFLOAT16
    if spec.precision.mixed_precision is MixedPrecision.FP16:
        return Dtype.FLOAT16
    return None


def has_master(spec: TrainingSpec) -> bool:
    # ZeRO 1-3 always clone an fp32 partition (even for fp32 models); ZeRO-0 only wraps 16-bit
    # (FP16_Optimizer).
    stage = spec.sharding.zero_stage
    return stage is not None and (stage >= 1 or ds_mixed_dtype(spec) is not None)


def _decay(entry: ParamEntry) -> bool:
    # transformers Trainer.get_decay_parameter_names: name patterns (bias, norms) + nn.LayerNorm (~ Kind.NORM).
    return trainer_decays(entry.name, layer_norm=entry.kind is Kind.NORM)


def _selected_instances(spec: TrainingSpec, entry: ParamEntry) -> int:
    """How many instances of a base parameter are trainable (before quantization rules)."""
    if spec.lora is not None or spec.peft is not None:
        return 0
    freeze = spec.freeze
    if freeze is None:
        return entry.repeat
    if not any(entry.matches(p) for p in freeze.trainable):
        return 0
    if freeze.trainable_layers is None or not entry.per_layer:
        return entry.repeat
    return len({i for i in freeze.trainable_layers if 0 <= i < entry.repeat})


def _group(entry: ParamEntry, dtype: Dtype, repeat: int, spec: TrainingSpec) -> TensorGroup:
    targets = spec.optimizer.target_modules
    module = entry.name.rsplit(".", 1)[0]
    # transformers trainer_optimizer.py _setup_low_rank_optimizer + trainer_utils.check_target_module_exists:
    # "all-linear" takes every nn.Linear (LM head included); a list matches by substring or full regex.
    low_rank = (
        bool(targets)
        and entry.kind is Kind.LINEAR
        and len(entry.shape) == 2
        and ("all-linear" in {t.replace("_", "-") for t in targets} or any(t in module for t in targets))
    )
    return TensorGroup(
        name=entry.name,
        shape=entry.shape,
        dtype=dtype,
        repeat=repeat,
        embedding=entry.kind is Kind.EMBEDDING,
        decay=_decay(entry),
        low_rank=low_rank,
    )


# The layouts of the last few specs asked, by the spec object: one estimate asks for its spec's layout five times
# (model states, regime, saving, streams), and the largest-micro-batch search and the advisor estimate ~20 specs
# per answer. A spec is frozen and the entry holds it, so its id is not reused while the entry lives; a Layout is
# read, never changed, by every caller.
_LAYOUTS: dict[int, tuple[TrainingSpec, Layout]] = {}
_LAYOUTS_KEPT = 8


def build_layout(spec: TrainingSpec) -> Layout:
    """Classify every resident tensor of the model for a spec (one process, before partitioning).

    The result is shared by the calls for the same spec object: read it, do not change it.
    """
    kept = _LAYOUTS.get(id(spec))
    if kept is not None and kept[0] is spec:
        return kept[1]
    out = _build_layout(spec)
    if len(_LAYOUTS) >= _LAYOUTS_KEPT:
        del _LAYOUTS[next(iter(_LAYOUTS))]
    _LAYOUTS[id(spec)] = (spec, out)
    return out


def _build_layout(spec: TrainingSpec) -> Layout:
    out = Layout()
    base = base_weights(spec)
    out.quant_data, out.quant_meta = base.quantized_data, base.quantized_meta
    out.quant_params, out.unquantized_params, out.upcast_params = (
        base.quantized_params,
        base.unquantized_params,
        base.upcast_params,
    )
    cast = ds_mixed_dtype(spec)
    upcast = fsdp_fp32_upcast(spec)  # accelerate under FSDP + mixed precision: trainables become fp32
    for entry in spec.model.params:
        dtype = base.dtype_of.get(entry.name)
        if dtype is None:  # quantized
            continue
        if cast is not None:
            dtype = cast
        n_train = _selected_instances(spec, entry)
        n_frozen = entry.repeat - n_train
        if n_train:
            out.trainable.append(_group(entry, Dtype.FLOAT32 if upcast else dtype, n_train, spec))
        out.frozen_bytes += entry.numel_each * n_frozen * dtype.nbytes
        out.frozen_params += entry.numel_each * n_frozen
        if entry.kind is Kind.FUSED_EXPERTS:
            out.frozen_experts_bytes += entry.numel_each * n_frozen * dtype.nbytes
    _add_peft_adapter(out, spec)
    if spec.lora is not None:
        plan = plan_lora(spec)
        out.plan = plan
        # peft autocast_adapter_dtype=True: fp32; DeepSpeed casts the module (its activations' view too:
        # kernels/module_cast.py deepspeed_module_view)
        adapter_dtype = cast or (spec.precision.load_dtype if spec.precision.module_cast else Dtype.FLOAT32)
        trl_bf16 = trl_bf16_trainables(spec)  # TRL 1.16 casts a quantized model's trainables to bf16
        if trl_bf16:
            adapter_dtype = Dtype.BFLOAT16
        if upcast:
            adapter_dtype = Dtype.FLOAT32
        for t in plan.targets:
            name = t.entry.name.rsplit(".", 1)[0]
            out.adapters.append(TensorGroup(f"{name}.lora_A", t.lora_a_shape, adapter_dtype, t.layers))
            out.adapters.append(TensorGroup(f"{name}.lora_B", t.lora_b_shape, adapter_dtype, t.layers))
            if t.magnitude:
                out.adapters.append(
                    TensorGroup(f"{name}.lora_magnitude_vector", (t.magnitude,),
                                (cast or Dtype.FLOAT32) if trl_bf16 else adapter_dtype, t.layers)
                )
        for s in plan.saved:
            dtype = cast or base.dtype_of.get(s.entry.name, spec.precision.load_dtype)
            if trl_bf16:
                dtype = Dtype.BFLOAT16
            if upcast:
                dtype = Dtype.FLOAT32
            out.saved.append(_group(s.entry, dtype, s.entry.repeat, spec))
    return out


def stepped_groups(spec: TrainingSpec, groups: list[TensorGroup]) -> list[TensorGroup]:
    """The trainable tensors as the optimizer's parameter groups hold them: the Trainer's decay / no-decay pair
    (``TensorGroup.decay``), or one group (every tensor ``decay``) when DeepSpeed builds the optimizer from its
    config's section (:func:`deepspeed_builds_optimizer`). Real engine (``benchmarks/deepspeed_cpu.py --cases``,
    whose engines build it so): zero2-accum2's optimizer step -0.05 % with two groups, -0.00 % with one.

    ZeRO-1/2's reduction moments (``zero_reduce.py``) keep the layout's two groups: with one, the rank-1 backward
    moment of ``--cases zero1-overlap-8-ranks`` is -6.08 % (its partition, ``held_by_rank``, equals the real
    engine's; the moment's other terms are not resolved), with two +0.01 %."""
    if not deepspeed_builds_optimizer(spec):
        return groups
    return [dataclasses.replace(g, decay=True) for g in groups]


def deepspeed_builds_optimizer(spec: TrainingSpec) -> bool:
    """Whether DeepSpeed builds the optimizer from its config's own ``optimizer`` section
    (``DeepSpeedSpec.optimizer_class``, readers/deepspeed_optimizer.py) over one parameter group: transformers 5.23
    ``integrations/deepspeed.py`` ``deepspeed_init`` passes ``model_parameters = [p for p in model.parameters() if
    p.requires_grad]`` (one list), not the Trainer's decay / no-decay pair, so ZeRO makes one flat fp32 group."""
    ds = spec.sharding.deepspeed
    return spec.sharding.strategy is Strategy.DEEPSPEED and ds is not None and ds.optimizer_class is not None


def _add_peft_adapter(out: Layout, spec: TrainingSpec) -> None:
    """A non-LoRA PEFT adapter's tensors as peft built them (``core/states/peft_adapter.py``): trainable ones are
    adapters (gradients, optimizer states), frozen ones and buffers frozen bytes; a base parameter made trainable
    in place moves from the frozen bytes to the adapters."""
    for t in peft_adapter_tensors(spec):
        if t.trainable:
            out.adapters.append(TensorGroup(t.name, t.shape, t.float_dtype, t.repeat, decay=trainer_decays(t.name)))
            if t.in_base:
                out.frozen_bytes -= t.nbytes
                out.frozen_params -= t.numel_each * t.repeat
        elif not t.in_base:
            out.frozen_bytes += t.nbytes
            out.frozen_params += 0 if t.buffer else t.numel_each * t.repeat


def total_bytes(groups: Iterable[TensorGroup]) -> int:
    return sum(g.nbytes_each * g.repeat for g in groups)


def total_numel(groups: Iterable[TensorGroup]) -> int:
    return sum(g.numel_each * g.repeat for g in groups)


def all_trainable(layout: Layout) -> list[TensorGroup]:
    return [*layout.trainable, *layout.adapters, *layout.saved]


def optimizer_for(spec: TrainingSpec, groups: list[TensorGroup]) -> OptimizerMemory:
    groups = stepped_groups(spec, groups)
    opt_groups = groups
    if has_master(spec):  # DeepSpeed: the optimizer steps the fp32 partition
        opt_groups = [
            TensorGroup(g.name, g.shape, Dtype.FLOAT32, g.repeat, g.embedding, g.decay, g.low_rank)
            for g in groups
        ]
    opt = spec.optimizer
    if ds_cpu_optimizer(spec) is not None:  # accelerate swaps the Trainer's optimizer for DeepSpeedCPUAdam
        opt = dataclasses.replace(opt, name="adamw_torch", args={})
    cuda = spec.hardware.device_type is DeviceType.CUDA
    release = spec.stack.release("transformers")
    memory = optimizer_memory(opt, opt_groups, cuda=cuda, transformers=release)
    ds = spec.sharding.deepspeed
    if deepspeed_builds_optimizer(spec) and ds is not None and ds.optimizer_class in _DS_PYTHON_INT_STEP:
        memory = dataclasses.replace(memory, step_counters_device=0, step_counters_host=0)
    flat = zero_flat_groups(spec, groups)
    if flat:  # the ZeRO optimizer steps one flat fp32 tensor per param group: its temporaries are that tensor's
        temp = optimizer_memory(opt, flat, cuda=cuda, transformers=release).step_temporary
        memory = dataclasses.replace(memory, step_temporary=temp)
    return memory


# DeepSpeed's fused ops keep ``state['step']`` a Python int (deepspeed 0.19.8 ops/adam/fused_adam.py,
# ops/lion/fused_lion.py, ops/lamb/fused_lamb.py), where torch's fused AdamW keeps a device tensor per parameter.
_DS_PYTHON_INT_STEP = ("FusedAdam", "FusedLion", "FusedLamb")


def zero_flat_groups(spec: TrainingSpec, groups: list[TensorGroup]) -> list[TensorGroup]:
    """The tensors a DeepSpeed ZeRO-1/2/3 optimizer steps: one flat fp32 tensor per Trainer param group (decay,
    then no decay), each the whole group (the caller divides by the partition), ZeRO-3's split into sub-groups of
    ``sub_group_size`` per rank; [] for any other run.

    deepspeed 0.19.8 ``runtime/zero/stage_1_and_2.py`` (``single_partition_of_fp32_groups[i]``: the optimizer's
    ``param_groups[i]['params']`` is that one flat partition) and ``stage3.py`` (``fp32_partitioned_groups_flat``
    per sub-group of ``sub_group_size``). Real engine, tiny Llama, torch AdamW on CPU (single-tensor loop: sqrt and
    quotient of the whole partition, ``benchmarks/deepspeed_cpu.py --cases``): the optimizer step -15 % with the
    per-tensor model."""
    ds = spec.sharding.deepspeed
    if ds is None or not has_master(spec) or (spec.sharding.zero_stage or 0) < 1:
        return []
    chunk = ds.sub_group_size * max(spec.data_parallel_size, 1) if ds.stage == 3 else 0
    out: list[TensorGroup] = []
    for decay in (True, False):
        numel = sum(g.numel_each * g.repeat for g in groups if g.decay is decay)
        if not numel:
            continue
        if chunk and numel > chunk:
            out.append(TensorGroup(f"zero flat {decay}", (chunk,), Dtype.FLOAT32, numel // chunk, decay=decay))
            numel %= chunk
        if numel:
            out.append(TensorGroup(f"zero flat {decay} tail", (numel,), Dtype.FLOAT32, 1, decay=decay))
    return out


# What accelerate 1.15 utils/deepspeed.py map_pytorch_optim_to_deepspeed keeps as a CPU optimizer of its own kind:
# torch Adagrad -> DeepSpeedCPUAdagrad (one fp32 state, as torch's), bitsandbytes Lion 32-bit -> DeepSpeedCPULion
# (one fp32 state). Every other optimizer becomes DeepSpeedCPUAdam.
_KEPT_UNDER_CPU_OFFLOAD = ("adagrad", "lion_32bit", "paged_lion_32bit")


def ds_cpu_optimizer(spec: TrainingSpec) -> str | None:
    """``"DeepSpeedCPUAdam"`` when accelerate replaces the Trainer's optimizer under ZeRO optimizer offload, else
    None.

    accelerate 1.15 accelerator.py ``_prepare_deepspeed``: with ``offload_optimizer.device != "none"`` (and
    ``zero_force_ds_cpu_optimizer``, default true) the optimizer the Trainer built is passed through
    ``map_pytorch_optim_to_deepspeed``, which returns DeepSpeedCPUAdam (fp32 ``exp_avg`` + ``exp_avg_sq`` per
    parameter of the fp32 host partition, deepspeed/ops/adam/cpu_adam.py) for every optimizer but torch Adagrad
    and bitsandbytes' 32-bit Lion: a bitsandbytes 8-bit or paged optimizer keeps none of its 8-bit states.
    """
    ds = spec.sharding.deepspeed
    if ds is None or not has_master(spec) or ds.offload_optimizer is OffloadDevice.NONE:
        return None
    if ds.optimizer_class is not None:  # the config's section: DeepSpeed builds its CPU class itself, no swap
        return "DeepSpeedCPUAdam" if ds.optimizer_class == "DeepSpeedCPUAdam" else None
    name, _ = canonical_optimizer(spec.optimizer.name)
    return None if name in _KEPT_UNDER_CPU_OFFLOAD else "DeepSpeedCPUAdam"


def zero_replaced_adagrad_bytes(spec: TrainingSpec, groups: list[TensorGroup]) -> int:
    """Device bytes of the torch Adagrad DeepSpeed built from its config section and then replaced, 0 otherwise.

    torch 2.13 ``optim/adagrad.py`` makes its ``sum`` state in ``__init__`` (``full_like(p)``, the parameter's dtype).
    deepspeed 0.19.8 builds it over the model's parameters after casting them to 16 bits (engine.py
    ``_configure_basic_optimizer``), and ZeRO-1/2 replaces it with a new Adagrad over the fp32 partition
    (``stage_1_and_2.py`` ``initialize_optimizer_states``) while ``engine.basic_optimizer`` keeps the first one and
    its states for the whole run. Real engine (``benchmarks/deepspeed_optimizer_cpu.py`` ``zero1-adagrad``): every
    phase +1,115,868 B over the estimate without it, the tiny Llama's 557,696 trainable parameters in bf16. ZeRO-3's
    parameters are partitioned by then (``stage3.py`` does the same swap over empty ``data``); offload builds
    DeepSpeedCPUAdagrad. A Trainer-built Adagrad is made before the cast (not measured; not counted)."""
    ds = spec.sharding.deepspeed
    if (not deepspeed_builds_optimizer(spec) or ds is None or ds.optimizer_class != "torch.optim.Adagrad"
            or spec.sharding.zero_stage not in (1, 2)):
        return 0
    return total_bytes(groups)


def trainable_params(spec: TrainingSpec) -> int:
    """Trainable parameter count: base parameters trained in place, LoRA adapters and modules_to_save copies.

    Args:
        spec: The training spec.

    Returns:
        The number of parameters with gradients and optimizer states.
    """
    return total_numel(all_trainable(build_layout(spec)))
