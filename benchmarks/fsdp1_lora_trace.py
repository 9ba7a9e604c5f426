"""Issue 19: a whole ``fsdp1_lora_gpu.py`` case's allocator events, recorded on the GPU and replayed here.

The H200 rows of ``benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json`` reserve far above their allocated peak on the
FSDP cases (Llama-2-70B 16 layers QLoRA FSDP1 4 x 4096 on the fms stack: 33.45 GiB reserved, 24.57 allocated), and
their counters cannot say which part is (a) blocks cached before the step (the load, FSDP's flattening of the
GPU-resident model: ``prepare`` reserved - allocated) that the step never reuses, which torch's allocator gives back
when a ``cudaMalloc`` fails (``release_cached_blocks``: every unsplit cached block, torch 2.13
``c10/cuda/CUDACachingAllocator.cpp`` ``malloc`` -> ``alloc_block`` -> retry), or (b) free blocks inside segments
that also hold live blocks (``inactive_split``), which no retry returns and which decide an out-of-memory. A
full-run trace separates them:

* on the GPU (case field ``full_trace``): ``torch.cuda.memory._record_memory_history(context=None)`` from before
  the model is built to the end of step 3, written as ``<case>.trace.json.gz`` (one ``[action, addr, size,
  stream]`` row per event, the phase boundaries as event indices; a few MB);
* here (``python benchmarks/fsdp1_lora_trace.py FILE``): the default stream's events replayed through fitcheck's
  allocator (``fitcheck.core.caching``): its reserved per phase against the recorded counters (how far the replay
  is from torch's own allocator on the real event order), and the least capacity at which the replay runs, i.e.
  what the run needs of a GPU once release-and-retry has returned the unreused cache; a capped case (case field
  ``cap_gib``: ``torch.cuda.set_per_process_memory_fraction`` after the load, the allocator's
  ``allowed_memory_maximum``) checks that number on the device.

``--rows [CASE ...]``: the same two numbers for the measured rows from fitcheck's own traced whole run (no GPU):
the plain rows' reserved within -0.4 .. +1.4 % of the H200's (the in-step gap is the traced allocation order's).
``--rewrite [CASE ...]``: the 5.23 FSDP1 rows replayed by ``fsdp1_run_events`` itself (:func:`rewrite_rows`), the
model on the GPU before ``prepare`` (``resident``) and, for comparison, moved from the host (``moved``).
``--harness [CASE ...]``: the FSDP1 rows as the harness ran them (:func:`harness_events`: the load, the Trainer's
``free_memory()``, FSDP1 flattening the model already on the GPU, the traced step): Mistral-7B LoRA 4 x 4096 on
5.23 FSDP1 reserves 27.17 / 40.07 GiB after prepare / in the step (H200: 27.22 / 40.07) and runs from 24.15 GiB
(the flattening's 13.5 GiB cache is whole segments); the 4-layer 70B QLoRA 5.27 / 9.49 (5.29 / 9.06), from 9.38.
"""

from __future__ import annotations

import gzip
import itertools
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
# torch's trace actions (torch 2.13 torch/cuda/memory.py _snapshot "device_traces"), coded for the file
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom")
MAX_ENTRIES = 2_000_000  # the recorder's ring buffer: the run must stay below it (checked when written)


def start() -> None:
    """Record every allocator event from now on, without stack traces (small, and no symbolising cost)."""
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES)


def mark() -> int:
    """The number of events recorded so far (a phase boundary)."""
    import torch

    return len(torch.cuda.memory._snapshot()["device_traces"][0])


def write(path: Path, marks: dict[str, int], counters: dict[str, Any]) -> dict[str, Any]:
    """Stop recording and write the events, the phase marks and the allocator's counters per phase.

    Returns:
        What the row records about the file (its name, events, bytes, whether the ring buffer wrapped).
    """
    import torch

    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    rows = [[ACTIONS.index(ev["action"]) if ev["action"] in ACTIONS else -1, int(ev.get("addr", 0)),
             int(ev.get("size", 0)), int(ev.get("stream", 0))] for ev in trace]
    doc = {"schema": 1, "actions": list(ACTIONS), "marks": marks, "counters": counters, "events": rows}
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return {"trace_file": path.name, "trace_events": len(rows), "trace_bytes": path.stat().st_size,
            "trace_wrapped": len(rows) >= MAX_ENTRIES}


def load(path: Path) -> dict[str, Any]:
    """A file written by :func:`write`."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return dict(json.load(fh))


def replay(doc: dict[str, Any], cap: int | None = None, cap_at: int = 0) -> dict[str, Any]:
    """The default stream's events through fitcheck's caching allocator.

    ``alloc`` -> ``malloc`` of the recorded block size; ``free_completed`` (the block back in its pool: after a
    ``record_stream`` use has finished, not at ``free_requested``) -> ``free``; a run of ``segment_free`` not
    after an ``oom`` -> ``empty_cache`` (the harness's ``torch.cuda.empty_cache()`` after saving the QLoRA
    checkpoint). Other streams' blocks are counted apart (their own pools, ``get_free_block``).

    Args:
        doc: :func:`load`'s document.
        cap: Device bytes the replay may reserve from event ``cap_at`` on (None: unlimited), as
            ``set_per_process_memory_fraction`` caps ``alloc_block`` from the moment it is set.
        cap_at: The event index the cap starts at.

    Returns:
        Peaks per phase (allocated, reserved; each phase ends at its mark), the retries, the other streams' peak.

    Raises:
        fitcheck.core.caching.OutOfMemory: The run does not fit in ``cap``.
    """
    from fitcheck.core.caching import CachingAllocator

    acts = doc["actions"]
    alloc, freed, seg_free, oom = (acts.index(a) for a in ("alloc", "free_completed", "segment_free", "oom"))
    bounds = sorted((int(i), str(name)) for name, i in doc["marks"].items())
    sim = CachingAllocator()
    handles: dict[int, int] = {}
    serial = itertools.count(1)
    other: dict[int, int] = {}
    other_now = other_peak = 0
    phases: dict[str, tuple[int, int]] = {}
    last = -1
    for i, (act, addr, size, stream) in enumerate(doc["events"]):
        if i == cap_at:
            sim.capacity = cap
        while bounds and i >= bounds[0][0]:
            phases[bounds.pop(0)[1]] = (sim.stats.peak_allocated, sim.stats.peak_reserved)
            sim.reset_peak_stats()
        if stream != 0:
            if act == alloc:
                other[addr] = size
                other_now += size
                other_peak = max(other_peak, other_now)
            elif act == freed and addr in other:
                other_now -= other.pop(addr)
        elif act == alloc:
            handles[addr] = next(serial)
            sim.malloc(handles[addr], size)
        elif act == freed and addr in handles:
            sim.free(handles.pop(addr))
        elif act == seg_free and last not in (seg_free, oom):
            sim.empty_cache()
        last = act
    for _, name in bounds:
        phases[name] = (sim.stats.peak_allocated, sim.stats.peak_reserved)
        sim.reset_peak_stats()
    return {"phases": phases, "retries": sim.stats.retries, "other_streams_peak": other_peak}


def least_capacity(doc: dict[str, Any], start: str = "load", resolution: int = 64 * 2**20) -> int:
    """The smallest capacity (to ``resolution``) at which :func:`replay` runs without running out of memory, the
    cap set at the phase mark ``start`` (the capped GPU case sets its fraction after the load: the cache the load
    leaves is what the cap meets)."""

    phases = replay(doc)["phases"]
    names = list(phases)
    after = names[names.index(start) + 1:] if start in names else names
    lo = max(phases[n][0] for n in after) - 1
    hi = max(phases[n][1] for n in after)
    at = int(doc["marks"].get(start, 0))
    return least_fitting(lambda cap: replay(doc, cap, at), lo, hi, resolution)


def least_fitting(run: Callable[[int], Any], lo: int, hi: int, resolution: int) -> int:
    """The smallest capacity (within ``resolution``) at which ``run(capacity)`` raises no ``OutOfMemory``: ``lo``
    fails, ``hi`` fits."""
    from fitcheck.core.caching import OutOfMemory

    while hi - lo > resolution:
        mid = (lo + hi) // 2
        try:
            run(mid)
            hi = mid
        except OutOfMemory:
            lo = mid
    return hi


def report(path: Path) -> str:
    """The replay of one file against its recorded counters, and the least capacity from the load on."""
    doc = load(path)
    g = 2**30
    got = replay(doc)
    lines = [f"{path.name}: {len(doc['events'])} events; replay (default stream) vs recorded, GiB",
             f"{'phase':10} {'alloc':>8} {'rec':>8} {'resv':>8} {'rec':>8}"]
    for name, (a, r) in got["phases"].items():
        rec = doc["counters"].get(name) or {}
        lines.append(f"{name:10} {a / g:8.2f} {rec.get('max_allocated', 0) / g:8.2f} {r / g:8.2f} "
                     f"{rec.get('max_reserved', 0) / g:8.2f}")
    lines.append(f"other streams' peak {got['other_streams_peak'] / g:.2f} GiB; "
                 f"least capacity from the load on {least_capacity(doc) / g:.2f} GiB")
    return "\n".join(lines)



def h200_rows() -> dict[str, Any]:
    """The measured rows of ``benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json`` that ran, by case name."""
    data = json.loads((ROOT / "benchmarks" / "data" / "fsdp1_lora_gpu_nvidia_h200.json").read_text())
    return {r["case"]: r for r in data["rows"] if r.get("status") == "ok"}


def traced_rows(names: list[str]) -> str:
    """The measured rows' whole runs as fitcheck traces them (``allocator_whole_run.whole_run_events``: the plain
    Trainer's run, this machine's transformers), replayed: peak reserved against the H200's, and the least capacity
    at which the replay runs (release-and-retry included)."""
    import itertools as it

    from fsdp1_lora_gpu import CASES, case_spec

    from fitcheck.core.caching import CachingAllocator
    from fitcheck.core.loading import allocator_conf
    from fitcheck.torch_adapters import whole_run_events

    rows = h200_rows()
    g = 2**30
    lines = [f"{'case':34} {'alloc':>6} {'meas':>6} {'resv':>6} {'meas':>6} {'least':>6}"]
    for name in names:
        spec = case_spec(rows[name], CASES[name])
        events, conf = whole_run_events(spec), allocator_conf(spec)

        def run(cap: int | None, events: Any = events, conf: Any = conf) -> Any:
            sim, live, serial = CachingAllocator(conf, cap), {}, it.count(1)
            for key, signed, _ in events:
                if signed > 0:
                    live[key] = next(serial)
                    sim.malloc(live[key], signed)
                elif key in live:
                    sim.free(live.pop(key))
            return sim.stats

        free = run(None)
        hi = least_fitting(run, free.peak_allocated - 1, free.peak_reserved, 64 * 2**20)
        m = rows[name]["measured"]["step2"]
        lines.append(f"{name:34} {free.peak_allocated / g:6.2f} {m['max_allocated'] / g:6.2f} "
                     f"{free.peak_reserved / g:6.2f} {m['max_reserved'] / g:6.2f} {hi / g:6.2f}")
    return "\n".join(lines)


def harness_events(spec: Any, qlora: bool, flatten: bool) -> tuple[list[tuple[Any, int]], dict[str, int]]:
    """The harness's run as allocator events, from fitcheck's own pieces (no GPU): the load, the Trainer's
    ``free_memory()``, FSDP1's flattening of a model already on the GPU, the traced plain whole run.

    * load: QLoRA, ``from_pretrained``'s quantise-on-load (``core.loading.load_events``); LoRA, ``from_config`` on the
      GPU: each parameter allocated in module order (the inventory's order, layer by layer), no warm-up block;
    * ``Trainer._inner_training_loop`` starts with ``accelerator.free_memory()`` -> ``release_memory`` ->
      ``torch.cuda.empty_cache()`` (transformers 4.48.1 ``trainer.py`` l.2181, 5.23 l.1593; accelerate
      ``utils/memory.py`` ``clear_device_cache``): the load's cache goes back, before the model is wrapped;
    * FSDP1 at one process (``NO_SHARD``): per unit, the layers then the root, ``flatten_tensors`` ``torch.cat``
      makes the unit's flat parameter and ``_use_unsharded_views`` drops the original storages (torch 2.13
      ``distributed/fsdp/_flat_param.py``); peft's LoRA units (KiB, small pool) are left out;
    * the step: ``allocator_whole_run.whole_run_events`` (the plain Trainer's three steps), its parameter allocations
      skipped (the load made them).

    Returns:
        ``(key, +bytes / -bytes)`` events, and the event index of each phase's start (``prepare``, ``step``).
    """
    import re
    from collections import Counter

    from fitcheck.core.loading import load_events, load_order
    from fitcheck.torch_adapters import whole_run_events

    if qlora:
        loaded = load_events(spec, spec.hardware.gpu_memory_bytes)
        params = [e for e in loaded if e.kind == "alloc" and e.what in ("packed 4-bit weight", "parameter")]
        names = [n for n, _ in load_order(spec)]
        events: list[tuple[Any, int]] = [(("load", e.handle), e.nbytes if e.kind == "alloc" else -1) for e in loaded]
        owned = [(("load", e.handle), e.nbytes, n) for e, n in zip(params, names, strict=True)]
    else:
        load = spec.precision.load_dtype.nbytes
        layers = spec.model.shape.num_layers
        top = [e for e in spec.model.params if not e.per_layer and "norm" not in e.name and "lm_head" not in e.name]
        tail = [e for e in spec.model.params if not e.per_layer and e not in top]
        per = [e for e in spec.model.params if e.per_layer]
        order = [(e.name, e) for e in top] + [(e.name.replace("*", str(i), 1), e) for i in range(layers)
                                              for e in per] + [(e.name, e) for e in tail]
        owned = [(("load", k), e.numel_each * load, n) for k, (n, e) in enumerate(order)]
        events = [(key, nbytes) for key, nbytes, _ in owned]
    marks = {"prepare": len(events)}
    events.append(("empty_cache", 0))
    if flatten:
        units: dict[int, list[tuple[Any, int]]] = {}
        for key, nbytes, name in owned:
            m = re.search(r"layers\.(\d+)\.", name)
            units.setdefault(int(m.group(1)) if m else 1 << 30, []).append((key, nbytes))
        for u in sorted(units):
            events.append((("flat", u), sum(n for _, n in units[u])))
            events += [(key, -1) for key, _ in units[u]]
    marks["step"] = len(events)
    skip = Counter(nbytes for _, nbytes, _ in owned)
    for key, signed, tag in whole_run_events(spec):
        if tag == "setup" and signed > 0 and skip[signed] > 0:
            skip[signed] -= 1
            continue
        events.append((("run", key), signed))
    return events, marks


def replay_harness(events: list[tuple[Any, int]], marks: dict[str, int], cap: int | None = None) -> dict[str, Any]:
    """:func:`harness_events` through fitcheck's caching allocator (``cap`` from the load's end, as a capped case
    sets ``set_per_process_memory_fraction``): reserved at the end of each phase and the step's peaks."""
    from fitcheck.core.caching import CachingAllocator

    sim = CachingAllocator()
    handles: dict[Any, int] = {}
    serial = itertools.count(1)
    out: dict[str, Any] = {}
    for i, (key, signed) in enumerate(events):
        if i == marks["prepare"]:
            out["load"] = (sim.stats.allocated, sim.stats.reserved)
            sim.capacity = cap
        if i == marks["step"]:
            out["prepare"] = (sim.stats.allocated, sim.stats.reserved)
            sim.reset_peak_stats()
        if key == "empty_cache":
            sim.empty_cache()
        elif signed > 0:
            handles[key] = next(serial)
            sim.malloc(handles[key], signed)
        elif key in handles:
            sim.free(handles.pop(key))
    out["step"] = (sim.stats.peak_allocated, sim.stats.peak_reserved)
    return out


def harness_rows(names: list[str]) -> str:
    """:func:`replay_harness` of measured FSDP1 rows (with and without the flattening) against the H200, and the
    least capacity from the load on (what a capped case checks)."""
    from fsdp1_lora_gpu import CASES, case_spec


    rows = h200_rows()
    g = 2**30
    lines = [f"{'case':30} {'flatten':>7} {'prep R':>7} {'meas':>6} {'step A':>7} {'meas':>6} {'step R':>7} "
             f"{'meas':>6} {'least':>6}"]
    for name in names:
        case, m = CASES[name], rows[name]["measured"]
        spec = case_spec(rows[name], case)
        for flatten in (False, True):
            events, marks = harness_events(spec, bool(case["qlora"]), flatten)
            got = replay_harness(events, marks)
            hi = least_fitting(partial(replay_harness, events, marks), got["step"][0] - 1,
                               max(got["step"][1], got["prepare"][1]), 64 * 2**20)
            lines.append(f"{name:30} {flatten!s:>7} {got['prepare'][1] / g:7.2f} {m['prepare']['reserved'] / g:6.2f} "
                         f"{got['step'][0] / g:7.2f} {m['step2']['max_allocated'] / g:6.2f} {got['step'][1] / g:7.2f} "
                         f"{m['step2']['max_reserved'] / g:6.2f} {hi / g:6.2f}")
    return "\n".join(lines)


def rewrite_phases(events: list[Any], conf: Any) -> dict[str, tuple[int, int, int, int]]:
    """A rewritten run's default stream through fitcheck's allocator, per phase as the harness reads its counters:
    ``load`` (at the rewrite's ``RESET_PEAKS``), ``prepare`` (at the first forward), ``stepN`` (at the end of each
    optimizer step); each ``(allocated, reserved, peak allocated, peak reserved)``, peaks reset between."""
    from fitcheck.core.caching import CachingAllocator
    from fitcheck.torch_adapters import EMPTY_CACHE, RESET_PEAKS, SIDE

    sim = CachingAllocator(conf)
    handles: dict[int, int] = {}
    out: dict[str, tuple[int, int, int, int]] = {}

    def mark(name: str) -> None:
        st = sim.stats
        out[name] = (st.allocated, st.reserved, st.peak_allocated, st.peak_reserved)
        sim.reset_peak_stats()

    def stepping(i: int) -> bool:
        return i < len(events) and events[i][2].removeprefix(SIDE).startswith("optimizer")

    steps = 0
    for k, (key, signed, tag) in enumerate(events, 1):
        if tag == EMPTY_CACHE:
            sim.empty_cache()
        elif tag == RESET_PEAKS:
            mark("load")
        elif not tag.startswith(SIDE):
            if "prepare" not in out and tag.startswith("forward"):
                mark("prepare")
            if signed > 0:
                handles[key] = k
                sim.malloc(k, signed)
            elif key in handles:
                sim.free(handles.pop(key))
        if stepping(k - 1) and not stepping(k):  # the step's optimizer (and its side-stream frees) is over
            steps += 1
            mark(f"step{steps}")
    return out


def rewrite_rows(names: list[str]) -> str:
    """The H200's 5.23 FSDP rows replayed by ``fsdp1_run_events`` (``fsdp1v1`` rows) or ``fsdp2_run_events`` (the
    other ``fsdp1`` rows: 5.23's ``fsdp`` defaults to FSDP2) as the harness ran them, per phase against the
    counters: the model on the GPU before ``prepare`` (QLoRA: ``from_pretrained``'s quantise-on-load,
    ``core.loading.load_events``; LoRA: ``from_config`` on the GPU, the traced module's storages in module order),
    ``sync_module_states`` off (the harness's ``fsdp_config``), fused AdamW (the harness's ``adamw_torch`` is not
    replayed; on LoRA's adapters its states are MiB)."""
    import dataclasses

    from fsdp1_lora_gpu import CASES, case_spec

    from fitcheck.core.loading import allocator_conf, load_events
    from fitcheck.torch_adapters import fsdp1_plan, fsdp1_run, fsdp2_plan, fsdp2_run, whole_run_events

    rows = h200_rows()
    g = 2**30
    lines = [f"{'case':30} {'mode':8} {'phase':8} {'alloc':>6} {'meas':>6} {'resv':>6} {'meas':>6} {'peakA':>6} "
             f"{'meas':>6} {'peakR':>6} {'meas':>6}"]
    for name in names:
        row = rows[name]
        spec = case_spec(row, CASES[name])
        spec = dataclasses.replace(spec, optimizer=dataclasses.replace(spec.optimizer, name="adamw_torch_fused"))
        v1 = spec.sharding.fsdp is not None and spec.sharding.fsdp.version == 1
        plan: Any = (dataclasses.replace(fsdp1_plan(spec), sync=bool(CASES[name].get("fsdp_load"))) if v1
                     else fsdp2_plan(spec))
        run: Any = fsdp1_run if v1 else fsdp2_run
        plain = whole_run_events(spec, micro_batches=plan.accum)
        qlora = bool(CASES[name]["qlora"])
        load = load_events(spec, spec.hardware.gpu_memory_bytes) if qlora else []
        for mode, p in (("resident", dataclasses.replace(plan, resident=True)),
                        ("moved", dataclasses.replace(plan, resident=False))):
            got = rewrite_phases(run(plain, p, load if p.resident else []), allocator_conf(spec))
            for phase, (a, r, pa, pr) in got.items():
                m = row["measured"].get(phase) or (row.get(phase) if phase == "load" else None) or {}
                lines.append(f"{name:30} {mode:8} {phase:8} {a / g:6.2f} {m.get('allocated', 0) / g:6.2f} "
                             f"{r / g:6.2f} {m.get('reserved', 0) / g:6.2f} {pa / g:6.2f} "
                             f"{m.get('max_allocated', 0) / g:6.2f} {pr / g:6.2f} {m.get('max_reserved', 0) / g:6.2f}")
    return "\n".join(lines)


def held_rewrite(events: list[tuple[Any, int]], plain: list[tuple[int, int, str]],
                 ckpt_bytes: int) -> tuple[list[tuple[Any, int]], int]:
    """:func:`harness_events` rewritten as transformers < 4.52 runs FSDP1 with reentrant checkpointing around each
    unit (``fitcheck/core/activations/fsdp1_reentrant.py``: every checkpointed layer input and its gradient live
    until ``_finalize_params`` at the end of backward): each forward block of one checkpointed input's size that the
    plain run frees during backward is freed at the first event after backward instead, and where it was freed the
    layer's input gradient (the same size) is allocated and held with it. An experiment, not the product's replay
    (session 23): the plain run's events carry their allocation's region, so the region at a free is the latest
    allocation's.

    Returns:
        The events, and how many inputs were held.
    """
    region = {("run", k): t for k, signed, t in plain if signed > 0}
    now: dict[Any, str] = {}
    cur = ""
    for k, signed, t in plain:
        if signed > 0:
            cur = t
        else:
            now[("run", k)] = cur
    out: list[tuple[Any, int]] = []
    held: list[Any] = []
    born: dict[Any, tuple[str, int]] = {}
    count = 0
    for key, signed in events:
        at = region.get(key, "") if signed > 0 else now.get(key, "")
        if signed > 0:
            born[key] = (at, signed)
        elif key in born and born[key][1] == ckpt_bytes and born[key][0] in ("forward", "forward_warmup") \
                and at.startswith("backward"):
            held += [key, ("input grad", key)]
            out.append((("input grad", key), ckpt_bytes))
            count += 1
            continue
        if held and at.startswith("optimizer"):
            out += [(k, -1) for k in held]
            held = []
        out.append((key, signed))
    return out, count


def held_rows(names: list[str]) -> str:
    """:func:`held_rewrite` of the 4.48 rows' harness against the H200's whole-run traces (the replay of the real
    events: ``report``), and the least capacity (the device: out of memory capped at 27 GiB, ran at 30)."""
    from fsdp1_lora_gpu import CASES, SEQ, case_spec

    from fitcheck.torch_adapters import whole_run_events

    rows = h200_rows()
    g = 2**30
    lines = [f"{'case':48} {'held':>5} {'step A':>7} {'meas':>6} {'step R':>7} {'meas':>6} {'least':>6}"]
    for name in names:
        case, m = CASES[name], rows[name]["measured"]
        spec = case_spec(rows[name], case)
        events, marks = harness_events(spec, bool(case["qlora"]), True)
        ckpt = int(case["micro"]) * SEQ * spec.model.shape.hidden_size * 2  # bf16 hidden states
        for held in (False, True):
            ev, n = held_rewrite(events, whole_run_events(spec), ckpt) if held else (events, 0)
            got = replay_harness(ev, marks)
            hi = least_fitting(partial(replay_harness, ev, marks), got["step"][0] - 1,
                               max(got["step"][1], got["prepare"][1]), 64 * 2**20)
            lines.append(f"{name:48} {n:5d} {got['step'][0] / g:7.2f} {m['step2']['max_allocated'] / g:6.2f} "
                         f"{got['step'][1] / g:7.2f} {m['step1']['max_reserved'] / g:6.2f} {hi / g:6.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--held"]:
        print(held_rows(sys.argv[2:] or ["llama70b-16L QLoRA fsdp1 b4 old fsdpload trace",
                                         "llama70b-16L QLoRA fsdp1 b4 old trace"]))
    if sys.argv[1:2] == ["--rewrite"]:
        print(rewrite_rows(sys.argv[2:] or ["llama70b-4L QLoRA fsdp1v1 b2", "mistral LoRA fsdp1v1 b4"]))
    if sys.argv[1:2] == ["--rows"]:
        print(traced_rows(sys.argv[2:] or ["mistral LoRA plain b4", "mistral QLoRA plain b4",
                                           "llama70b-4L QLoRA plain b2", "mistral LoRA fsdp1v1 b4"]))
    if sys.argv[1:2] == ["--harness"]:
        print(harness_rows(sys.argv[2:] or ["mistral LoRA fsdp1v1 b4", "llama70b-4L QLoRA fsdp1v1 b2"]))
    for arg in sys.argv[1:]:
        if not arg.startswith("--") and arg.endswith(".gz"):
            print(report(Path(arg)))
