"""Which FSDP runs ``fsdp2_run_events`` / ``fsdp1_run_events`` replay, and what their rewrites need of one (a plan).

The units are accelerate 1.15's (``utils/fsdp_utils.py`` ``fsdp2_prepare_model``, as
``core/states/fsdp2_units.py`` describes them): every decoder layer (``reshard_after_forward`` from the config), an
untied input embedding, the tail ``[final norm, (tied embedding,) lm_head]`` with ``reshard_after_forward=False``,
and the root with what is left (``reshard_after_forward=None`` -> False for the root). Each parameter is sharded on
dim 0, padded to a multiple of the world size (torch 2.13 ``_fsdp_param.py`` ``_init_sharded_param``:
``padded_sharded_size = chunks[0].size()``). A peft model under the Trainer has no layer unit: the root holds every
layer (``core/states/fsdp2_units.py`` ``peft_root_gathers``; :attr:`FsdpPlan.depth`).

FSDP1 (:func:`fsdp1_plan`): accelerate 1.15 ``accelerator.py`` ``prepare_model`` wraps the model once with
``transformer_based_wrap`` (``FullyShardedDataParallelPlugin.set_auto_wrap_policy``): every decoder layer its own
FSDP unit, the root the rest (embedding, final norm, LM head). Each unit holds one ``FlatParameter`` (torch 2.13
``_flat_param.py``), laid out by :func:`flat_layout`.

Also what both rewrites share: :func:`rewrite_steps` (the plain run walked step by step, each step's FSDP operations
put in), :func:`module_storages` (the traced module's parameters in the plain run's setup), :func:`layer_starts`
(each layer's forward in the deepened trace), :func:`base_region`, :func:`step_frame`, :func:`unit_gradients`,
:func:`aligned_gradients` (a later micro-batch's gradients), :func:`replays`, :func:`replay_key`. Pure Python,
no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.fsdp_params import FP32, Param, lora_not_replayed, model_params


class FsdpReplayError(ValueError):
    """The plain run's events do not carry what the rewrite needs (a parameter's storage, a step)."""


@dataclass(frozen=True)
class Unit:
    """One ``fully_shard`` unit.

    Attributes:
        params: Its parameters in ``named_parameters`` order (a tied weight once).
        reshard: ``reshard_after_forward``.
        kind: ``embed``, ``layer``, ``tail`` or ``root``.
    """

    params: tuple[Param, ...]
    reshard: bool
    kind: str


@dataclass(frozen=True)
class FsdpPlan:
    """What the rewrite needs of an FSDP2 run.

    Attributes:
        world: Shards (processes in the FSDP group).
        units: The units in forward order (embed, layers, tail; the root's own parameters first when any).
        wrap_order: Indices of :attr:`units` in the order ``fully_shard`` is called (layers bottom-up, the
            embedding, the tail, the root).
        orig: Bytes of an element of the sharded parameters (fp32 after accelerate's upcast,
            ``core/states/fsdp_upcast.py``).
        compute: Bytes of ``MixedPrecisionPolicy.param_dtype`` (the gathered parameters).
        reduce: Bytes of ``reduce_dtype`` (the reduce-scatter buffers).
        traced: Bytes of an element of the traced module's parameters and gradients (the 16-bit module,
            ``kernels/module_cast.py``).
        tied: Whether the input embedding is the LM head (it then sits in the tail unit).
        accum: Forward and backward passes per optimizer step the plain run composes
            (``allocator_compose.replayed_micro_batches`` of ``gradient_accumulation_steps``): all but the last
            under ``no_sync``.
        depth: Decoder layers held by the root when no layer has a unit of its own (a peft model under the
            Trainer: ``core/states/fsdp2_units.py`` ``peft_root_gathers``); 0 otherwise. The rewrite finds the
            layers' forwards in the trace by it (the embedding resharded at the first, the tail gathered after the
            last).
    """

    world: int
    units: tuple[Unit, ...]
    wrap_order: tuple[int, ...]
    orig: int
    compute: int
    reduce: int
    traced: int
    tied: bool
    accum: int = 1
    depth: int = 0

    @property
    def params(self) -> list[Param]:
        """Every parameter, unit by unit in forward order."""
        return [p for u in self.units for p in u.params]

    def orig_of(self, q: Param) -> int:
        """Bytes of an element of ``q``'s shard."""
        return q.orig or self.orig

    def traced_of(self, q: Param) -> int:
        """Bytes of an element of ``q`` in the traced module (its parameter and its traced gradient)."""
        return q.traced or self.traced


def not_replayed(spec: TrainingSpec) -> str:
    """What of an FSDP run :func:`fsdp2_run_events.fsdp2_run` does not describe ("" when it describes the run).

    Args:
        spec: An FSDP spec.

    Returns:
        The part not replayed, for the ``reserved-published-gap`` INFO, or "".
    """
    from fitcheck.spec import MixedPrecision
    from fitcheck.torch_adapters.deepspeed_run_plan import FUSED_ADAM

    fs = spec.sharding.fsdp
    parts = []
    if fs is None:
        return "no FSDP settings"
    if fs.version == 1:
        parts += _fsdp1_not_replayed(spec)
    elif fs.sharding_strategy not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        parts.append(f"the {fs.sharding_strategy} strategy")
    if fs.offload_params:
        parts.append("CPU offload of parameters")
    if fs.auto_wrap_policy != "TRANSFORMER_BASED_WRAP" or fs.wrap_unit_params:
        parts.append("a wrap policy other than one decoder layer per unit")
    if spec.precision.mixed_precision is MixedPrecision.NO:
        parts.append("no mixed precision (the plain run's replay answers)")
    if spec.quant is not None:
        parts.append("a quantized base")
    if spec.freeze is not None:
        parts.append("frozen parameters without peft (freeze)")
    if lora_left_out := lora_not_replayed(spec):
        parts.append(lora_left_out)
    if spec.optimizer.name not in FUSED_ADAM:
        parts.append(f"the {spec.optimizer.name} optimizer on the shards (replayed: {FUSED_ADAM[0]})")
    if spec.sharding.parallelism is not None and spec.sharding.parallelism.active:
        parts.append("a tp/cp/sp layout")
    return "; ".join(parts)


def _fsdp1_not_replayed(spec: TrainingSpec) -> list[str]:
    """FSDP1's own exclusions (:func:`not_replayed` adds the ones FSDP2 shares)."""
    fs = spec.sharding.fsdp
    parts = []
    if fs is None:
        return ["no FSDP settings"]
    if not fs.use_orig_params:
        parts.append("use_orig_params=False (the flat parameters handed to the optimizer)")
    # torch 2.13 _init_utils.py _init_core_state: one process is NO_SHARD whatever the strategy
    if partition_weights(spec) > 1 and fs.sharding_strategy != "FULL_SHARD":
        parts.append(f"the {fs.sharding_strategy} strategy")
    if fs.cpu_ram_efficient_loading:
        parts.append("cpu_ram_efficient_loading (meta-device initialisation on the other ranks)")
    if fs.frozen_shares_units:
        parts.append("frozen parameters sharing a unit")
    return parts


def partition_weights(spec: TrainingSpec) -> int:
    """The processes a parameter is sharded over (``core/states`` ``partition``), at least 1."""
    from fitcheck.core.states import partition

    return max(partition(spec).weights, 1)


def _dtypes(spec: TrainingSpec) -> tuple[int, int, int]:
    """Bytes of the sharded parameters (fp32 after accelerate's upcast), of the compute (and reduce) dtype and of
    the traced module's parameters."""
    from fitcheck.core.kernels import deepspeed_module_view
    from fitcheck.core.states import fsdp_fp32_upcast, param_compute_bytes

    orig = FP32 if fsdp_fp32_upcast(spec) else spec.precision.load_dtype.nbytes
    return orig, param_compute_bytes(spec), deepspeed_module_view(spec).precision.load_dtype.nbytes


def fsdp2_plan(spec: TrainingSpec, trainer: bool = True) -> FsdpPlan:
    """The plan of an FSDP2 spec :func:`not_replayed` accepts.

    Args:
        spec: The training spec.
        trainer: A peft model's units as the Trainer prepares it (``core/states/fsdp2_units.py``
            ``peft_root_gathers``: the root holds every layer); False: accelerate's own ``transformer_based_wrap``
            units (a script calling ``Accelerator.prepare`` without ``update_fsdp_plugin_peft``: the recorded
            ``*_accelerate`` variants of ``benchmarks/fsdp2_run_events_cpu.py``).

    Returns:
        Its units, world size and dtypes.
    """
    fs = spec.sharding.fsdp
    reshard = fs.reshard_after_forward if fs is not None else True
    layer, roles, tied = model_params(spec)
    embed, head, norms, rest = roles["embed"], roles["head"], roles["norms"], roles["rest"]
    from fitcheck.core.states import peft_root_gathers
    from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches

    orig, compute, traced = _dtypes(spec)
    if trainer and peft_root_gathers(spec):  # the Trainer's units for a peft model: the root holds every layer
        n = spec.model.shape.num_layers
        body = Unit(tuple(rest + list(layer) * n + norms), False, "root")
        ends = [Unit(tuple(embed if tied else head), False, "tail")]
        ends = ([] if tied else [Unit(tuple(embed), reshard, "embed")]) + ends
        # fully_shard order: the embedding, the tail, the root (fsdp2_prepare_model)
        return FsdpPlan(partition_weights(spec), (body, *ends), (*range(1, len(ends) + 1), 0), orig, compute,
                        compute, traced, tied, replayed_micro_batches(spec.batch.grad_accum), depth=n)
    layers = [Unit(layer, reshard, "layer") for _ in range(spec.model.shape.num_layers)]
    # accelerate 1.15 fsdp_utils.py _find_final_norm scans getattr(model, model.base_model_prefix)'s children:
    # on a peft PeftModel that is the LlamaForCausalLM (its children `model`, `lm_head`): no norm, so the final
    # norm stays with the root
    final = [] if spec.lora is not None else norms[-1:]
    inner = norms if spec.lora is not None else norms[:-1]
    tail = Unit(tuple(final + (embed if tied else head)), False, "tail")
    root = Unit(tuple(rest + inner), False, "root") if rest or inner else None
    front = [] if tied else [Unit(tuple(embed), reshard, "embed")]
    units = ([root] if root else []) + front + layers + [tail]
    first_layer = len(units) - len(layers) - 1
    order = list(range(first_layer, first_layer + len(layers))) + list(range(first_layer - len(front), first_layer))
    order += [len(units) - 1] + ([0] if root else [])
    # accelerate 1.15 dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision (FSDP2):
    # MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    return FsdpPlan(partition_weights(spec), tuple(units), tuple(order), orig, compute, compute, traced, tied,
                    replayed_micro_batches(spec.batch.grad_accum))


@dataclass(frozen=True)
class Fsdp1Plan(FsdpPlan):
    """What the FSDP1 rewrite needs beyond :class:`FsdpPlan` (units: the root first, then the layers).

    Attributes:
        load: Bytes of an element of the model as loaded (what ``FullyShardedDataParallel`` moves and flattens,
            before accelerate's upcast).
        align: ``_aligned_numel`` (torch 2.13 ``_flat_param.py`` ``_get_aligned_numel``: 16 bytes over the
            ``param_dtype`` size, ``use_orig_params=True`` only).
    """

    load: int = 2
    align: int = 0
    split: bool = False

    def handles(self, u: int) -> list[tuple[Param, ...]]:
        """Unit ``u``'s flat parameters, each as its parameters: one, or under :attr:`split` (peft's
        ``fsdp_auto_wrap_policy``, which transformers 5.23 ``Trainer`` sets for a peft model under FSDP:
        ``distributed/fsdp.py`` ``update_fsdp_plugin_peft``; peft 0.21.2 ``utils/other.py``: every leaf module
        whose weight requires grad, i.e. each LoRA A and B, an FSDP unit of its own, nested in its layer's) the
        frozen ones, then each trainable one alone."""
        params = self.units[u].params
        if not self.split:
            return [params]
        frozen = tuple(q for q in params if q.frozen)
        return ([frozen] if frozen else []) + [(q,) for q in params if not q.frozen]

    def layout(self, u: int, k: int = 0) -> tuple[int, list[int]]:
        """Unit ``u``'s (``k``-th) padded flat numel and each parameter's offset in it (:func:`flat_layout`)."""
        return flat_layout([q.numel for q in self.handles(u)[k]], self.align, self.world)

    def shard(self, u: int, k: int = 0) -> int:
        """Elements of one rank's shard of unit ``u``'s (``k``-th) flat parameter (the whole flat at one
        process)."""
        return self.layout(u, k)[0] // self.world

    def flat_orig(self, u: int, k: int = 0) -> int:
        """Bytes of an element of the (``k``-th) flat parameter after ``prepare``: accelerate 1.15 upcasts a flat
        parameter with ``requires_grad`` only; a frozen one stays as loaded (:attr:`Param.orig`)."""
        return self.orig_of(self.handles(u)[k][0])

    def flat_load(self, u: int, k: int = 0) -> int:
        """Bytes of an element of the (``k``-th) flat parameter as loaded: peft's adapters fp32 (their traced
        dtype, :attr:`Param.traced`), the rest :attr:`load`."""
        return self.handles(u)[k][0].traced or self.load

    def trainable(self, u: int, k: int = 0) -> bool:
        """Whether the (``k``-th) flat parameter requires grad (torch 2.13 ``_flat_param.py``: the OR of its
        parameters')."""
        return any(not q.frozen for q in self.handles(u)[k])

    def in_shard(self, u: int, rank: int = 0, k: int = 0) -> list[int]:
        """Elements of each parameter of unit ``u``'s (``k``-th) flat inside rank ``rank``'s shard
        (``_shard_param_infos``: the optimizer sees these views; 0 where a parameter lies outside it)."""
        flat, offsets = self.layout(u, k)
        size = flat // self.world
        lo, hi = rank * size, (rank + 1) * size
        return [max(0, min(hi, o + q.numel) - max(lo, o)) for q, o in zip(self.handles(u)[k], offsets, strict=True)]


def flat_layout(numels: list[int], align: int, world: int) -> tuple[int, list[int]]:
    """A ``FlatParameter``'s padded numel and its tensors' offsets (torch 2.13 ``_flat_param.py``
    ``flatten_tensors``: each tensor starts at a multiple of ``align``, the total padded to a multiple of the world
    size; no padding at all where ``align`` is 0).

    Args:
        numels: The tensors' elements, in order.
        align: ``_aligned_numel``.
        world: The world size.

    Returns:
        (padded numel, offsets).
    """
    total, offsets = 0, []
    for n in numels:
        pad = align - total % align if align else 0
        if 0 < pad < align:
            total += pad
        offsets.append(total)
        total += n
    pad = world - total % world if align else 0
    if 0 < pad < world:
        total += pad
    return total, offsets


def fsdp1_plan(spec: TrainingSpec) -> Fsdp1Plan:
    """The plan of an FSDP1 spec :func:`not_replayed` accepts: the root unit (everything outside the decoder
    layers, in ``named_parameters`` order: embedding, other, final norm, untied LM head), then one unit per layer;
    ``wrap_order`` the layers then the root (``_auto_wrap`` wraps the children before the root's own handle).

    Args:
        spec: The training spec.

    Returns:
        Its units, world size and dtypes.
    """
    layer, roles, tied = model_params(spec)
    root = Unit(tuple(roles["embed"] + roles["rest"] + roles["norms"] + ([] if tied else roles["head"])), False,
                "root")
    n = spec.model.shape.num_layers
    units = (root, *[Unit(layer, True, "layer") for _ in range(n)])
    orig, compute, traced = _dtypes(spec)
    # accelerate 1.15 dataclasses.py set_mixed_precision (FSDP1): MixedPrecision(param_dtype=dtype,
    # reduce_dtype=dtype, buffer_dtype=...); torch 2.13 _flat_param.py FlatParamHandle.__init__: _aligned_numel
    from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches

    return Fsdp1Plan(partition_weights(spec), units, (*range(1, n + 1), 0), orig, compute, compute, traced,
                     tied, replayed_micro_batches(spec.batch.grad_accum), load=spec.precision.load_dtype.nbytes,
                     align=16 // compute, split=spec.lora is not None)


def module_storages(setup: Sequence[tuple[int, int, str]], plan: FsdpPlan) -> set[int]:
    """The traced module's parameter storages (matched by size, the latest first).

    Raises:
        FsdpReplayError: A parameter has no storage of its size.
    """
    free = [(s, n) for s, n, _ in reversed(setup) if n > 0]
    used: set[int] = set()
    for q in plan.params:
        size = q.numel * plan.traced_of(q)
        hit = next((s for s, n in free if n == size and s not in used), None)
        if hit is None:
            raise FsdpReplayError(f"no traced parameter storage of {size} bytes")
        used.add(hit)
    return used


def base_region(tag: str) -> str:
    """A region without the warm-up steps' suffix."""
    return tag.removesuffix("_warmup")


def layer_starts(events: Sequence[tuple[int, int, str]], a: int, b: int, layers: int) -> list[int]:
    """Where each layer's forward starts in ``events[a:b]`` (and where the last one ends): the period ``p`` whose
    run of ``events[k] ~ events[k + p]`` (same bytes, same region) covers ``layers`` periods and the most events;
    where none does, ``[a, b)`` split evenly."""
    sig = [(n, base_region(t)) for _, n, t in events[a:b]]
    best: tuple[int, int, int] | None = None  # (covered, start, period)
    for p in range(1, len(sig) // max(layers, 1) + 1):
        run, start = 0, 0
        for k in range(len(sig) - p):
            if sig[k] == sig[k + p]:
                if run == 0:
                    start = k
                run += 1
                if run + p >= layers * p and (best is None or run + p > best[0]):
                    best = (run + p, start, p)
            else:
                run = 0
    if best is None:
        return [a + (b - a) * i // layers for i in range(layers + 1)]
    _, start, p = best
    return [a + start + i * p for i in range(layers + 1)]


def rewrite_steps(events: Sequence[tuple[int, int, str]], plan: FsdpPlan, rank: Callable[[Any], Any],
                  points: Callable[[int, int, set[int], int], dict[int, list[Any]]],
                  optimizer: Callable[[Any, str, bool], None]) -> list[tuple[int, int, str]]:
    """The plain run's events with one FSDP rank's put in: its setup without the traced module's parameters,
    ``rank(writer)`` (prepare, returning the rank's state), then per forward and backward pass ``k`` the operations
    ``points(start, end, gradients, k)`` keys by the event index they precede (``end``: after backward; each called
    as ``op(state, region)``), the plain run's own events except its optimizer's, and, after every
    ``plan.accum``-th pass, ``optimizer(state, tag, first)``.

    Raises:
        FsdpReplayError: The events lack a parameter's storage or a step.
    """
    from fitcheck.torch_adapters.deepspeed_run_events import EventWriter, step_ends, without_dead_frees

    n_setup = next((k for k, ev in enumerate(events) if ev[2] != "setup"), len(events))
    module = module_storages(events[:n_setup], plan)
    ends, grads = step_ends(events, n_setup)
    w = EventWriter(max((s for s, _, _ in events), default=0) + 1)
    w.out += [ev for ev in events[:n_setup] if ev[0] not in module]
    state = rank(w)
    start = n_setup
    for k, end in enumerate(ends):
        at = points(start, end, grads, k)
        for i in range(start, end):
            for op in at.get(i, ()):
                op(state, events[i][2])
            s, n, t = events[i]
            if not t.startswith("optimizer"):
                w.out.append((s, n, t))
        for op in at.get(end, ()):
            op(state, events[end - 1][2])
        if (k + 1) % plan.accum == 0:  # a pass ends an optimizer step at the accumulation boundary only
            optimizer(state, "optimizer" if k == len(ends) - 1 else "optimizer_warmup", k + 1 == plan.accum)
        start = end
    w.out += [ev for ev in events[start:] if not ev[2].startswith("optimizer")]
    return without_dead_frees(w.out)


def step_frame(events: Sequence[tuple[int, int, str]], start: int, end: int, layers: int,
               ) -> tuple[int, int, list[int]]:
    """Where one traced step ``events[start:end]`` begins its forward, begins its backward, and where each layer's
    forward starts (:func:`layer_starts`, then the end of the last layer).

    Raises:
        FsdpReplayError: The step has no forward head or backward.
    """
    allocs = [(i, base_region(events[i][2])) for i in range(start, end) if events[i][1] > 0]
    head = next((i for i, t in allocs if t == "forward_head"), None)
    back = next((i for i, t in allocs if t.startswith("backward")), None)
    if head is None or back is None:
        raise FsdpReplayError("a traced step without its forward head or backward")
    first = allocs[0][0]
    return first, back, layer_starts(events, first, head, layers) if layers else [first]


def unit_gradients(events: Sequence[tuple[int, int, str]], back: int, end: int, grads: set[int], plan: FsdpPlan,
                   order: list[int]) -> tuple[dict[int, list[tuple[int, tuple[int, int, str]]]],
                                              list[tuple[int, int, str]]]:
    """The traced backward's gradients matched to units by size, in backward ``order`` (each unit's with their
    index; none for a unit without trainable parameters), and those of no unit (alive where backward's last
    allocation is made, no parameter's: the input embedding's output gradient, freed as backward returns).

    Raises:
        FsdpReplayError: A unit with trainable parameters has no gradient.
    """
    want = {u: Counter(q.numel * plan.traced_of(q) for q in plan.units[u].params if not q.frozen) for u in order}
    owned: dict[int, list[tuple[int, tuple[int, int, str]]]] = {u: [] for u in order}
    strays = []
    # a storage the run never frees is no gradient (zero_grad frees those): the backward thread's cuBLAS
    # workspaces a CUDA trace makes in the first backward (tracer cublas_workspaces), sized like a weight's gradient
    freed = {s for s, n, _ in events[back:] if n < 0}
    for i in range(back, end):
        s, n, t = events[i]
        if n > 0 and s in grads and s in freed:
            hit = next((v for v in order if want[v][n] > 0), None)
            if hit is None:
                strays.append((s, n, t))
                continue
            want[hit][n] -= 1
            owned[hit].append((i, (s, n, t)))
    if any(not owned[u] and want[u] for u in order):
        raise FsdpReplayError("an FSDP unit without gradients in the traced backward")
    return owned, strays


def aligned_gradients(events: Sequence[tuple[int, int, str]], first_pass: dict[str, Any], back: int, end: int,
                       ) -> dict[int, list[tuple[int, tuple[int, int, str]]]]:
    """A later pass's gradients, unit by unit: where the pass makes the allocations that the step's first pass
    made its units' gradients with (the passes' backward allocations aligned by size and region, ``difflib``: a
    later pass repeats the first's, less the first step's one-off storages, ``allocator_compose._first_step_only``,
    and what deepening from one and two layer groups made of each).

    Raises:
        FsdpReplayError: The first pass is unknown, or a gradient has no counterpart.
    """
    if not first_pass:
        raise FsdpReplayError("an accumulating pass before its step's first pass")
    from difflib import SequenceMatcher

    first = [i for i in range(first_pass["back"], first_pass["end"]) if events[i][1] > 0]
    later = [i for i in range(back, end) if events[i][1] > 0]

    def sig(i: int) -> tuple[int, str]:
        return events[i][1], base_region(events[i][2])

    blocks = SequenceMatcher(None, [sig(i) for i in first], [sig(i) for i in later], autojunk=False)
    at = {first[a + d]: later[b + d] for a, b, size in blocks.get_matching_blocks() for d in range(size)}
    owned: dict[int, list[tuple[int, tuple[int, int, str]]]] = {}
    for u, hs in first_pass["owned"].items():
        if any(i not in at for i, _ in hs):
            raise FsdpReplayError("a gradient of the first pass without its counterpart in a later pass")
        owned[u] = [(at[i], events[at[i]]) for i, _ in hs]
    return owned


def replays(spec: TrainingSpec, version: int) -> bool:
    """Whether the FSDP``version`` rewrite describes this run (an FSDP spec of that version :func:`not_replayed`
    accepts; the caller checks that the run is traced: ``pinned_path.traceable``)."""
    from fitcheck.spec import Strategy

    fs = spec.sharding.fsdp
    return (spec.sharding.strategy is Strategy.FSDP and fs is not None and fs.version == version
            and not not_replayed(spec))


def replay_key(spec: TrainingSpec, plan: FsdpPlan) -> str:
    """What an FSDP rewrite's replay depends on beyond the activation trace's key (``pinned_path._cache_key``)."""
    hw = spec.hardware
    version = 1 if isinstance(plan, Fsdp1Plan) else 2
    return f"|fsdp{version} {plan!r} {hw.expandable_segments} {hw.cuda_alloc_conf!r}"
