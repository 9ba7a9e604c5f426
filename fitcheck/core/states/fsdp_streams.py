"""FSDP's side CUDA streams: the caching-allocator pools that stay reserved beside the step's own.

torch's caching allocator gives a freed block back only to the stream it was allocated on (torch 2.13
``c10/cuda/CUDACachingAllocator.cpp``: ``BlockComparatorSize`` orders free blocks by stream first and
``get_free_block`` rejects a block whose ``stream`` differs from the request's). FSDP allocates on side streams,
so what it keeps there is never reused by the activations on the default stream, and nothing calls
``empty_cache`` between steps: while the default stream reaches its activation peak, the side pools' segments are
cached but unusable. Reserved = the default stream's reserved + the side pools.

FSDP2 (torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_collectives.py``):

* ``foreach_all_gather`` runs ``with device_handle.stream(all_gather_copy_in_stream)``: the shard cast to the
  ``MixedPrecisionPolicy.param_dtype`` (``_get_param_all_gather_inputs``: ``flat_foreach_copy_input``, only with a
  ``param_dtype``) and the flat ``all_gather_output`` (the unit in ``param_dtype``). The cast is freed at the end of
  the copy-in; the output after the copy-out, the last one kept until the next unit's copy-out
  (``_fsdp_param_group.py`` ``wait_for_unshard``).
* ``foreach_reduce`` allocates ``reduce_output`` (the shard in ``reduce_dtype``) ``with
  device_handle.stream(reduce_scatter_stream)`` and casts it to the parameter dtype in ``post_reduce_stream`` (the
  same stream without HSDP's all-reduce): the sharded gradients are views of that cast ("the GPU sharded gradient
  is allocated in the RS stream") and live until ``zero_grad``.
* One shard (one process): ``_fsdp_param_group.py`` ``unshard`` returns before ``foreach_all_gather`` when
  ``world_size == 1`` and ``wait_for_unshard`` makes each parameter's cast and unsharded tensor on the current
  (default) stream: the copy-in stream's pool stays empty. On the H100 rows of
  ``benchmarks/data/fsdp_gpu_nvidia_h100_80gb_hbm3.json`` (one process) the 1004 MiB gather pool this module
  counted before was the +2.8 % (+4.2 % with checkpointing) left of the reserved error once the default stream
  was replayed as FSDP2's (``torch_adapters/fsdp2_run_events.py``).

FSDP1 (torch 2.13 ``distributed/fsdp/_runtime_utils.py``, ``_flat_param.py``):

* ``_unshard``: ``pre_unshard`` (the ``_mp_shard``, the flat shard cast to ``param_dtype``) in
  ``_pre_unshard_stream``, freed after the all-gather, or at the unit's reshard under ``NO_SHARD`` (``post_reshard``);
  the all-gather into the padded unsharded flat parameter in ``_unshard_stream``, freed at the reshard (the root's
  after backward: ``_post_forward_reshard`` keeps the root gathered). ``limit_all_gathers`` lets two units be in
  flight.
* One process (``NO_SHARD``): ``post_reshard`` frees every unit's ``_mp_shard`` at its post-forward (the root's
  too: its pre-backward hook gathers it again) under ``record_stream`` of the default stream, and nothing holds
  the CPU back before the Trainer's loss check after backward (the rate limiter only queues events where the
  unsharded flat parameter is freed): the pool is bounded by every unit's cast plus the root's again
  (:func:`_no_shard_events`). On the H100 FSDP1 row (one process) that bound is what the measurement shows: the
  row went from -5.0 % to +0.3 % with the rewritten default stream (``torch_adapters/fsdp1_run_events.py``);
  two in flight, as before, left it at -5.7 %.
* ``_post_backward_hook`` runs ``with state._device_handle.stream(state._post_backward_stream)``: the reduce-scatter
  output (``_reduce_grad``: ``new_sharded_grad = torch.empty_like(chunks[0])``) and ``_cast_grad_to_param_dtype``,
  whose result is the sharded (``NO_SHARD``: whole) gradient in the parameter dtype, live until ``zero_grad``.

Each pool is replayed through :mod:`fitcheck.core.caching` (two steps, so that blocks freed in step 1 are reused
in step 2, as on the GPU). Checked against our H100 runs of FSDP1/FSDP2 (``benchmarks/fsdp_gpu.py --rescore``).
Pure: no torch, no environment.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fitcheck.core.caching import AllocatorConf, replay
from fitcheck.core.optimizers import TensorGroup
from fitcheck.core.states.fsdp2_units import tail_params
from fitcheck.core.states.fsdp_qlora import gathered_layer_bytes, is_fsdp_4bit
from fitcheck.core.states.fsdp_upcast import fsdp_fp32_upcast
from fitcheck.core.states.layout import all_trainable, build_layout
from fitcheck.core.states.sharding import param_compute_bytes, partition
from fitcheck.report import PHASES, Phase
from fitcheck.spec import DeviceType, MixedPrecision, Strategy, TrainingSpec
from fitcheck.units import format_bytes

_SRC = ("torch 2.13 CUDACachingAllocator.cpp get_free_block (a freed block serves only its own stream); "
        "FSDP2 _fsdp_collectives.py foreach_all_gather (all_gather_copy_in_stream) / foreach_reduce "
        "(reduce_scatter_stream); FSDP1 _runtime_utils.py _unshard (pre-unshard, unshard streams) / "
        "_post_backward_hook (post-backward stream) (fitcheck/core/states/fsdp_streams.py)")


@dataclass(frozen=True)
class _Unit:
    """One FSDP unit: bytes it gathers, bytes of its shard cast to ``param_dtype``, its trainable elements."""

    gather_bytes: int
    cast_bytes: int
    grad_numel: int


@dataclass(frozen=True)
class SidePools:
    """What FSDP's side streams keep reserved, and how much of it the estimate already counts as allocated.

    Attributes:
        gather: Peak bytes reserved by the gather stream(s) (FSDP2 copy-in; FSDP1 pre-unshard + unshard).
        reduce: Peak bytes reserved by the reduce stream (FSDP2 reduce-scatter; FSDP1 post-backward).
        live: Per phase, bytes in those pools that the step's components already count as allocated (the
            sharded gradients, gathered units held on a side stream).
        detail: One line for the report.
        source: Where the rules come from.
        code: The finding's code (``deepspeed_streams.py`` gives DeepSpeed's pools its own).
    """

    gather: int
    reduce: int
    live: dict[Phase, int]
    detail: str
    source: str = _SRC
    code: str = "fsdp-side-streams"

    def beyond_allocated(self, phase: Phase) -> int:
        """Reserved bytes the side pools add at ``phase`` beyond what the step counts as allocated."""
        return max(0, self.gather + self.reduce - self.live.get(phase, 0))


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


def _units(spec: TrainingSpec, trainable: list[TensorGroup], compute: int, shard: int, version: int) -> list[_Unit]:
    """The units in forward order, as accelerate 1.15 wraps a transformers model (FSDP2: ``fsdp2_units.py``, an
    untied input embedding its own first unit, the final norm + LM head last; FSDP1: one root unit first with
    everything outside the decoder layers)."""
    params = spec.model.params
    layer_grad = sum(g.numel_each for g in trainable if "*" in g.name)
    layers_trained = max((g.repeat for g in trainable if "*" in g.name), default=0)
    outside_grad = sum(g.numel_each * g.repeat for g in trainable if "*" not in g.name)
    layer_numel = sum(p.numel_each for p in params if p.per_layer)
    quant = is_fsdp_4bit(spec)
    layer_gather = gathered_layer_bytes(spec, compute) if quant else layer_numel * compute
    # the shard cast (FSDP2 _fsdp_param.py init_dtype_attrs: only parameters whose dtype differs from param_dtype):
    # every parameter when the model is loaded in another dtype, else the fp32-upcast trainables
    every = spec.precision.load_dtype.nbytes != compute and not quant
    upcast = fsdp_fp32_upcast(spec)
    # FSDP2: accelerate's tail unit (fsdp2_units.tail_params), an untied embedding its own unit; FSDP1: one root
    outside = sum(p.numel for p in params if not p.per_layer)
    rest = tail_params(spec) if version == 2 else outside
    embedding = outside - rest
    emb_grad = min(outside_grad, embedding)
    rest_grad = outside_grad - emb_grad

    def unit(numel: int, gather: int, grad: int) -> _Unit:
        cast = numel if every else (grad if upcast else 0)
        return _Unit(gather, _ceil(cast, shard) * compute, grad)

    n = spec.model.shape.num_layers
    layers = [unit(layer_numel, layer_gather, layer_grad if i >= n - layers_trained else 0) for i in range(n)]
    if embedding:
        return [unit(embedding, embedding * compute, emb_grad), *layers, unit(rest, rest * compute, rest_grad)]
    return [unit(rest, rest * compute, rest_grad), *layers]


def _gather_events(forward: list[tuple[int, int]], backward: list[tuple[int, int]], held: tuple[int, int] | None,
                   steps: int) -> Iterator[tuple[str, int, int]]:
    """A gather stream over units ``(cast bytes, gathered bytes)``, ``steps`` times: the ``forward`` units in
    order, then the ``backward`` ones; per unit its shard cast (freed once copied in) and its gathered buffer, two
    buffers alive (the current and the next). ``held``: a unit gathered first and kept to the end of backward
    (FSDP1's root)."""
    h = 0
    for _ in range(steps):
        root = None
        if held is not None:
            h += 1
            root = h
            yield "alloc", root, held[1]
        for order in (forward, backward):
            prev = None
            for cast, gather in order:
                if cast:
                    h += 1
                    yield "alloc", h, cast
                    cast_h = h
                h += 1
                yield "alloc", h, gather
                if cast:
                    yield "free", cast_h, 0
                if prev is not None:
                    yield "free", prev, 0
                prev = h
            if prev is not None:
                yield "free", prev, 0
        if root is not None:
            yield "free", root, 0


def _no_shard_events(root: int, layers: list[int], steps: int) -> Iterator[tuple[str, int, int]]:
    """FSDP1 ``NO_SHARD`` (one process) with mixed precision: the pre-unshard stream's ``_mp_shard`` blocks.

    Every unit's ``_mp_shard`` is allocated at its pre-forward and freed at its post-forward (``post_reshard``,
    the root's at the end of forward) under ``record_stream(default stream)`` (``_flat_param.py``
    ``_free_low_precision_sharded_param``): the block serves the pool again only once the device has passed that
    unit's forward (``CUDACachingAllocator.cpp``: a block with stream uses waits for their events,
    ``process_events`` at each ``malloc``). One process has no CPU-device synchronisation before the Trainer's
    nan/inf check of the loss after backward (transformers 5.23 ``trainer.py`` ``logging_nan_inf_filter``):
    ``limit_all_gathers``' rate limiter only queues events where the unsharded flat parameter is freed
    (``_runtime_utils.py`` ``_reshard``), never under ``NO_SHARD``. Modelled bound: the CPU runs ahead of the device
    through the forward, so no forward block is reused in the forward, and the root's pre-backward re-gather
    cannot reuse the root's block freed just before it; the backward reuses the forward's blocks (the device passes
    them in order), two in flight."""
    h = 0
    for _ in range(steps):
        held = []
        for n in [root, *layers]:
            h += 1
            held.append(h)
            yield "alloc", h, n
        h += 1
        again = h
        yield "alloc", again, root  # the root's pre-backward re-gather
        for x in held:
            yield "free", x, 0
        prev = None
        for n in layers[::-1]:
            h += 1
            yield "alloc", h, n
            if prev is not None:
                yield "free", prev, 0
            prev = h
        if prev is not None:
            yield "free", prev, 0
        yield "free", again, 0


def _reduce_events(units: list[_Unit], shard: int, reduce_bytes: int, grad_bytes: int, keep: bool,
                   steps: int) -> Iterator[tuple[str, int, int]]:
    """The reduce stream in backward order: the shard in ``reduce_dtype``, its cast to the parameter dtype (the
    sharded gradient, kept until ``zero_grad`` unless offloaded), for ``steps`` steps."""
    h = 0
    for _ in range(steps):
        kept = []
        for u in units[::-1]:
            if not u.grad_numel:
                continue
            n = _ceil(u.grad_numel, shard)
            h += 1
            out = grad = h
            yield "alloc", out, n * reduce_bytes
            if reduce_bytes != grad_bytes:
                h += 1
                grad = h
                yield "alloc", grad, n * grad_bytes
                yield "free", out, 0
            if keep:
                kept.append(grad)
            else:
                yield "free", grad, 0  # offload_params: the shard is copied to host and dropped
        for g in kept:  # zero_grad(set_to_none=True) after the optimizer step
            yield "free", g, 0


def fsdp_side_pools(spec: TrainingSpec, conf: AllocatorConf) -> SidePools | None:
    """The bytes FSDP's side streams keep reserved on one GPU.

    Args:
        spec: The training spec.
        conf: The run's caching-allocator settings.

    Returns:
        The side pools, or None when the run is not FSDP on CUDA.
    """
    fs = spec.sharding.fsdp
    if spec.sharding.strategy is not Strategy.FSDP or spec.hardware.device_type is DeviceType.CPU:
        return None
    part = partition(spec)
    shard = max(part.gradients, 1)
    mixed = spec.precision.mixed_precision is not MixedPrecision.NO
    compute = param_compute_bytes(spec)
    version = fs.version if fs is not None else 2
    trainable = all_trainable(build_layout(spec))
    units = _units(spec, trainable, compute, shard, version)
    grad_bytes = max((g.dtype.nbytes for g in trainable), default=compute)
    reduce_bytes = compute if mixed else grad_bytes
    sharded = part.weights > 1
    steps = 2
    pairs = [(u.cast_bytes, u.gather_bytes) for u in units]
    if version == 2 and not sharded:  # one shard: no all-gather, nothing on the copy-in stream (module docstring)
        gather = 0
    elif version == 2:  # one copy-in stream; the tail (reshard_after_forward=False) is not gathered again in backward
        tail_last = len(units) > spec.model.shape.num_layers + 1  # an untied embedding unit comes first
        backward = (pairs[1:-1] if tail_last else pairs[1:])[::-1] + (pairs[:1] if tail_last else [])
        gather = replay(_gather_events(pairs, backward, None, steps), conf).peak_reserved
    else:  # pre-unshard stream: the _mp_shard casts (kept to the reshard under NO_SHARD); unshard stream: gathers
        layers = [(0, u.cast_bytes) for u in units[1:]]
        gather = 0
        if mixed and units[0].cast_bytes and sharded:  # freed once gathered: the root's too
            gather = replay(_gather_events([(0, units[0].cast_bytes), *layers], layers[::-1], None, steps),
                            conf).peak_reserved
        elif mixed and units[0].cast_bytes:  # NO_SHARD: the cast is the unsharded parameter until the reshard
            gather = replay(_no_shard_events(units[0].cast_bytes, [u.cast_bytes for u in units[1:]], steps),
                            conf).peak_reserved
        if sharded:
            layers = [(0, u.gather_bytes) for u in units[1:]]
            gather += replay(_gather_events(layers, layers[::-1], (0, units[0].gather_bytes), steps),
                             conf).peak_reserved
    # the reduce stream; FSDP1 NO_SHARD all-reduces the autograd gradient in place: only the cast is its own
    keep = not part.gradients_on_host
    in_place = version == 1 and not sharded
    if in_place and not mixed:
        reduce = 0
    else:
        first = grad_bytes if in_place else reduce_bytes
        reduce = replay(_reduce_events(units, shard, first, grad_bytes, keep, steps), conf).peak_reserved
    grads = sum(_ceil(u.grad_numel, shard) * grad_bytes for u in units) if keep and reduce else 0
    accum_kept = part.full_gradients_between_microsteps
    live = {p: 0 if p in (Phase.FORWARD_END, Phase.BACKWARD_START) or accum_kept else grads for p in PHASES}
    held = units[0].gather_bytes if units else 0
    if version == 2:  # the tail's flat all-gather output, held until the root's post-forward (one shard: none)
        live[Phase.FORWARD_END] += units[-1].gather_bytes if units and sharded else 0
    elif sharded or mixed:  # FSDP1: the gathered root (+ two units in backward) live in these pools
        unit = max((u.gather_bytes for u in units[1:]), default=0)
        live[Phase.FORWARD_END] += held
        live[Phase.BACKWARD_START] += held + 2 * unit
        live[Phase.BACKWARD] += held + unit
    return SidePools(
        gather=gather,
        reduce=reduce,
        live=live,
        detail=f"FSDP{version} side streams: gathers {format_bytes(gather)}, gradient reduction "
        f"{format_bytes(reduce)} (sharded gradients {format_bytes(grads)}), cached beside the step's own pool",
    )
