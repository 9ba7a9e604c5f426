"""A replay of torch's CUDA caching allocator over a sequence of allocations and frees.

Every rule is torch's ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch snapshot 001074d, the source read for
torch 2.13; quoted names are its functions), single stream, no CUDA graphs:

* ``round_size``: requests below ``kMinBlockSize`` (512 B) take 512 B, others round up to a multiple of 512 B;
  with ``roundup_power2_divisions`` for the request's power-of-two interval (``divisions > 1`` and ``size >
  512 * divisions``) they round up to the next of ``divisions`` equal steps between two powers of two
  (``roundup_power2_next_division``).
* ``get_pool``: rounded sizes ``<= kSmallSize`` (1 MiB) go to the small pool, larger ones to the large pool.
* ``get_allocation_size``: a new segment is ``kSmallBuffer`` (2 MiB) for the small pool, ``kLargeBuffer``
  (20 MiB) below ``kMinLargeAlloc`` (10 MiB), else the size rounded up to ``kRoundLarge`` (2 MiB).
* ``get_free_block``: best fit, the smallest cached block of the pool at least as large (``lower_bound`` over
  blocks ordered by size, then address); a request below ``max_split_size`` never takes a block of at least
  ``max_split_size``, and a request of at least ``max_split_size`` takes an oversize block only within
  ``max_non_split_rounding`` (default ``kLargeBuffer``) of its size.
* ``should_split``: a small-pool block (or any block under expandable segments) is split when at least 512 B
  remain; a large-pool block when the request is below ``max_split_size`` and more than ``kSmallSize`` remains.
  An unsplit block is counted whole in ``allocated_bytes`` (``alloc_found_block`` counts ``block->size``).
* ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of its segment.
* ``malloc``: free block, else (``garbage_collect_cached_blocks`` when a memory fraction is set and
  ``garbage_collection_threshold > 0``) ``alloc_block``, else ``release_available_cached_blocks`` (oversize
  blocks, with ``max_split_size`` set) and retry, else ``release_cached_blocks`` (every unsplit cached block,
  every free page of an expandable segment) and retry (``num_alloc_retries`` counts only this one:
  ``alloc_block(..., isRetry=true)``), else out of memory.
* Expandable segments: :mod:`.expandable` (``find_expandable_block``, ``map_block``, ``unmap_block``).

Pure: no torch, no environment.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from fitcheck.core.caching.blocks import Block, BlockPool
from fitcheck.core.caching.conf import K_LARGE_BUFFER, AllocatorConf

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize
K_SMALL_SIZE = 1024**2  # kSmallSize
K_SMALL_BUFFER = 2 * 1024**2  # kSmallBuffer
K_MIN_LARGE_ALLOC = 10 * 1024**2  # kMinLargeAlloc
K_ROUND_LARGE = 2 * 1024**2  # kRoundLarge
_UNLIMITED = 1 << 62


class OutOfMemory(Exception):
    """The replay needed more than the capacity it was given."""


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: the next of ``divisions`` equal steps between two powers of two."""
    if size <= 4 or divisions <= 1 or size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, conf: AllocatorConf) -> int:
    """``round_size``: the block size a request takes (512 B multiples, or power-of-two divisions)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    log = size.bit_length() - 1
    index = min(max(0, log - 20), len(conf.roundup_power2_divisions) - 1)  # intervals start at 1 MiB
    divisions = conf.roundup_power2_divisions[index]
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return _round_up(size, K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc``'ed for a rounded request no cached block serves."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return _round_up(size, K_ROUND_LARGE)


@dataclass
class AllocatorStats:
    """What ``torch.cuda.memory_stats`` would report after a replay.

    Attributes:
        allocated: ``allocated_bytes.all.current``.
        reserved: ``reserved_bytes.all.current``.
        peak_allocated: ``allocated_bytes.all.peak`` (``max_memory_allocated``).
        peak_reserved: ``reserved_bytes.all.peak`` (``max_memory_reserved``).
        segments: ``cudaMalloc`` calls (``num_device_alloc``).
        retries: ``num_alloc_retries`` (cached blocks released to make room).
        region_peaks: Peak (allocated, reserved) per region named with :meth:`CachingAllocator.region`.
    """

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    retries: int = 0
    region_peaks: dict[str, tuple[int, int]] = field(default_factory=dict)


class CachingAllocator:
    """torch's device caching allocator, replayed (one device, one stream).

    Args:
        conf: The ``PYTORCH_CUDA_ALLOC_CONF`` settings.
        capacity: Bytes the device can give (None: unlimited); beyond it cached blocks are released and then
            :class:`OutOfMemory` is raised.
        memory_fraction_limit: ``set_per_process_memory_fraction`` x total memory, if set (the only case in
            which ``garbage_collection_threshold`` acts: ``malloc`` checks ``set_fraction``).
    """

    def __init__(self, conf: AllocatorConf | None = None, capacity: int | None = None,
                 memory_fraction_limit: int | None = None) -> None:
        self.conf = conf or AllocatorConf()
        self.capacity = capacity
        self.limit = memory_fraction_limit
        self.pools = {True: BlockPool(True), False: BlockPool(False)}
        self.stats = AllocatorStats()
        self._next_ptr = 0
        self._live: dict[int, Block] = {}
        self._region = ""

    # --- the public surface --------------------------------------------------------------------------
    def region(self, name: str) -> None:
        """Attribute the following events' peaks to a named region (load, step1, ...)."""
        self._region = name
        self._note()

    def malloc(self, handle: int, nbytes: int) -> None:
        """Allocate ``nbytes`` for a tensor storage named ``handle``.

        Raises:
            OutOfMemory: Nothing fits within the capacity, even after releasing cached blocks.
        """
        if handle in self._live:
            raise ValueError(f"handle {handle} is already allocated")
        size = round_size(nbytes, self.conf)
        small = size <= K_SMALL_SIZE
        pool = self.pools[small]
        block = self._get_free_block(pool, size)
        if block is None:
            if self.conf.garbage_collection_threshold > 0 and self.limit is not None:
                self._garbage_collect()
            block = self._alloc_block(pool, size)
            if block is None and self._release_available(pool, size):
                block = self._alloc_block(pool, size)
            if block is None and self._release_cached():
                block = self._alloc_block(pool, size)
            if block is None:
                raise OutOfMemory(f"{nbytes} B requested with {self.stats.reserved} B reserved")
        if self._should_split(block, size):
            rest = Block(block.ptr + size, block.size - size, small, expandable=block.expandable)
            rest.splice(block, block.next)
            block.size = size
            pool.insert(rest)
        block.allocated = True
        self._live[handle] = block
        self.stats.allocated += block.size
        self._note()

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache`` (``release_cached_blocks`` outside an allocation): every unsplit cached block
        goes back to the driver; no retry is counted."""
        retries = self.stats.retries
        self._release_cached()
        self.stats.retries = retries

    def free(self, handle: int) -> None:
        """Free the storage named ``handle`` (``free_block``: merge with free neighbours, back to its pool)."""
        block = self._live.pop(handle)
        block.allocated = False
        self.stats.allocated -= block.size
        pool = self.pools[block.small]
        pool.merge(block, block.prev)
        pool.merge(block, block.next)
        pool.insert(block)

    def reset_peak_stats(self) -> None:
        """``resetPeakStats``: the peaks start again from the current figures."""
        self.stats.peak_allocated, self.stats.peak_reserved = self.stats.allocated, self.stats.reserved
        self.stats.region_peaks.clear()

    def oversize_cached_bytes(self) -> int:
        """Cached free blocks of at least ``max_split_size`` (0 without it): ``get_free_block`` gives them only to a
        request within ``max_non_split_rounding`` of their size, and they go back to the driver only when a
        ``cudaMalloc`` fails (``release_available_cached_blocks``, oversize blocks first) or on ``emptyCache``."""
        split_max = self.conf.max_split_size
        if split_max is None:
            return 0
        return sum(b.size for pool in self.pools.values() for b in pool.by_key.values()
                   if b.size >= split_max and not b.expandable)

    def inactive_split_bytes(self) -> int:
        """``inactive_split_bytes``: cached free blocks inside segments that also hold live blocks.

        ``release_cached_blocks`` cannot return them (only unsplit blocks are ``cudaFree``'d), so they stay
        reserved whatever the next allocations need; torch leaves expandable segments out of this statistic
        (their free pages can be unmapped).
        """
        return sum(
            b.size for pool in self.pools.values() for b in pool.by_key.values() if b.is_split and not b.expandable
        )

    # --- malloc's steps ------------------------------------------------------------------------------
    def _get_free_block(self, pool: BlockPool, size: int) -> Block | None:
        """``get_free_block``: best fit, with the oversize rules of ``max_split_size``."""
        if self.conf.garbage_collection_threshold > 0 and self.limit is not None:
            pool.calls += 1
        i = bisect.bisect_left(pool.free, (size, -1))
        if i == len(pool.free):
            return None
        block = pool.by_key[pool.free[i]]
        if block.expandable and self.conf.expandable_segments:
            def reach(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            j = i + 1
            while j < len(pool.free) and block.expandable and reach(pool.by_key[pool.free[j]]) < reach(block):
                block = pool.by_key[pool.free[j]]
                j += 1
        split_max = self.conf.max_split_size or _UNLIMITED
        if size < split_max <= block.size:
            return None
        if size >= split_max and block.size >= size + self.conf.max_non_split_rounding:
            return None
        pool.remove(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.conf.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < (self.conf.max_split_size or _UNLIMITED) and remaining > K_SMALL_SIZE

    def _fits(self, extra: int) -> bool:
        cap = min(self.capacity or _UNLIMITED, self.limit or _UNLIMITED)
        return self.stats.reserved + extra <= cap

    def _alloc_block(self, pool: BlockPool, size: int) -> Block | None:
        """``alloc_block``: a new segment (``cudaMalloc``), or pages mapped onto an expandable segment
        (``try_allocate_expandable_block``, which takes the rounded size, not ``get_allocation_size``)."""
        if self.conf.expandable_segments:
            from fitcheck.core.caching.expandable import try_allocate_expandable_block  # expandable only

            return try_allocate_expandable_block(pool, size, self._charge, self._address)
        seg = allocation_size(size)
        if not self._fits(seg):
            return None
        block = Block(self._address(seg), seg, pool.small)
        self.stats.reserved += seg
        self.stats.segments += 1
        return block

    def _address(self, size: int) -> int:
        """A fresh device address range of ``size`` bytes, aligned to the largest page."""
        ptr = -(-self._next_ptr // K_LARGE_BUFFER) * K_LARGE_BUFFER
        self._next_ptr = ptr + size + K_ROUND_LARGE
        return ptr

    def _charge(self, delta: int) -> bool:
        """Pages mapped (``delta > 0``, if they fit: ``cuMemCreate``) or unmapped onto an expandable segment."""
        if delta > 0 and not self._fits(delta):
            return False
        self.stats.reserved += delta
        if delta > 0:
            self.stats.segments += 1  # num_device_alloc counts each map_block
        return True

    def _release_available(self, pool: BlockPool, size: int) -> bool:
        """``release_available_cached_blocks``: free oversize cached blocks (only with ``max_split_size``)."""
        split_max = self.conf.max_split_size
        if split_max is None or self.conf.expandable_segments:
            return False
        want = max(size, split_max)
        i = bisect.bisect_left(pool.free, (want, -1))
        if i < len(pool.free):
            self._release(pool, pool.by_key[pool.free[i]])
            return True
        released = 0
        for key in reversed(list(pool.free)):
            b = pool.by_key[key]
            if released >= want or b.size < split_max:
                break
            if not b.is_split:
                released += b.size
                self._release(pool, b)
        return released >= want

    def _release(self, pool: BlockPool, block: Block) -> None:
        pool.remove(block)
        self.stats.reserved -= block.size

    def _release_cached(self) -> bool:
        """``release_cached_blocks`` / ``release_blocks``: every unsplit cached block goes back to the driver, and
        every free block of an expandable segment returns its whole pages (``unmap_block``)."""
        self.stats.retries += 1
        for pool in self.pools.values():
            to_unmap = []
            for key in list(pool.free):
                b = pool.by_key[key]
                if b.expandable:
                    to_unmap.append(b)
                elif not b.is_split:
                    self._release(pool, b)
            if to_unmap:
                from fitcheck.core.caching.expandable import unmap_block  # expandable segments only

            for b in to_unmap:
                unmap_block(pool, b, self._charge)
        return True

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: above threshold x limit, release old unsplit large blocks."""
        assert self.limit is not None
        threshold = int(self.conf.garbage_collection_threshold * self.limit)
        if self.stats.reserved <= threshold:
            return
        target = self.stats.reserved - threshold
        pool = self.pools[False]
        reclaimed = 0
        while reclaimed < target:
            cands = [pool.by_key[k] for k in pool.free if not pool.by_key[k].is_split]
            if not cands:
                return
            age = sum(pool.calls - b.gc_base for b in cands) / len(cands)
            freed = False
            for b in cands:
                if pool.calls - b.gc_base >= age:
                    reclaimed += b.size
                    self._release(pool, b)
                    freed = True
            if not freed:
                return

    def _note(self) -> None:
        s = self.stats
        s.peak_allocated = max(s.peak_allocated, s.allocated)
        s.peak_reserved = max(s.peak_reserved, s.reserved)
        if self._region:
            a, r = s.region_peaks.get(self._region, (0, 0))
            s.region_peaks[self._region] = (max(a, s.allocated), max(r, s.reserved))


Event = tuple[str, int, int]  # ("alloc", handle, nbytes) | ("free", handle, 0) | ("region", 0, 0) named below


def replay(events: Iterable[tuple[str, int, int] | tuple[str, str]], conf: AllocatorConf | None = None,
           capacity: int | None = None) -> AllocatorStats:
    """Replay a sequence of events through the caching allocator.

    Args:
        events: ``("alloc", handle, nbytes)``, ``("free", handle, 0)``, or ``("region", name)``.
        conf: Allocator settings (default: torch's defaults).
        capacity: Device bytes available (None: unlimited).

    Returns:
        The allocator's statistics after the last event.

    Raises:
        OutOfMemory: The sequence does not fit within ``capacity``.
    """
    alloc = CachingAllocator(conf, capacity)
    for ev in events:
        if ev[0] == "region":
            alloc.region(str(ev[1]))
        elif ev[0] == "alloc" and len(ev) == 3:
            alloc.malloc(int(ev[1]), int(ev[2]))
        elif ev[0] == "free":
            alloc.free(int(ev[1]))
        else:
            raise ValueError(f"unknown event {ev!r}")
    return alloc.stats
