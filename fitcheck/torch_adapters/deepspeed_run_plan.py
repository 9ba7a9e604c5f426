"""Which DeepSpeed runs ``deepspeed_run_events`` replays, and what its rewrite needs of one (a plan).

Read from deepspeed 0.19.8 (cited where used); pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from fitcheck.core.states import aligned as aligned
from fitcheck.core.states import held_elements, in_partition, partition_size
from fitcheck.spec import Dtype, TrainingSpec
from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches

FP32 = 4
# Optimizers whose step on the flat fp32 partition allocates its two states and nothing else of its size:
# torch's fused AdamW (the Trainer's adamw_torch_fused, torch/optim/_fused_adamw: one kernel, no temporaries).
FUSED_ADAM = ("adamw_torch_fused",)


class DeepSpeedReplayError(ValueError):
    """The plain run's events do not carry what the rewrite needs (a trainable parameter's storage)."""


@dataclass(frozen=True)
class DeepSpeedPlan:
    """What the rewrite needs of a DeepSpeed run.

    Attributes:
        stage: ZeRO stage (1, 2 or 3).
        groups: The Trainer's parameter groups (decay, no decay), each the numels of its trainable tensors in the
            model's order; empty groups left out.
        elem: Bytes of one element of the 16-bit model (bf16 / fp16).
        bucket: ``reduce_bucket_size`` (elements).
        overlap: ``overlap_comm`` as DeepSpeed resolves it (``zero/config.py``: stage 3 on, else off).
        contiguous: ``contiguous_gradients``.
        sub_group_size: ZeRO-3's ``sub_group_size`` (elements).
        world: Data-parallel processes; the rewrite is rank 0's (ZeRO-1/2: the partitions of
            ``stage_1_and_2.py``, :meth:`partition` and :meth:`in_partition`).
        accum: ``gradient_accumulation_steps`` (micro-batches per optimizer step).
        rank: The rank rewritten (ZeRO-1/2): :func:`deepspeed_plan` takes the one whose ``grads_in_partition`` is
            the largest (a rank's partition holds every parameter that overlaps it, whole).
        params: ZeRO-3: every parameter of the model, trainable or not, in ``named_parameters`` order, as
            (elements, trainable); the trainable ones are :attr:`groups`' (ZeRO-3 partitions each parameter).
        persist: ZeRO-3 ``stage3_param_persistence_threshold`` (elements): a parameter of at most this many stays
            gathered (``parameter_offload.py`` ``mark_persistent_parameters``).
        prefetch: ZeRO-3 ``stage3_prefetch_bucket_size`` (elements).
        max_live: ZeRO-3 ``stage3_max_live_parameters`` (elements): a prefetch stops where the gathered
            parameters would pass it (``partitioned_param_coordinator.py`` ``fetch_sub_module``).
        max_reuse: ZeRO-3 ``stage3_max_reuse_distance`` (elements): a parameter used again within this many
            elements of modules is not released (``__params_to_release``).
    """

    stage: int
    groups: tuple[tuple[int, ...], ...]
    adapters: frozenset[tuple[int, int]]
    elem: int
    bucket: int
    overlap: bool
    contiguous: bool
    sub_group_size: int
    world: int = 1
    accum: int = 1
    rank: int = 0
    params: tuple[tuple[int, bool], ...] = ()
    persist: int = 0
    prefetch: int = 0
    max_live: int = 10**9
    max_reuse: int = 10**9

    @property
    def numel(self) -> int:
        """Trainable elements."""
        return sum(sum(g) for g in self.groups)

    def partition(self, i: int) -> int:
        """Elements of one rank's partition of ZeRO-1/2 group ``i``: the flat group padded to 2 x world size
        (:func:`aligned`) split evenly (``stage_1_and_2.py`` ``get_data_parallel_partitions``)."""
        return partition_size(self.groups[i], self.world)

    def in_partition(self, i: int, rank: int | None = None) -> list[tuple[int, int]]:
        """The parameters of ZeRO-1/2 group ``i`` in a rank's partition (:attr:`rank` unless given), each as (its
        elements, its elements inside the partition): ``fitcheck.core.states.in_partition``."""
        return in_partition(self.groups[i], self.world, self.rank if rank is None else rank)

    def part3(self, numel: int) -> int:
        """Elements of one rank's ZeRO-3 partition of a parameter: ``ceil(numel / world)``
        (``partition_parameters.py`` ``_aligned_size`` / ``_partition_param``)."""
        return -(-numel // self.world)

    def held(self, rank: int | None = None) -> int:
        """Elements of a rank's ``grads_in_partition`` (``copy_grads_in_partition``: its parameters, whole)."""
        return held_elements(self.groups, self.world, self.rank if rank is None else rank)


def sub_groups(group: Sequence[int], size: int) -> list[int]:
    """ZeRO-3's sub-groups of one parameter group (``stage3.py`` ``_create_fp16_sub_groups``)."""
    if size >= sum(group):
        return [sum(group)]
    out, acc = [], 0
    for k, numel in enumerate(group):
        acc += numel
        if acc >= size or k == len(group) - 1:
            out.append(acc)
            acc = 0
    return out


def not_replayed(spec: TrainingSpec) -> str:
    """What of a DeepSpeed run :func:`deepspeed_run` does not describe ("" when it describes the run).

    Args:
        spec: A DeepSpeed ZeRO spec.

    Returns:
        The part not replayed, for the ``reserved-published-gap`` INFO, or "".
    """
    from fitcheck.spec import OffloadDevice

    ds = spec.sharding.deepspeed
    stage = spec.sharding.zero_stage or 0
    parts = []
    if ds is None or stage not in (1, 2, 3):
        parts.append("ZeRO-0")
    multi = max(spec.data_parallel_size, 1) > 1 and stage == 3  # deepspeed_run_zero3's
    if ds is not None and (ds.offload_optimizer, ds.offload_param) != (OffloadDevice.NONE, OffloadDevice.NONE):
        parts.append("offloaded optimizer or parameters")
    if spec.batch.grad_accum > 1 and stage == 1:
        parts.append("gradient accumulation under ZeRO-1 (its gradients reduced at the boundary only)")
    cast = _engine_dtype(spec)
    if cast is None:
        parts.append("an fp32 engine (no bf16/fp16 section)")
    elif spec.precision.load_dtype is not cast:
        parts.append("a model loaded in another dtype than the engine's (its cast in initialize)")
    if spec.quant is not None:
        parts.append("a quantized base")
    if stage == 3 and not multi and (spec.lora is not None or spec.freeze is not None):
        parts.append("ZeRO-3 on one process with frozen parameters (their partitioning)")
    if spec.optimizer.name not in FUSED_ADAM:
        parts.append(f"the {spec.optimizer.name} optimizer on the flat partition (replayed: {FUSED_ADAM[0]})")
    return "; ".join(parts)


def _engine_dtype(spec: TrainingSpec) -> Dtype | None:
    """The 16-bit dtype the engine casts the module to (its bf16 / fp16 section), or None."""
    from fitcheck.spec import MixedPrecision

    return {MixedPrecision.BF16: Dtype.BFLOAT16, MixedPrecision.FP16: Dtype.FLOAT16}.get(
        spec.precision.mixed_precision)


def deepspeed_plan(spec: TrainingSpec) -> DeepSpeedPlan:
    """The plan of a DeepSpeed spec :func:`not_replayed` accepts.

    Args:
        spec: The training spec.

    Returns:
        Its stage, groups and settings.
    """
    from fitcheck.core.states import zero_groups

    ds = spec.sharding.deepspeed
    assert ds is not None
    stage = spec.sharding.zero_stage or 0
    split = zero_groups(spec)  # the decay and no-decay groups, each in named_parameters order
    groups = tuple(tuple(n for n, _ in g) for g in split)
    marked = frozenset((i, k) for i, g in enumerate(split) for k, (_, a) in enumerate(g) if a)
    cast = _engine_dtype(spec)
    elem = cast.nbytes if cast is not None else FP32
    overlap = ds.overlaps_comm
    plan = DeepSpeedPlan(stage, groups, marked, elem, ds.reduce_bucket_size, overlap,
                         ds.contiguous_gradients, ds.sub_group_size, max(spec.data_parallel_size, 1),
                         replayed_micro_batches(spec.batch.grad_accum))
    if stage == 3:
        return replace(plan, params=_all_params(spec),
                       persist=ds.param_persistence_threshold, prefetch=ds.prefetch_bucket_size,
                       max_live=ds.max_live_parameters, max_reuse=ds.max_reuse_distance)
    if plan.world == 1:
        return plan
    # the per-GPU peak is the largest rank's: the one holding the most whole parameters (the first of a tie)
    return replace(plan, rank=max(range(plan.world), key=lambda r: (plan.held(r), -r)))


def _all_params(spec: TrainingSpec) -> tuple[tuple[int, bool], ...]:
    """Every parameter of the model as (elements, trainable), in ``named_parameters`` order: what precedes the
    layers, the layers one by one, what follows; peft's adapters right after their base weight
    (``base_layer.weight``, ``lora_A``, ``lora_B``, the magnitude). A partly trained entry (some layers): its
    first instances are counted trainable."""
    from fitcheck.core.states import build_layout, named_order

    layout = build_layout(spec)
    order, first_layer = named_order(spec)
    trained = {g.name: g.repeat for g in layout.trainable}
    ranked: list[tuple[tuple[int, int, int, int], int, bool]] = []
    for k, e in enumerate(spec.model.params):
        part = 1 if "*" in e.name else (0 if k < first_layer else 2)
        for r in range(e.repeat):
            ranked.append(((part, r if part == 1 else 0, k, 0), e.numel_each, r < trained.get(e.name, 0)))
    for sub, g in enumerate([*layout.adapters, *layout.saved], 1):
        base = order.get(g.name.rsplit(".", 1)[0] + ".weight", order.get(g.name, len(order)))
        part = 1 if "*" in g.name else (0 if base < first_layer else 2)
        for r in range(g.repeat):
            ranked.append(((part, r if part == 1 else 0, base, sub), g.numel_each, True))
    ranked.sort(key=lambda t: t[0])
    return tuple((n, t) for _, n, t in ranked)
