"""The plain run's events walked for an FSDP rewrite: :func:`rewrite_steps` (the plain run walked step by step,
each step's FSDP operations put in), :func:`module_storages` (the traced module's parameters in the plain run's
setup), :func:`layer_starts` (each layer's forward in the deepened trace), :func:`base_region`, :func:`step_frame`,
:func:`unit_gradients`, :func:`aligned_gradients` (a later micro-batch's gradients).

Shared by ``fsdp2_run_events`` and ``fsdp1_run_events``; the plan they read is
:mod:`fitcheck.torch_adapters.fsdp_plan_types`'. Pure Python, no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from fitcheck.torch_adapters.fsdp_plan_types import FsdpPlan, FsdpReplayError


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
                  optimizer: Callable[[Any, str, bool], None], resident: bool = False,
                  ) -> list[tuple[int, int, str]]:
    """The plain run's events with one FSDP rank's put in: its setup without the traced module's parameters (with
    them where ``resident``: the model on the device before FSDP wraps it, whose prepare frees them),
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
    w.out += [ev for ev in events[:n_setup] if resident or ev[0] not in module]
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
