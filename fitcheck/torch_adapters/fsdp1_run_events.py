"""FSDP1's whole run, one rank, replayed through the caching allocator (issue 19: FSDP1 reserved).

The plain Trainer's whole run (``allocator_whole_run.whole_run_events``, traced as the 16-bit module mixed precision
computes with) rewritten into one rank's under accelerate 1.15 FSDP1 (``accelerator.py`` ``prepare_model``
l.1943-1971: ``FSDP(model, auto_wrap_policy=transformer_based_wrap, use_orig_params=..., ...)``; transformers 5.23
``training_args.py`` l.2875-2881 passes ``backward_prefetch=NO_PREFETCH``, ``use_orig_params=true``,
``sync_module_states=true``; units and flat layout: :func:`fsdp2_run_plan.fsdp1_plan`). torch 2.13
``distributed/fsdp/`` (``_flat_param.py`` = FP, ``_runtime_utils.py`` = RU, ``_init_utils.py`` = IU):

* prepare, per unit as ``_auto_wrap`` builds it (the layers, then the root; IU ``_init_param_handle_from_module``
  l.563): the unit's parameters moved to the device in the loaded dtype (IU ``_move_module_to_device`` l.603);
  ``sync_module_states``: ``_sync_module_params_and_buffers`` (IU l.637) -> ``dist._broadcast_coalesced`` with
  250 MiB buckets (IU l.60), a bucket of two or more tensors flattened into a temporary
  (``csrc/utils/tensor_flatten.cpp`` ``flatten_dense_tensors``; one tensor is its own view); the ``FlatParameter``
  (FP ``flatten_tensors`` l.838: ``torch.cat`` with ``_aligned_numel`` padding, padded to the world size);
  ``handle.shard()`` (IU l.665, FP l.945): one process is ``NO_SHARD`` (IU ``_init_core_state`` l.430 clamps the
  strategy at world size 1) and keeps the flat; more processes clone their chunk (FP ``_get_shard`` l.1122) and
  free the flat (``_typed_storage()._resize_(0)``); ``_use_sharded_views`` (FP l.2128) re-points the original
  parameters into it, freeing the moved storages. Then accelerate's upcast (``accelerator.py`` l.1998-2038, the
  root first: ``param.data = param.data.to(torch.float32)``) makes an fp32 flat (shard) per unit; the 16-bit one
  stays alive through the original parameters' views until the unit's first post-forward re-points them
  (``_use_sharded_views``; FP ``_writeback_orig_params`` l.2241 copies into the fp32 flat in place first).
  A bitsandbytes 4-bit base (QLoRA; ``Fsdp1Plan.resident``) is on each rank's GPU before ``prepare``: transformers
  5.23 ``quantizers/quantizer_bnb_4bit.py`` ``update_device_map`` turns ``device_map=None`` into the current
  GPU, with or without ``fsdp_cpu_ram_efficient_loading`` (``modeling_utils.py``
  ``_move_missing_keys_from_meta_to_device`` keeps its rank-0-only path for unquantized models, ``and not
  is_quantized``; accelerate 1.15 skips the meta move for ``Params4bit`` models). The Trainer's
  ``free_memory()`` empties the cache, and each unit is flattened from the loaded storages, which it frees: their
  segments stay cached (:func:`_prepare`). The packed weights are ``Params4bit`` in ``bnb_4bit_quant_storage``
  (``fsdp_params.packed_param``), frozen; their ``QuantState`` stays where the load put it.
* lazy init, at the root's first pre-forward (RU ``_lazy_init`` l.112 -> FP ``init_flat_param_attributes``
  l.1221, every handle): ``_mp_shard`` (``empty_like`` in ``param_dtype``) and, sharded, ``_full_param_padded``
  and the fp32 ``_full_prec_full_param_padded``, each allocated and freed at once (``_free_storage``).
* the root's pre-forward (RU ``_root_pre_forward`` l.594, ``_reset_flat_param_grad_info_if_needed``): the previous
  step's flat gradients freed (``zero_grad(set_to_none=True)`` only set the original parameters' ``.grad``).
* unshard (RU ``_unshard`` l.277): ``pre_unshard`` (FP l.1307) -> ``_use_low_precision_shard`` (FP l.1342)
  allocates ``_mp_shard`` on the pre-unshard stream; sharded, ``_alloc_padded_unsharded_flat_param`` (FP l.1395)
  on the unshard stream, the all-gather, and ``post_unshard`` (FP l.1523) frees ``_mp_shard``; ``NO_SHARD``
  computes with ``_mp_shard``.
* post-forward (RU ``_post_forward_reshard`` l.486): a layer frees its padded unsharded flat (``FULL_SHARD``); the
  root keeps it until its post-backward; ``post_reshard`` (FP l.1784) frees ``_mp_shard`` under ``NO_SHARD`` (the
  root's too, gathered again by its pre-backward hook, RU l.630). Backward prefetch: none (``NO_PREFETCH``);
  ``BACKWARD_PRE``/``POST`` from an accelerate config only unshard the next unit earlier, on the (pre-)unshard
  stream: no default-stream event moves (their pools: ``core/states/fsdp_streams.py``, two units in flight).
* backward: the unit's parameter gradients are views' gradients, concatenated into the flat gradient in
  ``param_dtype`` when the last one is made (autograd's ``split_with_sizes`` backward over FP
  ``_get_unflat_views``), then RU ``_post_backward_hook`` l.701: reshard (free the unsharded flat /
  ``_mp_shard``), and on the post-backward stream ``NO_SHARD`` all-reduces in place (RU ``_reduce_grad_no_shard``
  l.932) and ``_cast_grad_to_param_dtype`` (RU l.1030) makes the fp32 flat gradient; sharded, ``_reduce_grad``
  (RU l.831) makes ``new_sharded_grad`` (``empty_like(chunks[0])``, RU l.890) and casts it to fp32
  (``_saved_grad_shard``, ``.grad`` after RU ``_finalize_params`` l.1168). The 16-bit flat gradient is freed under
  ``record_stream(post-backward stream)``: its block serves the default stream again only once the device has
  passed the cast, and nothing synchronises the CPU before the Trainer's loss check after backward (transformers
  5.23 ``trainer.py`` l.1911-1914, ``logging_nan_inf_filter``): held to the end of backward (the bound). More
  processes: ``limit_all_gathers`` (accelerate's default ``True``) makes the CPU wait in ``_unshard`` (RU l.297)
  for the reshard event two units back (``_limiter_utils.py``, two in flight): held for two units.
* the optimizer (torch fused AdamW over the original parameters, built by the Trainer after ``prepare``:
  ``trainer.py`` l.1717 ``delay_optimizer_creation``; views into the flat parameter, FP ``_shard_param_infos``): per
  parameter with elements in this rank's shard a device step counter and two fp32 states of those elements at the
  first step (``torch/optim/adam.py`` ``_init_group`` l.139). The fp32 flat gradients stay until the next root
  pre-forward.

* peft LoRA (``Fsdp1Plan.split``): the Trainer sets peft's ``fsdp_auto_wrap_policy`` (transformers 5.23
  ``trainer.py`` l.1753 ``update_fsdp_plugin_peft``; peft 0.21.2 ``utils/other.py``), so each LoRA A/B Linear is an
  FSDP unit of its own nested in its layer: its own fp32 flat parameter (peft made it fp32; accelerate's upcast
  skips it), the layer's base and the root frozen bf16 flats (accelerate upcasts ``param.requires_grad`` flats only;
  a frozen flat has no ``_mp_shard`` where it is in ``param_dtype`` already, no gradient, no post-backward hook: RU
  ``_register_post_backward_reshard_only_hook`` reshards it once its inputs' gradients are made, the first layer's
  and the root's, whose inputs need none, in the final callback's ``_catch_all_reshard``). The nested adapters are
  unsharded and resharded with their layer (a few KiB early); each one's post-backward at its own gradient.
* gradient accumulation (transformers 5.23 ``trainer.py`` l.1902-1908: ``accelerator.no_sync`` but for a window's
  last micro-batch; accelerate 1.15 ``accelerator.py`` ``no_sync``: FSDP1's ``model.no_sync`` only where
  ``use_distributed``, more than one process): more processes: ``_post_backward_hook`` returns after the reshard
  (``state._sync_gradients`` False) and ``_finalize_params`` keeps ``.grad``, the unsharded flat gradient in
  ``param_dtype``; the next pass adds into it (FP ``prepare_gradient_for_backward`` keeps an unpadded unsharded
  ``.grad``) and the window's last reduces it. One process: every micro-batch is reduced; the next one adds into
  the fp32 ``.grad`` (``_reset_flat_param_grad_info_if_needed`` keeps it: the original parameters' ``.grad`` are
  set) and ``_post_backward_hook`` casts it to ``reduce_dtype`` and back (``_cast_grad_to_param_dtype``). The
  previous step's gradients go at the window's first root pre-forward.

Blocks allocated on a side stream are tagged ``side:`` (their pools: ``core/states/fsdp_streams.py``). Not
modelled: gradient clipping's scalars, the padding tensors of ``flatten_tensors`` (at most ``_aligned_numel``
elements). Where the events go in the traced step: as :mod:`.fsdp2_run_events` (a layer's forward is a period of
the forward's events, a unit's backward ends at its last gradient, gradients matched to units by size).

Checked: live bytes after prepare, after each backward (and each micro-batch's) and after the first step against
REAL FSDP1 runs on CPU (gloo, 1 and 2 ranks, 3 for the accumulating ones; full fine-tune, LoRA r 8 on q/v, two
micro-batches, both: ``benchmarks/fsdp2_run_events_cpu.py --version 1``, recorded in
``benchmarks/data/fsdp1_run_events_cpu.json``, ``tests/test_fsdp1_run_events.py``: within 72 bytes); the H100 row
``benchmarks/fsdp_gpu.py --rescore``. Pure Python: no torch import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.deepspeed_run_backward import Handle, RankEvents
from fitcheck.torch_adapters.deepspeed_run_events import (
    EMPTY_CACHE,
    MARK,
    RESET_PEAKS,
    SIDE,
    Event,
    EventWriter,
    rewritten_run,
)
from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan, replay_key, replays
from fitcheck.torch_adapters.fsdp_plan_types import Fsdp1Plan, FsdpReplayError
from fitcheck.torch_adapters.fsdp_resident import resident_setup, wrapped
from fitcheck.torch_adapters.fsdp_run_walk import aligned_gradients, rewrite_steps, step_frame, unit_gradients

BUCKET = 250 * 1024 * 1024  # torch 2.13 fsdp/_init_utils.py PARAM_BROADCAST_BUCKET_SIZE
LIMIT = 2  # torch 2.13 fsdp/_limiter_utils.py _FreeEventQueue._max_num_inflight_all_gathers


Key = tuple[int, int]  # (unit, its flat parameter: Fsdp1Plan.handles)


class _Rank(RankEvents):
    """One rank's FSDP1 state through the run (module docstring), writing its events."""

    def __init__(self, plan: Fsdp1Plan, w: EventWriter, old: dict[Key, Handle]) -> None:
        super().__init__(w)
        self.plan = plan
        self.old = old  # flat -> its 16-bit flat (shard) kept by the original parameters' views after the upcast
        self.unsharded: dict[Key, Handle] = {}  # flat -> _mp_shard (one process) / padded unsharded flat
        self.grads: dict[Key, Handle] = {}  # the fp32 flat gradients (post-backward stream) until the next step
        self.kept: dict[Key, Handle] = {}  # no_sync: the unsharded flat gradients (param_dtype) to the boundary
        self.recorded: list[Handle] = []  # default-stream blocks freed under record_stream(post-backward stream)

    def keys(self, u: int) -> list[Key]:
        return [(u, k) for k in range(len(self.plan.handles(u)))]

    def unshard(self, u: int, tag: str) -> None:
        """``_unshard`` of each of the unit's flats: ``_mp_shard`` on the pre-unshard stream where the flat is
        not in ``param_dtype``; sharded, the all-gather destination."""
        p = self.plan
        for key in self.keys(u):
            if key in self.unsharded:
                continue
            shard = p.shard(*key)
            mp = self.new(shard * p.compute, SIDE + tag) if p.compute != p.flat_orig(*key) else None
            if p.world == 1:
                self.unsharded[key] = mp if mp is not None else (0, 0, tag)
                continue
            self.unsharded[key] = self.new(shard * p.world * p.compute, SIDE + tag)
            self.free(mp)  # post_unshard: _free_low_precision_sharded_param

    def synchronize(self) -> None:
        """The CPU waits for the device: the blocks ``record_stream`` held go back to the pool."""
        for h in self.recorded:
            self.free(h)
        self.recorded = []

    def reshard(self, u: int, free: bool, tag: str, keys: list[Key] | None = None) -> None:
        """``_reshard`` (of ``keys``, default every flat of the unit): free the padded unsharded flat where
        ``free``; ``NO_SHARD``'s ``post_reshard`` frees ``_mp_shard`` every time. The first time, the upcast's
        16-bit flat goes (``_use_sharded_views``; its free is tagged with the point's region, not prepare's)."""
        for key in self.keys(u) if keys is None else keys:
            if self.plan.world == 1 or free:
                h = self.unsharded.pop(key, None)
                if h is not None and h[1]:
                    self.free(h)
            old = self.old.pop(key, None)
            if old is not None:
                self.w.free(old[0], old[1], tag)

    def post_backward(self, key: Key, grads: list[Handle], tag: str, sync: bool, later: bool) -> None:
        """The flat gradient (``param_dtype``, default stream), ``_post_backward_hook``'s reshard and reduction;
        under ``no_sync`` the reshard only, the unsharded flat gradient kept as ``.grad``. ``later``: a later
        micro-batch, whose traced gradients the plain run frees itself (``AccumulateGrad`` into ``.grad``)."""
        p = self.plan
        n = p.layout(*key)[0]
        flat = self.new(n * p.compute, tag)
        for g in [] if later else grads:
            self.free(g)
        self.reshard(key[0], True, tag, [key])
        kept = self.kept.pop(key, None)
        if kept is not None:  # AccumulateGrad: .grad += the new flat gradient, in place
            self.free(flat)
            flat = kept
        if not sync:  # _post_backward_hook returns after the reshard (state._sync_gradients False)
            self.kept[key] = flat
            return
        shard = p.shard(*key)
        orig = p.flat_orig(*key)
        old = self.grads.pop(key, None)
        if old is not None:  # one process, no no_sync: the fp32 .grad of the last micro-batch, added into in
            # place, then _post_backward_hook's .to(reduce_dtype) (the fp32 one kept by record_stream)
            self.free(flat)
            self.recorded.append(old)
            flat = self.new(n * p.reduce, tag)
        if p.world > 1:  # _reduce_grad: new_sharded_grad in reduce_dtype, then the cast to the parameter dtype
            out = self.new(shard * p.reduce, SIDE + tag)
            self.grads[key] = self.new(shard * orig, SIDE + tag) if p.reduce != orig else out
            if p.reduce != orig:
                self.free(out)
        else:  # _reduce_grad_no_shard: all-reduce in place, _cast_grad_to_param_dtype
            self.grads[key] = self.new(shard * orig, SIDE + tag)
        self.recorded.append(flat)
        while p.world > 1 and len(self.recorded) > LIMIT:  # limit_all_gathers: the CPU waited for the device
            self.free(self.recorded.pop(0))


def _prepare(w: EventWriter, plan: Fsdp1Plan, resident: dict[Key, list[tuple[int, int]]] | None = None,
             ) -> dict[Key, Handle]:
    """``FullyShardedDataParallel.__init__`` per flat parameter (a nested adapter unit before its layer's own) and
    accelerate's upcast (module docstring); returns each flat's 16-bit flat (shard) the upcast leaves behind.

    ``resident``: the model is on the device already (``fsdp_resident.resident_storages``, the storages each flat
    is made of); the run's peaks restart here, after the load (``torch.cuda.reset_peak_memory_stats``: the load
    phase is estimated apart, ``core/states/fsdp_qlora.py``). The Trainer's ``accelerator.free_memory()``
    (transformers 5.23 ``trainer.py`` l.1593, first line of ``_inner_training_loop``; accelerate 1.15
    ``utils/memory.py`` ``release_memory`` -> ``clear_device_cache``: ``torch.cuda.empty_cache()``) returns the
    load's cache first; ``_move_module_to_device`` moves nothing, and each unit's flat parameter
    (``flatten_tensors``' ``torch.cat``) is a new block beside the loaded storages, which ``_use_unsharded_views``
    / ``_use_sharded_views`` then drop: their blocks stay cached, a segment whole once all it held is freed.
    """
    t = "setup"
    if resident is not None:
        w.out += [(-1, 0, RESET_PEAKS), (-1, 0, EMPTY_CACHE)]
    flats: dict[Key, tuple[int, int]] = {}
    for u in plan.wrap_order:
        handles = plan.handles(u)
        for k in wrapped(plan, u):
            load = plan.flat_load(u, k)
            moved = (resident[(u, k)] if resident is not None
                     else [(w.new(q.numel * load, t), q.numel * load) for q in handles[k]])
            group: list[int] = []
            for q in [*handles[k], None]:  # _broadcast_coalesced's buckets (take_tensors: up to BUCKET bytes each)
                if q is not None:
                    group.append(q.numel * load)
                if group and (q is None or sum(group) >= BUCKET):
                    if len(group) > 1 and plan.sync:
                        w.free(w.new(sum(group), t), sum(group), t)
                    group = []
            flat = plan.layout(u, k)[0] * load
            s = w.new(flat, t)
            if plan.world > 1:
                shard = w.new(flat // plan.world, t)
                w.free(s, flat, t)
                s, flat = shard, flat // plan.world
            for m, nb in moved:
                w.free(m, nb, t)
            flats[(u, k)] = (s, flat)
    old: dict[Key, Handle] = {}
    for u in range(len(plan.units)):  # accelerate's upcast, FSDP.fsdp_modules order: the root, then the layers
        for k in range(len(plan.handles(u))):  # a flat with requires_grad, not yet fp32
            if plan.trainable(u, k) and plan.flat_orig(u, k) != plan.flat_load(u, k):
                w.new(plan.shard(u, k) * plan.flat_orig(u, k), t)
                old[(u, k)] = (*flats[(u, k)], t)
    return old


def _lazy_init(w: EventWriter, plan: Fsdp1Plan, tag: str) -> None:
    """``init_flat_param_attributes``' placeholders, each freed at once (module docstring)."""
    for u in range(len(plan.units)):
        for k in range(len(plan.handles(u))):
            shard, orig = plan.shard(u, k), plan.flat_orig(u, k)
            sizes = [shard * plan.compute] if plan.compute != orig else []
            if plan.world > 1:
                sizes.append(shard * plan.world * plan.compute)
                if plan.compute != orig:
                    sizes.append(shard * plan.world * orig)
            for n in sizes:
                w.free(w.new(n, tag), n, tag)


def fsdp1_run(events: Sequence[Event], plan: Fsdp1Plan, load: Sequence[Any] = ()) -> list[Event]:
    """The plain Trainer's whole run (``allocator_whole_run.whole_run_events``) rewritten into one FSDP1 rank's.

    Args:
        events: The plain run's events (composed with ``plan.accum`` micro-batches a step).
        plan: The FSDP1 run (:func:`fsdp2_run_plan.fsdp1_plan`).
        load: A resident model's load (``core.loading.load_events``), which replaces the plain run's setup
            (``fsdp_resident.loaded_setup``); without it the traced module's storages are the loaded ones.

    Returns:
        The rank's events: a region starting with ``side:`` is an allocation on a side stream; each optimizer
        step is tagged ``optimizer`` (the last step) or ``optimizer_warmup`` (a ``MARK`` event where it allocates
        nothing).

    Raises:
        FsdpReplayError: The events lack a parameter's storage, a step, or a gradient of a unit.
    """
    first_pass: dict[str, Any] = {}  # the step's first pass: its backward and its units' gradients
    events, resident = resident_setup(events, plan, load)  # each loaded storage freed by its unit's flattening
    return rewrite_steps(events, plan, lambda w: _Rank(plan, w, _prepare(w, plan, resident)),
                         lambda start, end, grads, k: _step_points(events, start, end, grads, plan, k, first_pass),
                         lambda rank, tag, first: _optimizer(rank, plan, tag, first), resident=plan.resident)


def _optimizer(rank: _Rank, plan: Fsdp1Plan, tag: str, first: bool) -> None:
    """Fused AdamW over the trainable original parameters' views in this rank's shard (its states at the first
    step)."""
    w = rank.w
    w.out.append((MARK, 0, tag))
    if first:  # torch/optim/adam.py _init_group: state["step"] on the device (fused), exp_avg, exp_avg_sq
        for u in range(len(plan.units)):
            for k in range(len(plan.handles(u))):
                for q, numel in zip(plan.handles(u)[k], plan.in_shard(u, 0, k), strict=True):
                    if numel and not q.frozen:
                        w.new(4, tag)
                        w.new(numel * plan.orig_of(q), tag)
                        w.new(numel * plan.orig_of(q), tag)


Op = Any  # Callable[[_Rank, str], None]


def _by_flat(plan: Fsdp1Plan, u: int, owned: list[tuple[int, Handle]]) -> dict[int, list[tuple[int, Handle]]]:
    """A unit's traced gradients split among its trainable flat parameters by size (peft's adapters: one each)."""
    handles = plan.handles(u)
    out: dict[int, list[tuple[int, Handle]]] = {k: [] for k in range(len(handles)) if plan.trainable(u, k)}
    if len(out) == 1:
        return {k: list(owned) for k in out}
    want = {k: [q.numel * plan.traced_of(q) for q in handles[k]] for k in out}
    for i, h in owned:
        k = next((k for k in out if h[1] in want[k]), None)
        if k is None:
            raise FsdpReplayError("a traced gradient of no flat parameter of its unit")
        want[k].remove(h[1])
        out[k].append((i, h))
    return out


def _step_points(events: Sequence[Event], start: int, end: int, grads: set[int], plan: Fsdp1Plan, k: int,
                 first_pass: dict[str, Any]) -> dict[int, list[Op]]:
    """What FSDP1 does where in one pass's events ``[start, end)`` (pass ``k`` of the run), as operations keyed by
    the index they precede.

    Raises:
        FsdpReplayError: The step has no forward head or backward, or a gradient matches no unit.
    """
    at: dict[int, list[Op]] = {}

    def put(i: int, op: Op) -> None:
        at.setdefault(i, []).append(op)

    units = plan.units
    layers = list(range(1, len(units)))
    first, back, bounds = step_frame(events, start, end, len(layers))
    m = k % plan.accum  # the pass's place in its accumulation window
    # transformers 5.23 trainer.py: accelerator.no_sync but for the window's last pass; accelerate 1.15
    # accelerator.py no_sync: FSDP1's model.no_sync only where use_distributed (more than one process)
    sync = m == plan.accum - 1 or plan.world == 1

    def root_pre_forward(r: _Rank, t: str) -> None:  # _lazy_init, _reset_flat_param_grad_info_if_needed
        if k == 0:
            _lazy_init(r.w, plan, t)
        if m == 0:  # zero_grad(set_to_none=True) cleared the original parameters' .grad: the flat ones go
            for h in r.grads.values():
                r.free(h)
            r.grads = {}
        r.unshard(0, t)

    put(first, root_pre_forward)
    for j, u in enumerate(layers):
        if j:
            put(bounds[j], lambda r, t, v=u - 1: r.reshard(v, True, t))
        put(bounds[j], lambda r, t, u=u: r.unshard(u, t))
    if layers:
        put(bounds[-1], lambda r, t, v=layers[-1]: r.reshard(v, True, t))
    put(back, lambda r, t: r.reshard(0, False, t))  # the root's post-forward: kept gathered (sharded)
    put(back, lambda r, t: r.unshard(0, t))  # its pre-backward hook
    # backward: gradients to units by size; the root's come first (head, final norm) and last (embedding)
    order = [0, *layers[::-1]]
    if m == 0:
        owned, strays = unit_gradients(events, back, end, grads, plan, order)
        first_pass.update(back=back, end=end, owned=owned)
    else:  # a later pass allocates each gradient and frees it into .grad (allocator_compose._accumulated)
        owned = aligned_gradients(events, first_pass, back, end)
        strays = [events[i] for i in range(back, end) if events[i][1] > 0 and events[i][0] in grads]
    for h in strays:
        put(end, lambda r, t, h=h: r.free(h))
    for u in layers[::-1]:  # a layer's pre-backward hook, at its first gradient
        if owned[u]:
            put(owned[u][0][0], lambda r, t, u=u: r.unshard(u, t))
    for u in order:  # the post-backward hook once the flat's last gradient is made
        split = _by_flat(plan, u, owned[u])
        for fk, hs in split.items():
            pos = end if u == 0 else hs[-1][0] + 1
            put(pos, lambda r, t, key=(u, fk), hs=[h for _, h in hs]: r.post_backward(key, hs, t, sync, m > 0))
        if len(split) < len(plan.handles(u)):  # a frozen flat: _post_backward_reshard_only_hook on the unit's
            # inputs that require grad (the first layer's and the root's have none: the final callback's
            # _catch_all_reshard)
            frozen = [(u, fk) for fk in range(len(plan.handles(u))) if fk not in split]
            pos = end if u in (0, 1) or not owned[u] else owned[u][-1][0] + 1
            put(pos, lambda r, t, u=u, frozen=frozen: r.reshard(u, True, t, frozen))

    def final(r: _Rank, t: str) -> None:
        r.synchronize()
        if m != plan.accum - 1:  # a point of the run between micro-batches (the benchmarks' ``backward1.0``)
            r.w.out.append((MARK, 0, "micro"))

    put(end, final)
    return at


def replayed(spec: TrainingSpec) -> bool:
    """Whether the whole run of an FSDP spec is replayed as FSDP1's (:func:`fsdp1_run`)."""
    return replays(spec, 1)


def whole_run(path: Any, spec: TrainingSpec, key: str, required: bool = False) -> Any:
    """A ``PinnedPath``'s FSDP1 whole run replayed (``deepspeed_run_events.rewritten_run``): the default stream's
    ``allocator_replay.StepReplay``, or None (the reason kept in the path's ``_whole_failed``)."""
    from fitcheck.core.loading import load_events

    plan = fsdp1_plan(spec)
    load = load_events(spec, spec.hardware.gpu_memory_bytes) if plan.resident else []
    return rewritten_run(path, spec, key, replay_key(spec, plan), "fsdp1-run",
                         lambda events: fsdp1_run(events, plan, load), required, micro_batches=plan.accum)


__all__ = ["fsdp1_run", "replayed", "whole_run"]
