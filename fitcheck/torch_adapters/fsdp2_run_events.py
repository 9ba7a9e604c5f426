"""FSDP2's whole run, one rank, replayed through the caching allocator (issue 19: FSDP2 reserved).

The default path composes the plain Trainer's whole run from the traced step (``allocator_whole_run.whole_run_events``,
traced as the 16-bit module FSDP mixed precision computes with). Under accelerate 1.15's FSDP2
(``utils/fsdp_utils.py`` ``fsdp2_prepare_model``; units: :mod:`.fsdp2_run_plan`) one rank allocates something
else around that step; :func:`fsdp2_run` rewrites the plain run into it, read from torch 2.13
``distributed/fsdp/_fully_shard/``:

* prepare, per ``fully_shard`` call (layers bottom-up, the embedding, the tail, the root): the unit's parameters moved
  to the device in their dtype after accelerate's fp32 upcast (``_fsdp_init.py`` ``_move_states_to_device``:
  ``tensor.data = tensor.to(device)``; ``core/states/fsdp_upcast.py``), each one's padded shard made
  (``_fsdp_param.py`` ``_init_sharded_param``: ``param_data.new_zeros(padded_sharded_size)``), the moved
  parameters freed when ``fully_shard`` returns ("Let ``param_data`` be freed ... when the ``fully_shard`` call
  returns"). The traced module's own parameter storages are not on the device (the Trainer leaves an FSDP model
  where it was loaded; ``fully_shard`` moves it).
* unshard (``_fsdp_param_group.py`` ``unshard`` / ``wait_for_unshard``), one shard (world size 1): no all-gather;
  per parameter ``all_gather_inputs`` (the shard cast to ``param_dtype``, ``_to_dtype_if_needed``: a new tensor,
  freed when the next one is bound) and the unsharded parameter (``alloc_storage`` of ``all_gather_outputs[0]``),
  on the default stream. More shards: ``foreach_all_gather`` on the all-gather copy-in stream
  (``_fsdp_collectives.py``: ``flat_foreach_copy_input`` in ``param_dtype``, freed after the copy-in, and the flat
  ``all_gather_output``), then ``foreach_all_gather_copy_out`` on the default stream (per parameter
  ``alloc_all_gather_outputs``); in forward the flat output is kept until the next unit's copy-out or the root's
  post-forward (``all_gather_state``), in backward freed at once.
* reshard (``reshard`` -> ``free_unsharded_param``): after a unit's forward where ``reshard_after_forward``, and in
  ``post_backward`` (``reshard_after_backward``). Backward prefetch (``_backward_prefetch``): a unit's pre-backward
  issues the previous unit's all-gather (its copy-out waits for that unit's own pre-backward).
* ``post_backward``: reshard; the previous unit's ``reduce_scatter_input`` released
  (``reduce_scatter_max_input_buffers`` = 1); ``foreach_reduce``: ``reduce_scatter_input`` (``reduce_dtype``, the
  unit's padded gradients, default stream), the unsharded gradients freed (``unsharded_grads.clear()``), on the
  reduce-scatter stream ``reduce_output`` (the shard) and ``_to_dtype_if_needed(reduce_output, orig_dtype)``: the
  sharded gradients (views of one flat per unit), kept until ``zero_grad``. The last input is released by the
  root's ``_root_post_backward_final_callback`` (``reduce_scatter_states.clear()``), which also runs the
  post-backward of a unit whose inputs need no gradient (the input embedding) and of the tail when tied.
* the optimizer (torch fused AdamW on the shards, ``_init_group``): per parameter a device step counter and two
  fp32 states of the local shard at the first step; no temporaries. The torch optimizer's own events of the plain
  run (on the 16-bit module) are dropped. ``zero_grad(set_to_none=True)`` frees the sharded gradients.

* LoRA (peft ``get_peft_model`` over an unquantized base, adapters on every layer's targets;
  :func:`.fsdp2_run_plan.fsdp2_plan`): accelerate upcasts the ``requires_grad`` parameters only (``fsdp_utils.py``
  ``fsdp2_prepare_model``: ``if param.requires_grad and param.dtype != torch.float32``), so the frozen base is
  sharded in its load dtype and gathered without a cast (``_fsdp_param.py`` ``init_dtype_attrs``: ``param_dtype``
  clamped to None where it equals the orig dtype); the unsharded adapters are in ``param_dtype``, so are their
  ``.grad`` (the traced fp32 adapters' gradients are rewritten to that size); ``post_backward`` reduces
  ``fsdp_params_with_grad`` only (a frozen parameter's unsharded ``.grad`` is None) and a unit without any
  (the embedding, the head) reduces nothing; the input embedding's output needs no gradient, so it has no
  pre-backward (its prefetched all-gather is cleared by ``finalize_backward``) and the first layer's post-backward
  runs in the root's final callback; the optimizer holds the adapters only. The final norm is the root's:
  ``_find_final_norm`` reads ``model.base_model_prefix``'s children, the ``LlamaForCausalLM`` under peft. Under the
  Trainer (``fsdp2_plan``'s default) no layer has a unit (``core/states/fsdp2_units.py``): the root, every layer
  with it, is gathered at its pre-forward and kept to its post-backward in the final callback, which reduces all
  the adapters' gradients at once; the embedding reshards at the first layer's forward, the tail is gathered
  after the last.
* gradient accumulation (transformers 5.23 ``trainer.py``: ``accelerator.no_sync`` but for a window's last
  micro-batch; accelerate 1.15 ``accelerator.py`` ``no_sync`` under FSDP2: ``set_requires_gradient_sync(False)``,
  ``reduce_grads`` False): ``post_backward`` reshards and returns before reading the gradients, so each unit's
  unsharded ``.grad`` (``param_dtype``, whole) stays; the next pass's ``AccumulateGrad`` adds into it (the plain
  run composed with its micro-batches: ``allocator_compose.whole_run``), and the window's last pass reduces the
  accumulated ``.grad`` (``post_backward``: ``unsharded_param.grad``; ``reduce_dtype`` equal to ``param_dtype`` is
  clamped to None, so no ``unsharded_accumulated_grad`` copy) and frees it.

Where the events go in the traced step: a unit's backward starts at its first gradient and ends at its last
(gradients matched to units by size, in backward order); a layer's forward is one period of the forward's events
(the deepened trace repeats each layer's events: :func:`.fsdp2_run_plan.layer_starts`). Blocks allocated on a
side stream are tagged ``side:`` and left to ``core/states/fsdp_streams.py``'s pools
(:func:`deepspeed_run_events.replay_default_stream` replays the default stream). Not modelled: gradient clipping's
scalars (``clip_grad_norm_``: 0-d norms).

Not modelled either: the traced LoRA forward's autocast casts of the fp32 adapters (bf16 copies held to the end of
forward, which FSDP2's bf16 unsharded adapters do not need: the adapters' bytes in bf16, freed before backward).

Checked: live bytes after prepare, after each backward (and each micro-batch's) and after the first step against
REAL ``fully_shard`` runs on CPU (gloo, 1 and 2 ranks: ``benchmarks/fsdp2_run_events_cpu.py``; full fine-tune,
LoRA, two micro-batches, both: recorded in ``benchmarks/data/fsdp2_run_events_cpu.json``,
``tests/test_fsdp2_run_events.py``); the H100 rows ``benchmarks/fsdp_gpu.py --rescore``. Pure Python: no torch
import.
"""

from __future__ import annotations

import sys
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
from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan, fsdp2_plan, not_replayed, replay_key, replays
from fitcheck.torch_adapters.fsdp_plan_types import FsdpPlan
from fitcheck.torch_adapters.fsdp_resident import resident_setup
from fitcheck.torch_adapters.fsdp_run_walk import aligned_gradients, rewrite_steps, step_frame, unit_gradients


class _Rank(RankEvents):
    """One rank's FSDP2 state through the run (module docstring), writing its events."""

    def __init__(self, plan: FsdpPlan, w: EventWriter) -> None:
        super().__init__(w)
        self.plan = plan
        self.unsharded: dict[int, list[Handle]] = {}  # unit -> its unsharded parameters
        self.issued: dict[int, Handle] = {}  # more shards: unit -> its flat all-gather output, copy-out pending
        self.held: Handle | None = None  # forward: the last copied-out all-gather output (all_gather_state)
        self.rs_input: Handle | None = None  # the last reduce_scatter_input (reduce_scatter_states)
        self.grads: list[Handle] = []  # the sharded gradients' flats (reduce-scatter stream) until zero_grad
        self.kept: dict[int, list[Handle]] = {}  # no_sync: unit -> its unsharded gradients, kept to the boundary

    def unshard(self, u: int, tag: str) -> None:
        """``FSDPParamGroup.unshard``: more shards, ``foreach_all_gather`` on the copy-in stream."""
        p = self.plan
        if p.world == 1 or u in self.unsharded or u in self.issued:
            return
        params = p.units[u].params
        shard = sum(q.shard(p.world) for q in params)
        # all_gather_inputs: _to_dtype_if_needed casts the parameters whose orig dtype is not param_dtype
        casts = sum(q.shard(p.world) for q in params if p.orig_of(q) != p.compute)
        cast = self.new(casts * p.compute, SIDE + tag) if casts else None
        self.issued[u] = self.new(shard * p.world * p.compute, SIDE + tag)
        self.free(cast)

    def wait(self, u: int, tag: str, forward: bool) -> None:
        """``wait_for_unshard``: the unsharded parameters (default stream)."""
        p = self.plan
        if u in self.unsharded:
            return
        self.unshard(u, tag)
        bufs: list[Handle] = []
        if p.world == 1:
            cast = None
            for q in p.units[u].params:
                if p.compute != p.orig_of(q):  # all_gather_inputs: _to_dtype_if_needed(sharded data, param_dtype)
                    now = self.new(q.numel * p.compute, tag)
                    self.free(cast)
                    cast = now
                bufs.append(self.new(q.numel * p.compute, tag))
            self.free(cast)
        else:
            if forward:
                self.free(self.held)
                self.held = None
            bufs = [self.new(q.shard(p.world) * p.world * p.compute, tag) for q in p.units[u].params]
            out = self.issued.pop(u)
            if forward:
                self.held = out
            else:
                self.free(out)
        self.unsharded[u] = bufs

    def reshard(self, u: int) -> None:
        for h in self.unsharded.pop(u, []):
            self.free(h)

    def post_backward(self, u: int, grads: list[Handle], tag: str, sync: bool = True) -> None:
        """``post_backward``: reshard, release the previous input, ``foreach_reduce``; under ``no_sync``
        (``reduce_grads`` False) reshard only, the unsharded gradients kept (``.grad`` of the unsharded parameters:
        a later pass adds into them, ``AccumulateGrad``), reduced at the boundary's pass."""
        p = self.plan
        self.reshard(u)
        if not sync:
            self.kept.setdefault(u, grads)
            return
        grads = self.kept.pop(u, grads)
        self.free(self.rs_input)
        self.rs_input = None
        if not grads:
            return
        # fsdp_params_with_grad: the trainable ones (a frozen parameter's unsharded .grad is None)
        params = [q for q in p.units[u].params if not q.frozen]
        self.rs_input = self.new(sum(q.shard(p.world) for q in params) * p.world * p.reduce, tag)
        for g in grads:
            self.free(g)
        shard = sum(q.shard(p.world) for q in params)
        out = self.new(shard * p.reduce, SIDE + tag)
        orig = p.orig_of(params[0])  # _init_mp_dtypes: one orig dtype among a group's trainable parameters
        if p.reduce != orig:
            self.grads.append(self.new(shard * orig, SIDE + tag))
            self.free(out)
        else:
            self.grads.append(out)


def _prepare(w: EventWriter, plan: FsdpPlan, resident: dict[tuple[int, int], list[tuple[int, int]]] | None = None,
             ) -> None:
    """``fsdp2_prepare_model``'s ``fully_shard`` calls (module docstring). ``resident``: the model is on the device
    already (a bitsandbytes 4-bit base: ``fsdp_resident``; accelerate 1.15 skips ``cpu_ram_efficient_loading``'s
    meta move for it): the peaks restart after the load, the Trainer's ``free_memory()`` empties the cache, and
    each unit's padded shards are made beside the loaded storages, which stay alive to the end of
    ``fsdp2_prepare_model``: its ``original_sd = model.state_dict()`` (accelerate 1.15 ``utils/fsdp_utils.py``
    l.828) holds every one of them (the H200 measured twice the model allocated during prepare)."""
    if resident is not None:
        w.out += [(-1, 0, RESET_PEAKS), (-1, 0, EMPTY_CACHE)]
    for u in plan.wrap_order:
        params = plan.units[u].params
        moved = ([] if resident is not None
                 else [(w.new(q.numel * plan.orig_of(q), "setup"), q.numel * plan.orig_of(q)) for q in params])
        for q in params:
            w.new(q.shard(plan.world) * plan.orig_of(q), "setup")
        for m, nb in moved:
            w.free(m, nb, "setup")
    for u in plan.wrap_order if resident is not None else ():
        for m, nb in resident[(u, 0)]:  # type: ignore[index]
            w.free(m, nb, "setup")


def fsdp2_run(events: Sequence[Event], plan: FsdpPlan, load: Sequence[Any] = ()) -> list[Event]:
    """The plain Trainer's whole run (``allocator_whole_run.whole_run_events``) rewritten into one FSDP2 rank's.

    Args:
        events: The plain run's events.
        plan: The FSDP2 run (:func:`fsdp2_run_plan.fsdp2_plan`).
        load: A resident model's load (``core.loading.load_events``), which replaces the plain run's setup
            (``fsdp_resident.loaded_setup``); without it the traced module's storages are the loaded ones.

    Returns:
        The rank's events: a region starting with ``side:`` is an allocation on a side stream; the optimizer of
        each step is tagged ``optimizer`` (the last step) or ``optimizer_warmup``.

    Raises:
        FsdpReplayError: The events lack a parameter's storage, a step, or a gradient of a unit.
    """
    events, resident = resident_setup(events, plan, load)  # each loaded storage freed by its unit's fully_shard

    def prepare(w: EventWriter) -> _Rank:
        _prepare(w, plan, resident)
        return _Rank(plan, w)

    first_pass: dict[str, Any] = {}  # the step's first pass: its backward and its units' gradients
    resized: dict[int, int] = {}  # traced gradients FSDP2 makes in param_dtype: storage -> its bytes

    out = rewrite_steps(events, plan, prepare,
                        lambda start, end, grads, k: _step_points(events, start, end, grads, plan, k, first_pass,
                                                                  resized),
                        lambda rank, tag, first: _optimizer(rank, plan, tag, first), resident=plan.resident)
    return [(s, resized[s] if n > 0 else -resized[s], t) if s in resized and n else (s, n, t) for s, n, t in out]


def _optimizer(rank: _Rank, plan: FsdpPlan, tag: str, first: bool) -> None:
    """Fused AdamW on the shards (its states at the first step), then ``zero_grad(set_to_none=True)``."""
    if first:  # torch/optim/adam.py _init_group: state["step"] on the device (fused), exp_avg, exp_avg_sq
        for q in plan.params:  # the optimizer holds the trainable parameters (Trainer.create_optimizer)
            if q.frozen:
                continue
            rank.w.new(4, tag)
            rank.w.new(q.local(plan.world) * plan.orig_of(q), tag)
            rank.w.new(q.local(plan.world) * plan.orig_of(q), tag)
    for s, n, _ in rank.grads:
        rank.w.free(s, n, SIDE + tag)
    rank.grads = []


Op = Any  # Callable[[_Rank, str], None]


def _step_points(events: Sequence[Event], start: int, end: int, grads: set[int], plan: FsdpPlan, k: int = 0,
                 first_pass: dict[str, Any] | None = None, resized: dict[int, int] | None = None,
                 ) -> dict[int, list[Op]]:
    """What FSDP2 does where in one pass's events ``[start, end)`` (``end``: after backward; pass ``k`` of the run),
    as operations on the rank keyed by the index they precede.

    Raises:
        FsdpReplayError: The step has no forward head or backward, or a gradient matches no unit.
    """
    at: dict[int, list[Op]] = {}

    def put(i: int, op: Op) -> None:
        at.setdefault(i, []).append(op)

    units = plan.units
    layer_ids = [u for u, unit in enumerate(units) if unit.kind == "layer"]
    first, back, bounds = step_frame(events, start, end, len(layer_ids))
    # forward: pre_forward -> unshard + wait; post_forward -> reshard where reshard_after_forward
    for u, unit in enumerate(units):
        if unit.kind in ("root", "embed") or (unit.kind == "tail" and plan.tied):
            put(first, lambda r, t, u=u: r.wait(u, t, True))
    before = [u for u, unit in enumerate(units) if unit.kind == "embed"]
    for j, u in enumerate(layer_ids):
        for v in before:
            put(bounds[j], lambda r, t, v=v: r.reshard(v) if units[v].reshard else None)
        put(bounds[j], lambda r, t, u=u: r.wait(u, t, True))
        before = [u]
    for v in before:  # the last layer unit after its forward; without layer units the embedding at the first layer
        put(bounds[-1] if layer_ids else bounds[0], lambda r, t, v=v: r.reshard(v) if units[v].reshard else None)
    tail = len(units) - 1
    if not plan.tied:
        put(bounds[-1], lambda r, t: r.wait(tail, t, True))

    def root_post_forward(r: _Rank, t: str) -> None:  # _fsdp_state.py _post_forward: free the last all-gather
        r.free(r.held)
        r.held = None
        r.w.out.append((MARK, 0, "forward"))  # the end of the pass's forward (the benchmarks' ``forward1``)

    put(back, root_post_forward)
    # backward: gradients to units by size, in backward order (the root's own parameters last)
    order = [u for u in range(len(units) - 1, -1, -1) if units[u].kind != "root"]
    order += [u for u in range(len(units)) if units[u].kind == "root"]
    m = k % plan.accum  # the pass's place in its accumulation window
    sync = m == plan.accum - 1  # trainer.py: accelerator.no_sync but for the window's last pass
    if m == 0:
        owned, strays = unit_gradients(events, back, end, grads, plan, order)
        if first_pass is not None:
            first_pass.update(back=back, end=end, owned=owned)
    else:  # a later pass allocates each gradient and frees it into .grad (allocator_compose._accumulated)
        owned = aligned_gradients(events, first_pass or {}, back, end)
        strays = [events[i] for i in range(back, end) if events[i][1] > 0 and events[i][0] in grads]
    for h in strays:
        put(end, lambda r, t, h=h: r.free(h))
    if resized is not None:
        resized.update(_in_param_dtype(owned, plan))
    chain = [u for u in order if units[u].kind != "root"]
    put(back, lambda r, t: _pre_backward(r, t, chain[0], chain, plan))
    posts: dict[int, int] = {u: end for u in order}  # the final callback's, unless its hook runs before
    for j in range(1, len(chain)):
        u, done = chain[j], chain[j - 1]
        if not owned[u]:  # frozen (LoRA's input embedding): its output needs no gradient, so neither its
            continue      # pre-backward hook nor the post-backward of the unit after it runs before the final callback
        pos = owned[u][0][0]  # a unit's backward starts at its first gradient
        if not (units[done].kind == "tail" and plan.tied):  # the tied weight's gradient is complete at the end
            posts[done] = max(pos, owned[done][-1][0] + 1) if owned[done] else pos
        put(pos, lambda r, t, u=u: _pre_backward(r, t, u, chain, plan))
    for u in sorted(order, key=lambda v: posts[v]):
        hs = [h for _, h in owned[u]]
        put(posts[u], lambda r, t, u=u, hs=hs: r.post_backward(u, hs, t, sync))

    def final(r: _Rank, t: str) -> None:  # _root_post_backward_final_callback: reduce_scatter_states.clear()
        r.free(r.rs_input)
        r.rs_input = None
        for v in list(r.issued):  # finalize_backward: a prefetched all-gather never waited for (a frozen
            r.free(r.issued.pop(v))  # embedding's: no pre-backward) is cleared
        if not sync:  # a point of the run between micro-batches (the benchmarks' ``backward1.0``)
            r.w.out.append((MARK, 0, "micro"))

    put(end, final)
    return at


def _in_param_dtype(owned: dict[int, list[tuple[int, Event]]], plan: FsdpPlan) -> dict[int, int]:
    """The traced gradients of parameters traced in another dtype than ``param_dtype`` (peft's fp32 adapters under
    autocast: the cast's backward makes an fp32 gradient) at the size FSDP2 makes them: the unsharded parameter is
    in ``param_dtype`` (``_fsdp_param.py`` ``init_unsharded_param``), so is its ``.grad``."""
    out: dict[int, int] = {}
    for u, hs in owned.items():
        traced = {plan.traced_of(q) for q in plan.units[u].params if not q.frozen}
        if len(traced) == 1 and (t := traced.pop()) != plan.compute:
            out.update({s: n // t * plan.compute for _, (s, n, _) in hs})
    return out


def _pre_backward(r: _Rank, t: str, u: int, order: list[int], plan: FsdpPlan) -> None:
    """``pre_backward``: unshard (no-op where gathered) and prefetch the unit before it in forward order."""
    r.wait(u, t, False)
    k = order.index(u)
    if k + 1 < len(order) and plan.units[order[k + 1]].kind != "root":
        r.unshard(order[k + 1], t)


def replayed(spec: TrainingSpec) -> bool:
    """Whether the whole run of an FSDP spec is replayed as FSDP2's (:func:`fsdp2_run`)."""
    return replays(spec, 2)


def rewrite_for(spec: TrainingSpec) -> Any:
    """The module that rewrites the plain run into this run's own: ``deepspeed_run_events``, this one,
    ``fsdp1_run_events``, or None."""
    from fitcheck.torch_adapters import deepspeed_run_events, fsdp1_run_events

    if deepspeed_run_events.replayed(spec):
        return deepspeed_run_events
    if fsdp1_run_events.replayed(spec):
        return fsdp1_run_events
    return sys.modules[__name__] if replayed(spec) else None


def whole_run(path: Any, spec: TrainingSpec, key: str, required: bool = False) -> Any:
    """A ``PinnedPath``'s FSDP2 whole run replayed (``deepspeed_run_events.rewritten_run``): the default stream's
    ``allocator_replay.StepReplay``, or None (the reason kept in the path's ``_whole_failed``)."""
    from fitcheck.core.loading import load_events

    plan = fsdp2_plan(spec)
    load = load_events(spec, spec.hardware.gpu_memory_bytes) if plan.resident else []
    return rewritten_run(path, spec, key, replay_key(spec, plan), "fsdp2-run",
                         lambda events: fsdp2_run(events, plan, load), required, micro_batches=plan.accum)


def published_gap_reason(path: Any, spec: TrainingSpec, key: str) -> str:
    """Why a traced FSDP answer (FSDP1 or FSDP2) keeps the published gap, for the ``reserved-published-gap``
    INFO."""
    fs = spec.sharding.fsdp
    version = fs.version if fs is not None else 2
    missing = not_replayed(spec)
    if missing:
        return f"the whole-run replay rewrites FSDP{version}'s run, and this run has {missing}"
    plan = fsdp1_plan(spec) if version == 1 else fsdp2_plan(spec)
    failed = path._whole_failed.get(key + replay_key(spec, plan))
    return (f"FSDP{version}'s run could not be replayed ({failed})" if failed
            else f"FSDP{version}'s run was not replayed")


__all__ = ["fsdp2_run", "published_gap_reason", "replayed", "rewrite_for", "whole_run"]
