"""ZeRO-1/2's flat parameter groups, a rank's gradient partition, and ZeRO-1's gradient reduction at the end of
backward: the moment a short sequence's backward peaks at.

deepspeed 0.19.8 ``runtime/zero/stage_1_and_2.py`` (every line read from the installed source):

* The groups: one flat 16-bit tensor per optimizer parameter group (the Trainer's decay and no-decay groups, each
  in ``named_parameters`` order), padded to ``nccl_start_alignment_factor`` (2) x world size
  (``flatten_dense_tensors_aligned``) and split evenly (``get_data_parallel_partitions``); a rank's
  ``params_in_partition`` are those that start inside its partition plus one that starts before and ends inside
  (``get_partition_info``).
* ``copy_grads_in_partition``: its first call of a backward allocates ``grads_in_partition = torch.empty(sum of
  the numels of params_in_partition, dtype=self.dtype)``: a rank's parameters' gradients, whole.
* ZeRO-1 without ``overlap_comm`` (its default: ``zero/config.py`` ``overlap_comm_valid``): ``process_gradients``
  (the gradient hook) only calls ``setup_buckets`` (the ipg bucket, ``buffers.deepspeed_reduce_bucket``), so every
  gradient is kept as ``param.grad`` until backward ends. Then ``reduce_gradients`` walks the groups in order
  through ``reduce_independent_p_g_buckets_and_remove_grads``: a gradient that fits is copied into the bucket and
  its ``.data`` becomes a view of it (its own storage is freed); one larger than ``reduce_bucket_size`` keeps its
  storage (``extra_large_param_to_reduce``); when the next one does not fit, ``reduce_ipg_grads`` reduces the
  bucket and, for the parameters of this rank's partition, ``copy_grads_in_partition`` allocates
  ``grads_in_partition``. At that moment every gradient not yet copied, the bucket and ``grads_in_partition`` are
  alive together, autograd's activations gone: (gradients) + (bucket) + (grads_in_partition) - (the gradients
  already copied into the bucket). ``independent_gradient_partition_epilogue`` reduces the last bucket the same
  way. Measured: ``benchmarks/deepspeed_cpu.py`` (the real engine's live tensors at the backward peak: the bf16
  gradients not yet copied, the 5,000,000-element bucket and the 19,272,192-element ``grads_in_partition``).

With the ``"auto"`` bucket transformers fills (``integrations/deepspeed.py`` ``HfTrainerDeepSpeedConfig.
trainer_config_finalize``: ``reduce_bucket_size`` = hidden_size²) the first parameter, the embedding (vocab x
hidden), is larger than the bucket: no gradient is copied before ``grads_in_partition`` is allocated, and the
moment is every gradient + the bucket + ``grads_in_partition``.

Pure: no torch, no environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fitcheck.core.states.accumulation import zero1_offload_keeps_grads, zero1_overlap_keeps_grads
from fitcheck.core.states.deepspeed_offload import offload_grad_norm_bytes
from fitcheck.core.states.layout import all_trainable, build_layout
from fitcheck.core.states.sharding import contiguous_reduction, param_compute_bytes
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import TrainingSpec

_SRC = (
    "deepspeed 0.19.8 runtime/zero/stage_1_and_2.py: reduce_gradients -> reduce_independent_p_g_buckets_and_"
    "remove_grads (a gradient copied into the ipg bucket frees its own storage; one above reduce_bucket_size is "
    "kept: extra_large_param_to_reduce) -> reduce_ipg_grads -> copy_grads_in_partition (grads_in_partition = "
    "torch.empty(numel of params_in_partition)) (fitcheck/core/states/zero_reduce.py)"
)


def aligned(numel: int, n: int) -> int:
    """A ZeRO-1/2 flat group's elements: padded to ``nccl_start_alignment_factor`` (2) x world size
    (``stage_1_and_2.py`` ``flatten_dense_tensors_aligned``; ``parameter_alignment`` off, its default)."""
    return -(-numel // (2 * n)) * (2 * n)


def named_order(spec: TrainingSpec) -> tuple[dict[str, int], int]:
    """The inventory's entries by their position (``named_parameters`` order of their first instance) and the
    position of the first layer entry (a name with ``*``): what precedes it comes before the layers, the rest after.

    Args:
        spec: The run.

    Returns:
        (position by entry name, the first layer entry's position).
    """
    order = {e.name: k for k, e in enumerate(spec.model.params)}
    return order, min((k for n, k in order.items() if "*" in n), default=len(order))


def zero_groups(spec: TrainingSpec) -> list[list[tuple[int, bool]]]:
    """The Trainer's parameter groups as ZeRO-1/2 flattens them: decay, then no decay (empty ones left out), each
    its trainable tensors in ``named_parameters`` order (what precedes the layers, the layers one by one, what
    follows; peft's adapters at their base weight) as (elements, is an adapter).

    Args:
        spec: A DeepSpeed spec.

    Returns:
        The groups.
    """
    ranked = _ranked(spec)
    split = [[(n, a) for n, d, a, _ in ranked if d is want] for want in (True, False)]
    return [g for g in split if g]


def _ranked(spec: TrainingSpec) -> list[tuple[int, bool, bool, int]]:
    """Every trainable tensor in ``named_parameters`` order as (elements, decay, is an adapter, its layer: -1 before
    the layers, the number of layers after them)."""
    order, first_layer = named_order(spec)
    ranked: list[tuple[tuple[int, int, int], int, bool, bool]] = []  # (model order, numel, decay, adapter)
    layout = build_layout(spec)
    adapters = {id(g) for g in layout.adapters}
    for g in all_trainable(layout):
        base = order.get(g.name, order.get(g.name.rsplit(".", 1)[0] + ".weight", len(order)))  # an adapter: its base
        for r in range(g.repeat):
            part = 1 if "*" in g.name else (0 if base < first_layer else 2)
            ranked.append(((part, r if part == 1 else 0, base), g.numel_each, g.decay, id(g) in adapters))
    ranked.sort(key=lambda t: t[0])
    after = spec.model.shape.num_layers
    return [(n, d, a, (-1, k[1], after)[k[0]]) for k, n, d, a in ranked]


def hook_order(spec: TrainingSpec) -> list[tuple[int, int, int, int]]:
    """The trainable tensors in the order backward makes their gradients and DeepSpeed's gradient hooks see them,
    as (group of :func:`zero_groups`, index in it, elements, layer: -1 before the layers, the number of layers after
    them): ``named_parameters`` order reversed (the LM head first; the embedding last, tied or not: a tied weight's
    ``AccumulateGrad`` runs once, after the embedding's backward added its gradient to the head's). Inside a layer
    autograd's order differs from the reversed names (down_proj before the norms); only which tensors share the
    bucket still open at a moment depends on it."""
    ranked = _ranked(spec)
    decays = [want for want in (True, False) if any(d is want for _, d, _, _ in ranked)]
    at = [0, 0]
    out: list[tuple[int, int, int, int]] = []
    for n, d, _, layer in ranked:
        out.append((decays.index(d), at[int(not d)], n, layer))
        at[int(not d)] += 1
    return out[::-1]


def partition_size(group: Sequence[int], world: int) -> int:
    """Elements of one rank's partition of a ZeRO-1/2 group (``get_data_parallel_partitions``)."""
    return aligned(sum(group), world) // world


def in_partition(group: Sequence[int], world: int, rank: int) -> list[tuple[int, int]]:
    """The parameters of a ZeRO-1/2 group in a rank's partition (``stage_1_and_2.py`` ``get_partition_info``: each
    that starts inside it, and one that starts before and ends inside), each as (its elements, its elements inside
    the partition: the view ``_get_flat_partition_unpadded`` hands the step and the gradient norm)."""
    return [(numel, inside) for _, numel, inside in _in_partition(group, world, rank)]


def _in_partition(group: Sequence[int], world: int, rank: int) -> list[tuple[int, int, int]]:
    """:func:`in_partition` with each parameter's index in the group first."""
    size, out, start = partition_size(group, world), [], 0
    lo = size * rank
    for k, numel in enumerate(group):
        if lo <= start < lo + size or start < lo < start + numel:
            out.append((k, numel, min(start + numel, lo + size) - max(start, lo)))
        start += numel
    return out


def held_elements(groups: Sequence[Sequence[int]], world: int, rank: int) -> int:
    """Elements of a rank's ``grads_in_partition`` (``copy_grads_in_partition``: its parameters, whole)."""
    return sum(n for g in groups for n, _ in in_partition(g, world, rank))


def held_by_rank(groups: Sequence[Sequence[int]], world: int) -> list[int]:
    """:func:`held_elements` of every rank, in one pass over the parameters (a parameter is whole in the rank it
    starts in and in every rank whose partition starts inside it)."""
    held = [0] * world
    for group in groups:
        for numel, ranks in zip(group, _owners(group, world), strict=True):
            for r in ranks:
                held[r] += numel
    return held


def _owners(group: Sequence[int], world: int) -> list[range]:
    """The ranks whose ``params_in_partition`` hold each parameter of a group (:func:`in_partition`)."""
    size, start, out = partition_size(group, world), 0, []
    for numel in group:
        first = start // size
        out.append(range(first, min(max(-(-(start + numel) // size), first + 1), world)) if first < world else range(0))
        start += numel
    return out


def _allocated_before(groups: Sequence[Sequence[int]], world: int, order: Sequence[tuple[int, int, int, int]],
                      stop: int, bucket: int) -> set[int]:
    """The ranks whose ``grads_in_partition`` exists before the hook of ``order[stop]`` runs (ZeRO-2): those with a
    parameter in a bucket ``reduce_ipg_grads`` reduced by then (``reduce_independent_p_g_buckets_and_remove_grads``:
    the bucket is reduced when the next gradient does not fit beside it; an extra-large one overfills it)."""
    owners = [_owners(g, world) for g in groups]
    done: set[int] = set()
    filled = 0
    members: list[tuple[int, int]] = []
    for g, k, numel, _ in order[:stop]:
        if filled + numel > bucket:
            for mg, mk in members:
                done.update(owners[mg][mk])
            filled, members = 0, []
        filled += numel
        members.append((g, k))
    return done


def _copied_before_partition(groups: Sequence[Sequence[int]], world: int, rank: int, bucket: int) -> int:
    """Elements of the gradients ``reduce_gradients`` has copied into the bucket (their own storage freed) when it
    allocates ``rank``'s ``grads_in_partition``: the walk of ``reduce_independent_p_g_buckets_and_remove_grads``
    up to the first reduced bucket that holds one of the rank's parameters."""
    mine = {(i, k) for i, g in enumerate(groups) for k, _, _ in _in_partition(g, world, rank)}
    copied, filled = 0, 0
    members: list[tuple[int, int]] = []
    for i, group in enumerate(groups):
        for k, numel in enumerate(group):
            if filled + numel > bucket:  # reduce_ipg_grads
                if any(m in mine for m in members):
                    return copied
                filled = 0
                members = []
            if numel <= bucket:
                copied += numel  # copied into the bucket; an extra-large one keeps its storage
            filled += numel
            members.append((i, k))
    return copied  # the epilogue's bucket (or none of the rank's: grads_in_partition is never made)


def zero1_reduction_bytes(spec: TrainingSpec) -> int:
    """Bytes ZeRO-1's end-of-backward reduction holds beyond every gradient and the ipg bucket (which the model
    states and ``buffers.deepspeed_reduce_bucket`` count in ``Phase.BACKWARD``): ``grads_in_partition`` less the
    gradients copied into the bucket before it is allocated, on the rank where that is largest (rank 0, whose
    partition starts with the first bucket, or the rank holding the most whole parameters). 0 for a run that does
    not reduce this way (ZeRO-2/3, ``overlap_comm``, no ``contiguous_gradients``, optimizer offload).

    Args:
        spec: The training spec.

    Returns:
        The bytes (>= 0).
    """
    off = spec.sharding.deepspeed
    if zero1_offload_keeps_grads(spec) and off is not None and not off.overlaps_comm:
        # optimizer offload: no grads_in_partition (copy_grads_in_partition's cpu_offload branch copies the rank's
        # part to the host), but the fp64 copy of the largest gradient's part for its norm, every gradient still
        # whole (real engine, benchmarks/deepspeed_offload_cpu.py zero1-offload: backward +0.23 %)
        return offload_grad_norm_bytes(spec)
    ds = contiguous_reduction(spec, during_backward=False)
    if ds is None:
        return 0
    groups = [[n for n, _ in g] for g in zero_groups(spec)]
    if not groups:
        return 0
    world = max(spec.data_parallel_size, 1)
    held = held_by_rank(groups, world)
    ranks = {0, max(range(world), key=lambda r: (held[r], -r))}
    elem = param_compute_bytes(spec)
    return max(
        elem * max(held[r] - _copied_before_partition(groups, world, r, ds.reduce_bucket_size), 0)
        for r in ranks
    )


def zero1_reduction_component(spec: TrainingSpec, activations_backward: int) -> Component | None:
    """ZeRO-1's end-of-backward reduction as a ``Phase.BACKWARD`` component: what that moment holds above the
    activations' worst backward moment (``activations_backward``: the activation components' ``Phase.BACKWARD``
    bytes, besides the gradients), so that the phase is the larger of the two moments. At that moment autograd has
    freed every activation.

    Args:
        spec: The training spec (the step's).
        activations_backward: The activation components' bytes in ``Phase.BACKWARD``.

    Returns:
        The component, or None when the reduction does not run or is below the activations' moment.
    """
    moment = zero1_reduction_bytes(spec)
    extra = moment - activations_backward
    if moment <= 0 or extra <= 0:
        return None
    return backward_moment_component(
        "buffers.deepspeed_grads_in_partition",
        Category.BUFFERS,
        extra,
        _SRC,
        f"ZeRO-1's reduction at the end of backward: grads_in_partition beside the gradients not yet copied into "
        f"the bucket ({moment:,} B), less the activations' backward moment it replaces as the phase's peak",
    )


def backward_moment_component(name: str, category: Category, extra: int, source: str, detail: str) -> Component:
    """A device component of ``extra`` bytes in ``Phase.BACKWARD`` only: a ZeRO reduction moment above the
    activations' own backward moment (ZeRO-1's here, ZeRO-2's first reduction on the traced path)."""
    return Component(name, category, Location.DEVICE, {p: extra if p is Phase.BACKWARD else 0 for p in PHASES},
                     source, detail)


def zero2_backward_grads(spec: TrainingSpec) -> tuple[int, int, int] | None:
    """What ZeRO-2's gradients hold on a rank at backward's moments after its first reduced bucket (before it:
    nothing but the bucket): (at the top layer's backward, at the bottom layer's, at the embedding's), bytes; None
    when the run does not reduce this way.

    deepspeed 0.19.8 ``runtime/zero/stage_1_and_2.py``: with ``partition_gradients`` (ZeRO-2) the gradient hook
    (``process_gradients`` -> ``reduce_ready_partitions_and_remove_grads``) runs
    ``reduce_independent_p_g_buckets_and_remove_grads`` as each gradient is made, in backward's order (the head
    first): a gradient that fits is copied into the ipg bucket (its storage freed), one above
    ``reduce_bucket_size`` keeps its own (``extra_large_param_to_reduce``); when the next does not fit,
    ``reduce_ipg_grads`` reduces the bucket, frees the gradients of other ranks' parameters
    (``clear_grad_attribute``) and copies this rank's into ``grads_in_partition`` (``copy_grads_in_partition``: its
    first call allocates all of it, the rank's ``params_in_partition`` whole). So a rank holds no gradient but the
    bucket (``buffers.deepspeed_reduce_bucket``) and the one being made until its first parameter is reduced, then
    its whole ``grads_in_partition``, whatever is not made yet. The rank holding the last parameters (the head, the
    final norm: the last rank, of both groups) allocates at the first bucket reduced; with the head above the
    bucket (transformers' ``"auto"`` hidden², or 5e8 below Llama-3's 525 M-element head) that is at the final
    norm's gradient, before the top layer's. At the bottom layer and the embedding, the ranks that have allocated
    are those with a parameter in a bucket reduced before (:func:`hook_order`): a rank holding only the embedding
    and the bottom layer's last tensors (rank 0 on 8 processes, its partition inside the embedding) has not. Real
    engine, 8 ranks on torch's fake process group (``/work/issues/s18/s18-zero.report.md``): the tied tiny Llama's
    rank 0 keeps no ``grads_in_partition`` at its backward peak (the embedding's), rank 2 keeps its 6,161,408
    elements.

    Args:
        spec: The training spec.

    Returns:
        (the last rank's ``grads_in_partition`` if its first bucket is reduced by the top layer's backward else 0,
        the largest ``grads_in_partition`` of a rank that allocated it before the bottom layer's backward, the same
        before the embedding's gradient hook), in bytes; None unless a full-size DeepSpeed ZeRO-2 run, or ZeRO-1
        with ``overlap_comm`` (``process_gradients`` takes the same hook path: ``if self.partition_gradients or
        self.overlap_comm``; real engine, one process, 64 tokens: -3.53 % before, -0.04 % with it), with
        ``contiguous_gradients`` and no optimizer offload.

    ZeRO-1 (with ``overlap_comm``) clears no gradient outside the rank's partition (``reduce_ipg_grads``: ``else:
    # zero stage 1``): one that fit the bucket is left a view of it, an extra-large one (above
    ``reduce_bucket_size``, reduced from its own storage) keeps that storage until the step: each value holds those
    made by then too (real engine, tiny Llama, 8 ranks, rank 7: the MLP weights' gradients at the embedding's
    backward).

    With gradient accumulation every micro-step's backward starts with no ``.grad`` (the epilogue,
    ``independent_gradient_partition_epilogue``, ends with ``_release_ipg_buffers``: ``grads_in_partition = None``,
    and ``_clear_param_grad_only``), so it reduces and allocates as the first does; but the previous micro-steps'
    partition stays alive beside it, as ``all_grad_tensors`` (views of the old ``grads_in_partition``, kept while
    not at the accumulation boundary, summed into with ``add_`` and dropped at the boundary). Each value then holds
    a rank's carried partition too: the largest of the ranks' carried + (made by then) new one (real engine, 64
    tokens, accumulation 2, the second micro-step: one process -7.75 % before, 8 ranks on the fake process group
    -5.69 % -> -2.57 % on rank 7; ``benchmarks/deepspeed_cpu.py`` ``CASES["zero2-accum2"]``). ZeRO-1 with
    ``overlap_comm`` carries no partition: its hook reduces only at the boundary micro-step, which starts with every
    ``.grad`` of the earlier ones (``core/states/accumulation.py``) and moves each into the bucket as its new
    gradient is added (``benchmarks/accumulation_engines_cpu.py``).
    """
    ds = contiguous_reduction(spec, during_backward=True)
    if ds is None:
        return None
    groups = [[n for n, _ in g] for g in zero_groups(spec)]
    if not groups:
        return None
    world = max(spec.data_parallel_size, 1)
    held = held_by_rank(groups, world)
    elem = param_compute_bytes(spec)
    # backward's order: what follows the layers (head, final norm), then the top layer; the first reduction comes
    # when the next gradient does not fit beside those already in the bucket (an extra-large one fills it)
    layer = sum(p.numel_each for p in spec.model.params if "*" in p.name)
    first = min((k for k, p in enumerate(spec.model.params) if "*" in p.name), default=len(spec.model.params))
    after = sum(p.numel for k, p in enumerate(spec.model.params) if k > first and "*" not in p.name)
    carried = held if spec.batch.grad_accum > 1 else [0] * world  # the previous micro-steps' partitions
    order = hook_order(spec)
    owners = [_owners(g, world) for g in groups]
    whole = zero1_overlap_keeps_grads(spec)  # ZeRO-1 accumulating: every .grad held until its hook at the boundary

    def worst(ranks: Iterable[int], stop: int) -> int:
        """The largest rank's carried + new partition (the new: ``ranks``') + ZeRO-1's kept extra-large gradients
        made before ``order[stop]`` (ZeRO-1 accumulating: the whole ``.grad`` of every parameter not hooked yet in
        place of a carried partition)."""
        before = [sum(t[2] for t in order[stop:])] * world if whole else carried
        made, kept = set(ranks), [0] * world
        for g, k, numel, _ in order[:stop] if spec.sharding.zero_stage == 1 else ():
            for r in range(world):  # reduce_ipg_grads' stage-1 branch clears no gradient outside the partition
                kept[r] += numel if numel > ds.reduce_bucket_size and r not in owners[g][k] else 0
        return max(before[r] + (held[r] if r in made else 0) + kept[r] for r in range(world)) * elem

    layers = [i for i, (_, _, _, at) in enumerate(order) if at >= 0]
    top = worst([world - 1] if after + layer > ds.reduce_bucket_size else [], layers[0] if layers else len(order))
    bottom = next((i for i, t in enumerate(order) if t[3] == 0), len(order))
    outs = []
    for stop in (bottom + 1, (layers[-1] + 1) if layers else len(order)):  # bottom: its first gradient hooked
        outs.append(worst(_allocated_before(groups, world, order, stop, ds.reduce_bucket_size), stop))
    return top, outs[0], outs[1]

