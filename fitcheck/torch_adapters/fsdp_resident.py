"""FSDP over a model already on the device (``FsdpPlan.resident``: a bitsandbytes 4-bit base, QLoRA): the setup
of the plain run replaced by the load that put the model there, and the storages each FSDP1 flat parameter or FSDP2
unit is made of.

Why the load: transformers 5.23 loads a bitsandbytes 4-bit model onto each rank's GPU (``quantizers/
quantizer_bnb_4bit.py`` ``update_device_map``: ``device_map=None`` -> the current device; ``modeling_utils.py``
``_move_missing_keys_from_meta_to_device`` keeps the rank-0-only path for unquantized models, ``and not
is_quantized``; accelerate 1.15 ``fsdp2_prepare_model`` skips ``cpu_ram_efficient_loading``'s meta move for a
``Params4bit`` model), with ``from_pretrained``'s own allocation order (``core.loading.load_events``:
``caching_allocator_warmup``'s block, each weight's 16-bit copy quantized on the device and freed). The Trainer's
``free_memory()`` then returns only whole free segments, and FSDP frees the loaded storages as it flattens
(FSDP1: ``fsdp1_run_events._prepare``) or shards (FSDP2: ``fsdp2_run_events._prepare``) each unit: where they sit
in the load's segments decides which of them the step can reuse. The H200's Llama-2-70B 4-layer QLoRA FSDP1 row
(``benchmarks/fsdp1_lora_trace.py --rewrite``, as the harness ran it: ``sync_module_states`` off) reserves 5.29 /
9.01 / 9.46 GiB after prepare / step 1 / step 2 replayed from the load (measured 5.29 / 9.05 / 9.06), 5.22 / 9.86 /
9.87 from the traced module's own storages (one segment per weight), 4.03 / 8.67 / 8.68 moved from the host. Its
FSDP2 row, and Mistral-7B's 8-layer one, reserve 5.26 / 2.66 GiB after prepare (measured 5.24 / 2.66).

Pure Python, no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from fitcheck.torch_adapters.deepspeed_run_backward import Event
from fitcheck.torch_adapters.fsdp_params import Param
from fitcheck.torch_adapters.fsdp_plan_types import Fsdp1Plan, FsdpPlan, FsdpReplayError

Key = tuple[int, int]  # (unit, its flat parameter: Fsdp1Plan.handles)
PARAMETERS = ("packed 4-bit weight", "parameter", "quantized weight as stored")  # load_events' resident tensors


def wrapped(plan: Fsdp1Plan, u: int) -> list[int]:
    """Unit ``u``'s flat parameters in the order ``_auto_wrap`` makes them: a nested adapter unit before its
    layer's own."""
    return sorted(range(len(plan.handles(u))), key=lambda k: not plan.trainable(u, k) and plan.split)


def groups_of(plan: FsdpPlan) -> list[tuple[Key, tuple[Param, ...]]]:
    """What FSDP makes from the loaded storages, in the order it does: FSDP1's flat parameters (``_auto_wrap``: the
    layers bottom-up, then the root; a nested adapter unit before its layer's own), FSDP2's units
    (``fully_shard`` calls: ``plan.wrap_order``), each ``(key, its parameters)``."""
    if isinstance(plan, Fsdp1Plan):
        return [((u, k), plan.handles(u)[k]) for u in plan.wrap_order for k in wrapped(plan, u)]
    return [((u, 0), plan.units[u].params) for u in plan.wrap_order]


def resident_storages(setup: Sequence[Event], plan: FsdpPlan) -> dict[Key, list[tuple[int, int]]]:
    """The storages (``serial``, bytes) each of :func:`groups_of` is made from, for a model on the device before
    FSDP wraps it: matched by size in that order, each taking the earliest storage of its size still alive at the
    end of ``setup`` (layers load and build in order).

    Raises:
        FsdpReplayError: A parameter has no storage of its size.
    """
    alive: dict[int, int] = {}
    for s, n, _ in setup:
        if n > 0:
            alive[s] = n
        else:
            alive.pop(s, None)
    free = list(alive.items())
    used: set[int] = set()
    out: dict[Key, list[tuple[int, int]]] = {}
    for key, params in groups_of(plan):
        found = []
        for q in params:
            size = q.numel * plan.traced_of(q)
            hit = next((x for x, n in free if n == size and x not in used), None)
            if hit is None:
                raise FsdpReplayError(f"no traced parameter storage of {size} bytes")
            used.add(hit)
            found.append((hit, size))
        out[key] = found
    return out


def loaded_setup(events: Sequence[Event], plan: FsdpPlan, load: Sequence[Any]) -> list[Event]:
    """The plain run's events with its setup replaced by the load (``load``: ``core.loading.load_events``):

    * the traced buffers (setup storages that are neither a parameter nor a quantization statistic) first;
    * the load's events in order, each loaded parameter under the serial of the traced storage it becomes (matched
      by size, in loading order), its quantization statistics and temporaries under new serials; the traced
      statistics (the setup's other storages of the load's kept statistics' sizes) dropped;
    * the adapters peft adds after the load (the traced adapter storages, in their order);
    The run's peaks restart after it (``fsdp1_run_events._prepare``: ``RESET_PEAKS``).

    Raises:
        FsdpReplayError: A loaded parameter has no traced storage of its size.
    """
    n_setup = next((k for k, ev in enumerate(events) if ev[2] != "setup"), len(events))
    setup = list(events[:n_setup])
    owned = resident_storages(setup, plan)
    params = dict(groups_of(plan))
    base = [s for key, found in owned.items() for (s, _), q in zip(found, params[key], strict=True) if q.frozen]
    adapters = {s for found in owned.values() for s, _ in found} - set(base)
    size = {s: n for s, n, _ in setup if n > 0}
    order = {s: i for i, (s, n, _) in enumerate(setup) if n > 0}
    unused = sorted(base, key=order.__getitem__)
    serial_of: dict[int, int] = {}
    fresh = max((s for s, _, _ in events), default=0) + 1
    freed = {e.handle for e in load if e.kind == "free"}
    stats: Counter[int] = Counter()
    for e in load:
        if e.kind != "alloc":
            continue
        if e.what in PARAMETERS:
            hit = next((s for s in unused if size[s] == e.nbytes), None)
            if hit is None:
                raise FsdpReplayError(f"no traced parameter storage of {e.nbytes} bytes for the loaded {e.what}")
            unused.remove(hit)
            serial_of[e.handle] = hit
        else:
            serial_of[e.handle] = fresh + e.handle
            if e.handle not in freed:
                stats[e.nbytes] += 1
    kept: list[Event] = []
    for ev in setup:  # the traced buffers; the traced statistics give way to the load's
        s, n, _ = ev
        if s in base or s in adapters or (n > 0 and stats[n] > 0):
            if n > 0 and s not in base and s not in adapters:
                stats[n] -= 1
            continue
        kept.append(ev)
    nbytes = {e.handle: e.nbytes for e in load if e.kind == "alloc"}
    out = kept + [(serial_of[e.handle], nbytes[e.handle] if e.kind == "alloc" else -nbytes[e.handle], "setup")
                  for e in load]
    out += [ev for ev in setup if ev[0] in adapters]
    return out + list(events[n_setup:])


def resident_setup(events: Sequence[Event], plan: FsdpPlan,
                   load: Sequence[Any]) -> tuple[Sequence[Event], dict[Key, list[tuple[int, int]]] | None]:
    """A resident model's run (``plan.resident``: on each GPU before FSDP wraps it) and the loaded storages each unit
    flattens or shards and frees (:func:`resident_storages`), the load's events put in the setup where given
    (:func:`loaded_setup`); a moved model's events as they are and None. Shared by the FSDP1 and FSDP2 rewrites."""
    if not plan.resident:
        return events, None
    events = loaded_setup(events, plan, load) if load else events
    return events, resident_storages([ev for ev in events if ev[2] == "setup"], plan)

