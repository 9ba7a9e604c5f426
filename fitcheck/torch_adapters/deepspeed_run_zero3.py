"""ZeRO-3 on more than one process, one rank's tensors (``deepspeed_run_events`` calls these; deepspeed 0.19.8).

Each piece is read from its source (``runtime/zero/``, line numbers of 0.19.8):

* ``initialize`` (the model built outside ``zero.Init``, as under the benchmark's harness):
  ``parameter_offload.py`` L180/L270 ``_convert_to_zero_parameters`` -> ``Init(module=...)`` ->
  ``partition_parameters.py`` ``_partition_param``: per parameter, in ``named_parameters`` order, a partition of
  ``ceil(numel / world)`` (L1836 ``torch.empty(partition_size)``; L1690 ``_aligned_size``) and the full tensor
  freed (L329 ``free_param``); ``stage3.py`` L972 ``lp_param_buffer = defragment(...)`` (``zero/utils.py`` L215:
  the flat made, the trainable partitions dropped); L1081 ``_create_fp32_partitions`` (fp32 sub-groups of the
  partitions), L1306 ``initialize_optimizer_states``' zeroed gradient, L782 the ipg bucket, L791
  ``grad_partitions_flat_buffer`` (the trainable partitions' elements); L1504 / L1531
  ``create_reduce_and_remove_grad_hooks``: every trainable parameter gathered (``param.all_gather()``) and
  partitioned again (``param.partition()``).
* forward and backward: ``partitioned_param_coordinator.py`` L310 ``fetch_sub_module`` gathers a module's
  parameters before it runs (one parameter: ``partition_parameters.py`` L1388 ``_all_gather_sequential``, a buffer
  of ``ceil(numel / world) * world``, the parameter a view of it) and L494 ``release_sub_module`` frees them after
  it. From the second step on (the trace complete) L634 ``__params_to_release`` keeps every parameter whose next
  use is less than ``stage3_max_reuse_distance`` elements of modules away (forward -> backward: twice the elements
  after it in the model), and L452 each fetch prefetches the next parameters of the trace up to
  ``stage3_prefetch_bucket_size`` elements. A module no gradient reaches (before the first trainable parameter:
  a frozen embedding under LoRA) has no backward, so it is neither fetched there nor kept (seen on the real
  engine: LoRA's embedding released after its forward). Parameters of at most
  ``stage3_param_persistence_threshold`` elements (``parameter_offload.py`` L317 ``mark_persistent_parameters``)
  are not released; they are gathered whole at the end of each step (``stage3.py`` L2835 ``_post_step``:
  ``persistent_parameters[0].all_gather``).
* backward's gradients and the step: as at one process (``deepspeed_run_events``), of partitions: the gradient
  goes into the ipg bucket and its partition into ``grad_partitions_flat_buffer`` (L2006 ``partition_grads``);
  the step's sub-groups, fp64 norms and Adam states are partition-sized.

Where a gather happens inside a forward or backward is not in the plain trace (it has no module boundaries): the
parameters are spread over the body's events by their elements (layers are alike), the head's at the first
event of the head's region (``forward_head``), freed when the backward of the head ends (``backward_start``).
The coalesced path of a prefetch of several parameters (``_all_gather_coalesced``: a flat of their partitions x
world and one ``torch.cat`` per parameter) is counted as the per-parameter buffers. Tied embeddings: the head's
gather of the embedding is not modelled. ``stage3_max_live_parameters`` caps each prefetch (L453: at most
``max_live - n_available`` elements, ``n_available`` the elements gathered and not yet released this step, reset
to 0 at each step's start, L287); ``stage3_max_reuse_distance`` is the user's (DeepSpeed's default 1e9, which
transformers 5.23 leaves to DeepSpeed: ``integrations/deepspeed.py`` fills reduce_bucket_size, prefetch and
persistence only).

Pure Python: no torch import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fitcheck.torch_adapters.deepspeed_run_backward import EMPTY_CACHE, Event, EventWriter
from fitcheck.torch_adapters.deepspeed_run_plan import FP32, DeepSpeedPlan, DeepSpeedReplayError, sub_groups


def multi(plan: DeepSpeedPlan) -> bool:
    """Whether a plan is ZeRO-3 on more than one process (this module's)."""
    return plan.stage == 3 and plan.world > 1 and bool(plan.params)


def gathered(plan: DeepSpeedPlan) -> list[int]:
    """Indices into :attr:`.DeepSpeedPlan.params` of the parameters fetched and released (not persistent)."""
    return [k for k, (n, _) in enumerate(plan.params) if n > plan.persist]


def optimizer_buffers(w: EventWriter, plan: DeepSpeedPlan, subs: Sequence[int], flat: int, t: str) -> None:
    """Stage 3's optimizer buffers at ``initialize`` (any number of processes): each fp32 sub-group of ``subs``
    elements converted and cloned (``_create_fp32_partitions``; the converted tensor freed after the next one is
    made), ``initialize_optimizer_states``' transient ``gradient_buffer``, the ipg bucket (``contiguous_gradients``)
    and ``grad_partitions_flat_buffer`` of ``flat`` elements."""
    e = plan.elem
    converted: tuple[int, int] | None = None
    for n in subs:  # _create_fp32_partitions
        now = w.new(FP32 * n, t)
        if converted is not None:
            w.free(*converted, t)
        w.new(FP32 * n, t)  # converted.clone(): fp32_partitioned_groups_flat
        converted = (now, FP32 * n)
    if converted is not None:
        w.free(*converted, t)
    buffer = w.new(FP32 * max(subs), t)  # initialize_optimizer_states' gradient_buffer
    w.free(buffer, FP32 * max(subs), t)
    if plan.contiguous:
        w.new(e * plan.bucket, t)  # the ipg bucket
    w.new(e * flat, t)  # grad_partitions_flat_buffer


def initialize(w: EventWriter, plan: DeepSpeedPlan, storages: Sequence[tuple[int, int]]) -> list[int]:
    """``deepspeed.initialize``'s tensors (module docstring); ``storages``: each parameter's (serial, bytes) as
    loaded, in :attr:`.DeepSpeedPlan.params` order. Returns the fp32 sub-groups (elements)."""
    t, e = "setup", plan.elem
    parts: list[tuple[int, int]] = []
    for (numel, _), (s, nbytes) in zip(plan.params, storages, strict=True):
        parts.append((w.new(e * plan.part3(numel), t), e * plan.part3(numel)))  # _partition_param
        w.free(s, nbytes, t)  # free_param
    w.out.append((-1, 0, EMPTY_CACHE))
    train = [k for k, (_, tr) in enumerate(plan.params) if tr]
    flat = sum(plan.part3(plan.params[k][0]) for k in train)
    w.new(e * flat, t)  # lp_param_buffer (defragment)
    for k in train:
        w.free(*parts[k], t)
    subs = [n for g in plan.groups for n in sub_groups([plan.part3(x) for x in g], plan.sub_group_size)]
    optimizer_buffers(w, plan, subs, flat, t)
    for k in train:  # create_reduce_and_remove_grad_hooks: all_gather, then partition
        if plan.params[k][0] > plan.persist:
            n = e * plan.part3(plan.params[k][0]) * plan.world
            w.free(w.new(n, t), n, t)
    return subs


def post_step(w: EventWriter, plan: DeepSpeedPlan, tag: str, held: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``_post_step``: the persistent parameters gathered whole again (the previous gather freed). Returns them."""
    for s, n in held:
        w.free(s, n, tag)
    out = []
    for numel, _ in plan.params:
        if numel <= plan.persist:
            n = plan.elem * plan.part3(numel) * plan.world
            out.append((w.new(n, tag), n))
    return out


class Gathers:
    """Where each step's parameter gathers go among the plain run's events (module docstring)."""

    def __init__(self, plan: DeepSpeedPlan) -> None:
        self.plan = plan
        self.order = gathered(plan)
        head_from = max((k for k, (n, _) in enumerate(plan.params) if n <= plan.persist), default=-1)
        # the head: the gathered parameters after the last persistent one (the final norm) that follow the layers
        self.head = [k for k in self.order if k > head_from] if head_from >= 0 else []
        self.body = [k for k in self.order if k not in self.head]
        total = [0] * (len(plan.params) + 1)
        for k in range(len(plan.params) - 1, -1, -1):
            total[k] = total[k + 1] + plan.params[k][0]
        self.after = total  # elements of the parameters after k (and k itself) in the model
        # no gradient reaches a module before the first trainable parameter (a frozen embedding under LoRA): its
        # backward never runs, so it is neither fetched there nor in the trace's backward (never kept)
        self.first_trained = next((k for k, (_, tr) in enumerate(plan.params) if tr), len(plan.params))

    def nbytes(self, k: int) -> int:
        """A gathered parameter's buffer (``_all_gather_sequential``: ``ceil(numel / world) * world``)."""
        return self.plan.elem * self.plan.part3(self.plan.params[k][0]) * self.plan.world

    def kept(self, k: int) -> bool:
        """``__params_to_release`` (complete trace): parameter ``k``'s reuse, in backward, is nearer than
        ``stage3_max_reuse_distance`` elements of modules (those after it in forward, then in backward)."""
        return k >= self.first_trained and 2 * self.after[k + 1] < self.plan.max_reuse

    def schedule(self, events: Sequence[Event], lo: int, end: int, complete: bool) -> dict[int, list[Event]]:
        """The gathers and releases of one step whose plain events are ``events[lo:end]`` (forward from ``lo``,
        its backward ending at ``end``): index -> events to insert before it (serials negative, made unique by
        the caller). ``complete``: the coordinator's trace is complete (every step after the first)."""
        def first(a: int, b: int, want: str) -> int | None:  # the first allocation of a region (a free carries
            return next((k for k in range(a, b) if events[k][1] > 0  # its allocation's region)
                         and events[k][2].removesuffix("_warmup").startswith(want)), None)

        lo = first(lo, end, "forward") or lo
        head0 = first(lo, end, "forward_h")
        back0 = first(lo, end, "backward") or end
        body_b = next((k for k in range(back0, end) if events[k][1] > 0
                       and events[k][2].removesuffix("_warmup") == "backward"), end)
        f_end = head0 if head0 is not None else back0
        out: dict[int, list[Event]] = {}
        live: dict[int, int] = {}  # parameter -> serial
        serial = [0]
        held = [0]  # elements of the parameters in live, kept as they change (a sum per fetch was quadratic)

        def put(at: int, k: int, sign: int) -> None:
            if sign > 0:
                serial[0] -= 1
                live[k] = serial[0]
            out.setdefault(at, []).append((live[k] if sign < 0 else serial[0], sign * self.nbytes(k), "gather"))
            held[0] += sign * self.plan.params[k][0]
            if sign < 0:
                del live[k]

        def spread(params: list[int], a: int, b: int) -> list[int]:
            numels = [self.plan.params[k][0] for k in params]
            tot, acc, at = max(sum(numels), 1), 0, []
            for n in numels:
                at.append(a + (b - a) * acc // tot)
                acc += n
            return at

        # forward: fetch (with prefetch when complete), release unless kept
        fwd = [*zip(self.body, spread(self.body, lo, f_end), strict=True),
               *((k, head0 if head0 is not None else f_end) for k in self.head)]
        self._pass(fwd, put, live, lambda: held[0], complete, forward=True, end_at=back0)
        bwd_body = [k for k in reversed(self.body) if k >= self.first_trained]
        bwd = [*((k, back0) for k in reversed(self.head)),
               *zip(bwd_body, spread(bwd_body, body_b, end), strict=True)]
        self._pass(bwd, put, live, lambda: held[0], complete, forward=False, end_at=end)
        for k in list(live):  # whatever is left goes at the end of backward
            put(end, k, -1)
        return out

    def _pass(self, seq: list[tuple[int, int]], do: Callable[[int, int, int], None], live: dict[int, int],
              held: Callable[[], int], complete: bool, forward: bool, end_at: int) -> None:
        """One pass's fetches and releases (``seq``: parameter, index of its module's fetch; ``held``: the elements
        of the parameters in ``live``).

        Linear in the parameters: the gathered elements are kept as they change, and a prefetch scan starts after
        the last one's end (``scanned``): a pass releases only the parameter it is at, so what the last scan passed
        is still gathered and a scan from ``i + 1`` would step over it again (in backward, everything forward kept:
        quadratic in the parameter count)."""
        scanned = 0
        for i, (k, at) in enumerate(seq):
            if k not in live:
                do(at, k, 1)
            # prefetch: the next parameters of the trace, up to the bucket and to max_live less what is gathered
            budget = min(self.plan.prefetch, self.plan.max_live - held()) if complete else 0
            j, numel = max(i + 1, scanned), 0
            while budget > 0 and j < len(seq) and numel < budget:
                nk = seq[j][0]
                if nk not in live:
                    do(at, nk, 1)
                    numel += self.plan.params[nk][0]
                j += 1
            scanned = j
            release = seq[i + 1][1] if i + 1 < len(seq) else end_at
            if not (forward and complete and self.kept(k)):
                do(release, k, -1)


def all_storages(setup: Sequence[Event], plan: DeepSpeedPlan, matched: list[list[tuple[int, bool]]],
                  owned: list[list[int]], size: dict[int, int]) -> list[tuple[int, int]]:
    """ZeRO-3 on more than one process: each parameter's storage (serial, bytes) in :attr:`.DeepSpeedPlan.params`
    order: the trainable ones after ``_cast``, the frozen ones matched by size (earliest first).

    Raises:
        DeepSpeedReplayError: A parameter has no storage of its size.
    """
    cast = {m[0]: o for ms, os in zip(matched, owned, strict=True) for m, o in zip(ms, os, strict=True)}
    pool = [(cast.get(s, s), size.get(cast.get(s, s), n)) for s, n, _ in setup if n > 0]
    used: set[int] = set()
    out: list[tuple[int, int]] = []
    for numel, _ in plan.params:
        hit = next((s for s, n in pool if n == numel * plan.elem and s not in used), None)
        if hit is None:
            raise DeepSpeedReplayError(f"no traced parameter storage of {numel * plan.elem} bytes")
        used.add(hit)
        out.append((hit, numel * plan.elem))
    return out


def gathers(plan: DeepSpeedPlan, events: Sequence[Event], n_setup: int, ends: list[int]) -> dict[int, list[Event]]:
    """Every step's parameter gathers (``deepspeed_run_zero3.Gathers``), by the index they go before; each
    gather's serial unique over the run (negative: the caller gives it a fresh one)."""
    g = Gathers(plan)
    out: dict[int, list[Event]] = {}
    base, lo = 0, n_setup
    for i, end in enumerate(ends):
        step = g.schedule(events, lo, end, complete=i > 0)
        low = 0
        for at, evs in step.items():
            # tagged with the region it falls in: a gather that of the event after it, a release the one before
            out.setdefault(at, []).extend(
                (s + base, n, events[min(at, len(events) - 1) if n > 0 else at - 1][2]) for s, n, _ in evs)
            low = min([low, *(s for s, _, _ in evs)])
        base += low
        lo = end
    return out
