"""The caching allocator's blocks and pools (torch ``c10/cuda/CUDACachingAllocator.cpp`` ``Block``, ``BlockPool``).

A block is a range of a segment: allocated, cached free, or (in an expandable segment) an address range with no
physical pages behind it. Blocks of one segment are linked by ``prev`` / ``next`` (``Block::splice``). A pool keeps
its cached free mapped blocks ordered by (size, address) (``BlockComparatorSize``: best fit is a ``lower_bound``)
and its unmapped ranges ordered by address (``BlockPool::unmapped``, ``BlockComparatorAddress``).

Pure: no torch, no environment.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(eq=False)
class Block:
    """One block (``Block``): ``mapped`` is False only for an expandable segment's range without pages."""

    ptr: int
    size: int
    small: bool
    allocated: bool = False
    mapped: bool = True
    expandable: bool = False
    prev: Block | None = None
    next: Block | None = None
    gc_base: int = 0

    @property
    def is_split(self) -> bool:
        """``Block::is_split``: the block shares its segment with others."""
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int]:
        """The pool's order: size, then address."""
        return (self.size, self.ptr)

    def splice(self, before: Block | None, after: Block | None) -> None:
        """``Block::splice``: link this block between ``before`` and ``after``."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


@dataclass
class BlockPool:
    """``BlockPool``: the small (<= 1 MiB requests) or large pool's cached blocks.

    Attributes:
        small: Whether this is the small pool.
        free: Cached free mapped blocks as (size, ptr), sorted.
        by_key: The block of each (size, ptr).
        calls: ``get_free_blocks_call_count`` (garbage collection's clock).
        unmapped: Addresses of the expandable segments' unmapped ranges, sorted.
        unmapped_at: The block at each of those addresses.
    """

    small: bool
    free: list[tuple[int, int]] = field(default_factory=list)
    by_key: dict[tuple[int, int], Block] = field(default_factory=dict)
    calls: int = 0
    unmapped: list[int] = field(default_factory=list)
    unmapped_at: dict[int, Block] = field(default_factory=dict)

    def insert(self, b: Block) -> None:
        """``insert_into_blocks``: cache a free mapped block (its garbage-collection age starts now)."""
        b.gc_base = self.calls
        bisect.insort(self.free, b.key())
        self.by_key[b.key()] = b

    def remove(self, b: Block) -> None:
        """``blocks.erase``."""
        k = b.key()
        del self.free[bisect.bisect_left(self.free, k)]
        del self.by_key[k]

    def insert_unmapped(self, b: Block) -> None:
        """``unmapped.insert``."""
        bisect.insort(self.unmapped, b.ptr)
        self.unmapped_at[b.ptr] = b

    def remove_unmapped(self, b: Block) -> None:
        """``unmapped.erase``."""
        del self.unmapped[bisect.bisect_left(self.unmapped, b.ptr)]
        del self.unmapped_at[b.ptr]

    def merge(self, dst: Block, src: Block | None) -> int:
        """``try_merge_blocks``: ``dst`` takes over a free neighbour in the same mapped state; returns its size.

        ``dst`` must not be in the pool's sets (its key changes); ``src`` leaves them.
        """
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if dst.prev is src:
            dst.ptr, dst.prev = src.ptr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        if src.mapped:
            self.remove(src)
        else:
            self.remove_unmapped(src)
        dst.size += src.size
        return src.size
