"""A live-tensor recorder: every new storage an ATen op creates, deduplicated, freed via weakref.finalize.

Works the same on real CPU tensors (the truth a CPU benchmark measures) and on FakeTensors (the tracer), so
that a fake trace and a real step are measured by the same instrument. Storage bytes, not tensor bytes: views
share their base's storage and are counted once, as the caching allocator would.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_ACTIVE: list[LiveTensorRecorder] = []  # the recorders entered, innermost last
_OUTSIDE = -1  # the serial of a storage the recorder knows but does not count


@contextlib.contextmanager
def outside_allocator() -> Iterator[None]:
    """Storages created inside are known to the active recorder but not counted: memory CUDA takes outside
    torch's caching allocator (bitsandbytes' paged optimizer states, ``cudaMallocManaged``)."""
    if not _ACTIVE:
        yield
        return
    rec = _ACTIVE[-1]
    rec.outside, was = True, rec.outside
    try:
        yield
    finally:
        rec.outside = was


@contextlib.contextmanager
def tagged(tag: str) -> Iterator[None]:
    """Storages the active recorder sees allocated inside carry ``tag`` instead of their region's name (in
    ``allocation_events``; no region is entered, so ``region_starts`` keep their count): GRPO's log-prob pre-pass,
    which ``allocator_compose.whole_run`` keeps only in the passes that generate (``tracer_grpo``)."""
    if not _ACTIVE:
        yield
        return
    rec = _ACTIVE[-1]
    since = len(rec.events)
    try:
        yield
    finally:
        for serial, sign in rec.events[since:]:
            if sign > 0:
                rec.tags[serial] = tag


@dataclass
class RegionStats:
    """Peak of live bytes inside one region of the step and the event index where it happened."""

    peak: int = 0
    peak_event: int = -1
    end: int = 0
    end_event: int = -1
    start_event: int = -1


class LiveTensorRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the live storage bytes over a step, split into named regions.

    Attributes:
        current: Live bytes now.
        sizes: serial -> bytes of every storage ever seen.
        tags: serial -> region in which it was allocated.
        events: (serial, +1 alloc / -1 free), in order.
        regions: region name -> peak statistics.
        region_starts: Index in ``events`` of the first event of each region entered, in order (a name entered
            again, as every warm-up step's, starts again).
        held: Storages the device allocates for a library and never frees, outside the step's tensors
            (:meth:`hold`): (index in ``events`` they come before, regions entered by then, serial).
        op_hook: Called as ``op_hook(recorder, func)`` after each op's outputs are recorded (the CUDA emulation's
            cuBLAS workspaces: ``cuda_emulation.CublasWorkspaces``).
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.current = 0
        self.sizes: dict[int, int] = {}
        self.tags: dict[int, str] = {}
        self.events: list[tuple[int, int]] = []
        self.regions: dict[str, RegionStats] = {}
        self.region = "setup"
        self.region_starts: list[int] = []
        self._serial_of: dict[int, int] = {}
        self.outside = False
        self.held: list[tuple[int, int, int]] = []
        self.op_hook: Callable[[LiveTensorRecorder, Any], None] | None = None

    def __enter__(self) -> LiveTensorRecorder:
        _ACTIVE.append(self)
        return super().__enter__()  # type: ignore[no-any-return, no-untyped-call]

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        _ACTIVE.pop(len(_ACTIVE) - 1 - _ACTIVE[::-1].index(self))

    def enter_region(self, name: str) -> None:
        """Start a new region; the previous one's end is the current state."""
        prev = self.regions.setdefault(self.region, RegionStats())
        prev.end, prev.end_event = self.current, len(self.events) - 1
        self.region = name
        stats = self.regions.setdefault(name, RegionStats())
        stats.peak, stats.peak_event = self.current, len(self.events) - 1
        stats.start_event = len(self.events) - 1
        self.region_starts.append(len(self.events))

    def track(self, tensors: Iterable[Any]) -> None:
        """Register the storages of tensors created outside the mode (parameters, buffers, inputs)."""
        import torch

        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t)

    def track_reachable(self) -> None:
        """Register every tensor Python still reaches, after a ``gc.collect()``: what a real run made before the
        recording starts (its model, optimizer states, an engine's buffers; meta tensors hold no storage). The
        benchmarks' real CPU runs start their records so (``benchmarks/deepspeed_cpu.py``, ``fsdp_cpu.py``,
        ``fsdp1_lora_cpu.py``)."""
        import gc

        import torch

        gc.collect()
        self.track(o for o in gc.get_objects() if isinstance(o, torch.Tensor) and not o.is_meta)

    def hold(self, nbytes: int) -> None:
        """Record ``nbytes`` the device allocates now and keeps (a library's workspace): an allocation event for the
        caching-allocator replay (:meth:`allocation_events`), outside ``events``, the live bytes and the region
        peaks (the estimate counts such memory as its own component: ``core/overheads.py``)."""
        serial = len(self.sizes)
        self.sizes[serial] = nbytes
        self.tags[serial] = self.region
        self.held.append((len(self.events), len(self.region_starts), serial))

    def allocation_events(self) -> tuple[tuple[tuple[int, int, str], ...], tuple[int, ...]]:
        """Every allocation and free in order, the held storages included, and the index of each region's first
        event in that sequence: ``(serial, +bytes / -bytes, region allocated in)`` (``TraceResult.alloc_events``,
        ``region_starts``)."""
        held: dict[int, list[int]] = {}
        for at, _regions, serial in self.held:
            held.setdefault(at, []).append(serial)
        out: list[tuple[int, int, str]] = []
        # events before each event index that reach the allocator: a storage of 0 bytes never does (torch
        # c10/cuda/CUDACachingAllocator.cpp NativeCachingAllocator::allocate calls malloc only ``if (size != 0)``;
        # its free is a null pointer's); left in, it read as a free of a storage never allocated
        # (allocator_compose.ComposeError: a CUDA KTO step without a prompt length makes a ``zeros((0,))`` in backward)
        before = [0]
        for i, (serial, sign) in enumerate([*self.events, (-1, 0)]):
            out += [(s, self.sizes[s], self.tags[s]) for s in held.get(i, ())]
            if sign and self.sizes[serial]:
                out.append((serial, sign * self.sizes[serial], self.tags[serial]))
            before.append(before[-1] + (1 if sign and serial >= 0 and self.sizes[serial] else 0))
        # a region starts after the storages held before it was entered
        starts = tuple(before[start] + sum(1 for _at, regions, _s in self.held if regions <= k)
                       for k, start in enumerate(self.region_starts))
        return tuple(out), starts

    def serial(self, t: Any) -> int | None:
        """Serial of a live tensor's storage, if tracked (and counted: not made :func:`outside_allocator`)."""
        serial = self._serial_of.get(id(t.untyped_storage()))
        return None if serial == _OUTSIDE else serial

    def live_at(self, event_index: int) -> set[int]:
        """Serials alive just after event ``event_index``."""
        live: set[int] = set()
        for serial, sign in self.events[: event_index + 1]:
            if sign > 0:
                live.add(serial)
            else:
                live.discard(serial)
        return live

    def series(self, regions: Sequence[str], classify: Callable[[int], int], width: int) -> list[tuple[int, ...]]:
        """Live bytes by category after every event of ``regions`` (each from its entry state to its end).

        Args:
            regions: Region names, in the order they ran (absent ones are skipped).
            classify: serial -> category index in ``range(width)``.
            width: Number of categories.

        Returns:
            One tuple of ``width`` byte counts per event, region after region; the first of each region is the
            state at its entry. Its element-wise argmax of the sum is the region's ``peak_event``.
        """
        windows = [(r.start_event, r.end_event if r.end_event >= r.start_event else len(self.events) - 1)
                   for r in (self.regions[n] for n in regions if n in self.regions)]
        if not windows:
            return []
        last = max(end for _, end in windows)
        live = [0] * width
        snapshots: dict[int, tuple[int, ...]] = {}
        wanted = {i for start, end in windows for i in range(start, end + 1)}
        if -1 in wanted:
            snapshots[-1] = tuple(live)
        for i, (serial, sign) in enumerate(self.events[: last + 1]):
            live[classify(serial)] += sign * self.sizes[serial]
            if i in wanted:
                snapshots[i] = tuple(live)
        return [snapshots[i] for start, end in windows for i in range(start, end + 1)]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        import torch

        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        if self.op_hook is not None:
            self.op_hook(self, func)
        return out

    def _add(self, t: Any) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._serial_of:
            return
        if self.outside:
            self._serial_of[key] = _OUTSIDE
            weakref.finalize(st, self._free, key, _OUTSIDE)
            return
        nbytes = int(st.nbytes())
        serial = len(self.sizes)
        self.sizes[serial] = nbytes
        self.tags[serial] = self.region
        self._serial_of[key] = serial
        self.current += nbytes
        self.events.append((serial, 1))
        stats = self.regions.setdefault(self.region, RegionStats())
        if self.current > stats.peak:
            stats.peak, stats.peak_event = self.current, len(self.events) - 1
        weakref.finalize(st, self._free, key, serial)

    def _free(self, key: int, serial: int) -> None:
        if self._serial_of.get(key) == serial:
            del self._serial_of[key]
        if serial == _OUTSIDE:
            return
        self.current -= self.sizes[serial]
        self.events.append((serial, -1))
