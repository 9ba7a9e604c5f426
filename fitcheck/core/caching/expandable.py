"""Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), as torch maps and unmaps them.

torch ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch snapshot 001074d, the source read for torch 2.13;
torch 2.11, which the H200 ran, has the same functions), Note [Expandable Segments] and:

* ``ExpandableSegment``: one virtual address range per pool (and stream), ``1 1/8`` of the GPU's memory, backed by
  physical pages of ``segment_size`` -- 2 MiB (``kSmallBuffer``) for the small pool, 20 MiB (``kLargeBuffer``) for
  the large one. ``map`` maps the pages covering ``[ptr, ptr + size)`` (``segmentLeft`` .. ``segmentRight``: whole
  pages, rounded out); ``unmap`` unmaps only the pages entirely inside a range (rounded in).
* ``find_expandable_block``: the lowest-addressed unmapped range that, together with the free block just before
  it and the free and unmapped blocks after it, has ``size`` bytes of address space; a new segment when none has.
* ``try_allocate_expandable_block``: maps that candidate (``map_block`` of ``min(candidate size, size)``), then maps
  the next unmapped ranges until the candidate, merged with them, holds ``size`` bytes; a page that cannot be
  created (out of memory) fails the allocation, the pages already mapped stay.
* ``map_block``: the mapped part becomes a free block merged with its free neighbours (``try_merge_blocks``); what
  is left of the unmapped range stays unmapped after it. ``reserved_bytes`` grows by the pages mapped.
* ``release_blocks`` (``release_cached_blocks``: ``emptyCache``, or a ``cudaMalloc`` that failed) ``unmap_block``s
  every free block of an expandable segment -- wherever it is, not only at the end: its whole pages go back, the
  parts of pages it shares with live blocks stay mapped as free blocks before and after the new unmapped range.

Blocks inside a segment are split for any request that leaves at least 512 B (``should_split``) and merged when
freed (``free_block``), as in ordinary segments; ``get_free_block`` counts a free block followed by unmapped
space at the size it can grow to (``expandable_size``). Those two live in :mod:`.simulator`.

Pure: no torch, no environment.
"""

from __future__ import annotations

from collections.abc import Callable

from fitcheck.core.caching.blocks import Block, BlockPool

K_SMALL_PAGE = 2 * 1024**2  # kSmallBuffer: the small pool's segment_size
K_LARGE_PAGE = 20 * 1024**2  # kLargeBuffer: the large pool's segment_size
ADDRESS_SPACE = K_LARGE_PAGE << 30  # far beyond any GPU's 1 1/8 x memory: one segment per pool is enough

Charge = Callable[[int], bool]  # reserve (+bytes) or return (-bytes) device memory; False: it does not fit


def page_size(pool: BlockPool) -> int:
    """The segment's page (``segment_size``): 2 MiB for the small pool, 20 MiB for the large one."""
    return K_SMALL_PAGE if pool.small else K_LARGE_PAGE


def _allocatable(b: Block | None) -> bool:
    return b is not None and not b.allocated


def find_expandable_block(pool: BlockPool, size: int, new_segment: Callable[[int], int]) -> Block:
    """``find_expandable_block``: the lowest address with ``size`` bytes of free and unmapped space.

    Args:
        pool: The pool.
        size: Bytes needed.
        new_segment: Gives the (page-aligned) address of a new segment of the size asked.

    Returns:
        The candidate: an unmapped range, or the free block just before one.
    """
    for ptr in pool.unmapped:
        c = pool.unmapped_at[ptr]
        if _allocatable(c.prev):
            assert c.prev is not None
            c = c.prev
        have = 0
        walk: Block | None = c
        while have < size and walk is not None and _allocatable(walk):
            have += walk.size
            walk = walk.next
        if have >= size:
            return c
    seg = Block(new_segment(ADDRESS_SPACE), ADDRESS_SPACE, pool.small, mapped=False, expandable=True)
    pool.insert_unmapped(seg)
    return seg


def map_block(pool: BlockPool, to_map: Block, size: int, charge: Charge) -> bool:
    """``map_block``: map the pages covering the first ``size`` bytes of an unmapped range.

    Returns:
        False when the pages do not fit (nothing changes).
    """
    page = page_size(pool)
    mapped = min(-(-size // page) * page, to_map.size)
    if not charge(mapped):
        return False
    pool.remove_unmapped(to_map)
    to_map.mapped = True
    if mapped < to_map.size:
        rest = Block(to_map.ptr + mapped, to_map.size - mapped, pool.small, mapped=False, expandable=True)
        rest.splice(to_map, to_map.next)
        pool.insert_unmapped(rest)
        to_map.size = mapped
    pool.merge(to_map, to_map.prev)
    pool.merge(to_map, to_map.next)
    pool.insert(to_map)
    return True


def try_allocate_expandable_block(pool: BlockPool, size: int, charge: Charge,
                                  new_segment: Callable[[int], int]) -> Block | None:
    """``try_allocate_expandable_block``: a free block of at least ``size`` bytes, mapping pages as needed.

    Returns:
        The block, out of the pool's free set (the caller splits it), or None when a page does not fit.
    """
    candidate = find_expandable_block(pool, size, new_segment)
    if not candidate.mapped and not map_block(pool, candidate, min(candidate.size, size), charge):
        return None
    while candidate.size < size:
        following = candidate.next
        assert following is not None and not following.mapped  # free -> unmapped -> *
        if not map_block(pool, following, min(size - candidate.size, following.size), charge):
            return None
        candidate = following
    pool.remove(candidate)
    return candidate


def unmap_block(pool: BlockPool, block: Block, charge: Charge) -> None:
    """``unmap_block``: return the whole pages inside a free block; the rest stays mapped as free blocks."""
    page = page_size(pool)
    begin = -(-block.ptr // page) * page
    end = (block.ptr + block.size) // page * page
    if begin >= end:
        return
    pool.remove(block)
    if begin > block.ptr:
        before = Block(block.ptr, begin - block.ptr, pool.small, expandable=True)
        before.splice(block.prev, block)
        pool.insert(before)
    if block.ptr + block.size > end:
        after = Block(end, block.ptr + block.size - end, pool.small, expandable=True)
        after.splice(block, block.next)
        pool.insert(after)
    block.ptr, block.size, block.mapped = begin, end - begin, False
    pool.merge(block, block.prev)
    pool.merge(block, block.next)
    pool.insert_unmapped(block)
    charge(-(end - begin))
