"""The caching-allocator replay against cases derived by hand from torch's ``c10/cuda/CUDACachingAllocator.cpp``
and ``c10/core/AllocatorConfig.cpp`` (pytorch/pytorch snapshot read for torch 2.13). Each case names the rule.

Before this module, fitcheck's reserved memory was ``allocated + 11 % of the step's transient tensors`` for every
sequence: none of these cases could be told apart (``core/allocator.py`` ``reserved_bytes``).
"""

from __future__ import annotations

import pytest

from fitcheck.core.caching import (
    AllocatorConf,
    AllocConfError,
    CachingAllocator,
    OutOfMemory,
    allocation_size,
    parse_alloc_conf,
    replay,
    round_size,
)

MIB = 1024**2
DEFAULT = AllocatorConf()


def test_round_size_512_bytes() -> None:
    # round_size: "if (size < kMinBlockSize) return kMinBlockSize; else kMinBlockSize * ceil(size / 512)"
    assert round_size(1, DEFAULT) == 512
    assert round_size(513, DEFAULT) == 1024
    assert round_size(MIB + 1, DEFAULT) == MIB + 512


def test_segment_sizes() -> None:
    # get_allocation_size: <= kSmallSize -> kSmallBuffer; < kMinLargeAlloc -> kLargeBuffer; else round to 2 MiB
    assert allocation_size(MIB) == 2 * MIB
    assert allocation_size(MIB + 512) == 20 * MIB
    assert allocation_size(10 * MIB - 512) == 20 * MIB
    assert allocation_size(10 * MIB) == 10 * MIB
    assert allocation_size(11 * MIB + 512) == 12 * MIB


def test_small_pool_packs_requests_into_one_2mib_segment() -> None:
    # small requests (<= 1 MiB) share kSmallBuffer segments; a split leaves >= kMinBlockSize
    s = replay([("alloc", 1, 1000), ("alloc", 2, 1000), ("alloc", 3, 500_000)])
    assert (s.allocated, s.reserved, s.segments) == (1024 + 1024 + 500_224, 2 * MIB, 1)


def test_mid_size_requests_share_a_20mib_segment() -> None:
    # 1-10 MiB -> a 20 MiB segment, split since more than kSmallSize remains (should_split, large pool)
    s = replay([("alloc", 1, 3 * MIB), ("alloc", 2, 5 * MIB), ("alloc", 3, 9 * MIB)])
    assert (s.allocated, s.reserved, s.segments) == (17 * MIB, 20 * MIB, 1)


def test_unsplit_remainder_counts_as_allocated() -> None:
    # >= 10 MiB: segment rounded to 2 MiB; the remainder (<= kSmallSize) is not split off, and
    # alloc_found_block counts block->size: max_memory_allocated sees 12 MiB for an 11 MiB + 1 B request
    s = replay([("alloc", 1, 11 * MIB + 1)])
    assert (s.allocated, s.reserved) == (12 * MIB, 12 * MIB)


def test_best_fit_reuse_and_fragmentation() -> None:
    # a freed 12 MiB block serves 8 MiB (split: 4 MiB > kSmallSize remains); a 6 MiB request does not fit the
    # 4 MiB remainder and takes a new 20 MiB segment: 32 MiB reserved for 14 MiB allocated
    s = replay([("alloc", 1, 12 * MIB), ("free", 1, 0), ("alloc", 2, 8 * MIB), ("alloc", 3, 6 * MIB)])
    assert (s.allocated, s.reserved, s.peak_reserved) == (14 * MIB, 32 * MIB, 32 * MIB)


def test_growing_requests_leave_freed_segments_behind() -> None:
    # a step whose tensors grow (longer sequences): each freed segment is too small for the next request
    events: list[tuple[str, int, int]] = []
    for i, mb in enumerate((12, 14, 16)):
        events += [("alloc", i, mb * MIB), ("free", i, 0)]
    s = replay(events)
    assert (s.allocated, s.reserved, s.peak_allocated) == (0, 42 * MIB, 16 * MIB)


def test_expandable_segments_grow_in_place() -> None:
    # expandable_segments: the 12 MiB block maps one 20 MiB page, split at >= kMinBlockSize; freed, it merges
    # with its remainder and serves the 14 MiB and 16 MiB requests: 20 MiB reserved instead of 42 MiB
    events: list[tuple[str, int, int]] = []
    for i, mb in enumerate((12, 14, 16)):
        events += [("alloc", i, mb * MIB), ("free", i, 0)]
    s = replay(events, parse_alloc_conf("expandable_segments:True"))
    assert (s.reserved, s.peak_allocated) == (20 * MIB, 16 * MIB)


def test_expandable_segment_maps_only_the_missing_pages() -> None:
    # a free tail block merges with newly mapped pages (map_block + try_merge_blocks): 3 MiB then 18 MiB need
    # 20 + 20 MiB of pages, not a second segment of 18 MiB
    s = replay([("alloc", 1, 3 * MIB), ("alloc", 2, 18 * MIB)], parse_alloc_conf("expandable_segments:True"))
    assert (s.allocated, s.reserved) == (21 * MIB, 40 * MIB)


def test_max_split_size_keeps_oversize_blocks_whole() -> None:
    conf = parse_alloc_conf("max_split_size_mb:20")
    # get_free_block: a request below max_split_size never takes an oversize cached block
    s = replay([("alloc", 1, 40 * MIB), ("free", 1, 0), ("alloc", 2, 8 * MIB)], conf)
    assert s.reserved == 60 * MIB
    # an oversize request takes an oversize block within max_non_split_rounding (kLargeBuffer), unsplit
    s = replay([("alloc", 1, 40 * MIB), ("free", 1, 0), ("alloc", 2, 21 * MIB)], conf)
    assert (s.allocated, s.reserved) == (40 * MIB, 40 * MIB)
    s = replay([("alloc", 1, 40 * MIB), ("free", 1, 0), ("alloc", 2, 20 * MIB)], conf)
    assert (s.allocated, s.reserved) == (20 * MIB, 60 * MIB)
    # without max_split_size the same 20 MiB request splits the 40 MiB block
    s = replay([("alloc", 1, 40 * MIB), ("free", 1, 0), ("alloc", 2, 20 * MIB)])
    assert (s.allocated, s.reserved) == (20 * MIB, 40 * MIB)


EXPANDABLE = parse_alloc_conf("expandable_segments:True")


def test_expandable_release_unmaps_free_pages_anywhere() -> None:
    # release_blocks -> unmap_block on every free block of the segment: a free hole between live blocks returns
    # its whole pages (the old replay unmapped only free pages at the segment's end: 80 MiB stayed reserved)
    alloc = CachingAllocator(EXPANDABLE)
    alloc.malloc(1, 40 * MIB)
    alloc.malloc(2, 40 * MIB)
    alloc.free(1)
    alloc.empty_cache()
    assert (alloc.stats.reserved, alloc.stats.retries) == (40 * MIB, 0)  # emptyCache is not an alloc retry
    # find_expandable_block: the lowest-addressed unmapped range with room is mapped again before the end
    alloc.malloc(3, 30 * MIB)
    alloc.malloc(4, 10 * MIB)  # the rest of the 2 remapped 20 MiB pages (should_split: any remainder >= 512 B)
    assert alloc.stats.reserved == 80 * MIB


def _with_unmapped_hole() -> CachingAllocator:
    """Live 0-15 and 40-60 MiB of one expandable segment, a freed 15-40 MiB block released (``emptyCache``)."""
    alloc = CachingAllocator(EXPANDABLE)
    alloc.malloc(1, 15 * MIB)
    alloc.malloc(2, 25 * MIB)
    alloc.malloc(3, 20 * MIB)
    alloc.free(2)
    alloc.empty_cache()
    return alloc


def test_expandable_unmap_keeps_pages_shared_with_live_blocks() -> None:
    # ExpandableSegment::unmap rounds in: of a free 25 MiB block from 15 MiB to 40 MiB only the page 20-40 MiB
    # goes; 15-20 MiB stays mapped (its page holds the live 15 MiB block)
    alloc = _with_unmapped_hole()
    assert alloc.stats.reserved == 40 * MIB
    # a 5 MiB request is served by the mapped 5 MiB left before the hole: nothing mapped
    alloc.malloc(4, 5 * MIB)
    assert alloc.stats.reserved == 40 * MIB


def test_expandable_allocation_maps_across_a_hole() -> None:
    # try_allocate_expandable_block: a free block, the unmapped hole after it and the free space beyond are one
    # candidate when together they hold the request; only the hole's pages are mapped
    alloc = _with_unmapped_hole()  # 15-20 MiB free and mapped, 20-40 MiB unmapped
    alloc.malloc(5, 25 * MIB)  # 15-40 MiB: maps the one page back, not two pages at the end
    assert (alloc.stats.reserved, alloc.stats.allocated) == (60 * MIB, 60 * MIB)


def test_oversize_cached_blocks() -> None:
    # with max_split_size a freed oversize block is cached whole and serves no smaller request (get_free_block);
    # release_available_cached_blocks returns it when a cudaMalloc fails, without counting a retry
    alloc = CachingAllocator(parse_alloc_conf("max_split_size_mb:128"), capacity=400 * MIB)
    alloc.malloc(1, 300 * MIB)
    alloc.free(1)
    assert alloc.oversize_cached_bytes() == 300 * MIB
    alloc.malloc(2, 100 * MIB)
    assert alloc.stats.reserved == 400 * MIB
    alloc.malloc(3, 150 * MIB)  # 300 >= 150 + kLargeBuffer: not taken; no room: the oversize block is released
    assert (alloc.stats.reserved, alloc.stats.retries, alloc.oversize_cached_bytes()) == (250 * MIB, 0, 0)
    assert CachingAllocator().oversize_cached_bytes() == 0


def test_release_cached_blocks_before_out_of_memory() -> None:
    # malloc: alloc_block fails at the capacity -> release_cached_blocks (unsplit cached blocks) -> retry
    alloc = CachingAllocator(capacity=40 * MIB)
    alloc.malloc(1, 24 * MIB)
    alloc.free(1)
    alloc.malloc(2, 30 * MIB)
    assert (alloc.stats.reserved, alloc.stats.retries, alloc.stats.peak_reserved) == (30 * MIB, 1, 30 * MIB)
    with pytest.raises(OutOfMemory):
        alloc.malloc(3, 12 * MIB)


def test_garbage_collection_needs_a_memory_fraction() -> None:
    # garbage_collect_cached_blocks runs only with set_fraction; above threshold x allowed it releases unsplit
    # cached large blocks at least as old as the average, without counting a retry
    conf = parse_alloc_conf("garbage_collection_threshold:0.5")
    alloc = CachingAllocator(conf, memory_fraction_limit=100 * MIB)
    for handle, mb in ((1, 40), (2, 60)):
        alloc.malloc(handle, mb * MIB)
        alloc.free(handle)
    alloc.malloc(3, 70 * MIB)
    assert (alloc.stats.reserved, alloc.stats.retries) == (70 * MIB, 0)


def test_roundup_power2_divisions() -> None:
    # round_size with divisions: 1.1 MiB in the [1, 2) MiB interval with 4 divisions -> 1.25 MiB
    conf = parse_alloc_conf("roundup_power2_divisions:4")
    assert round_size(int(1.1 * MIB), conf) == int(1.25 * MIB)
    assert round_size(MIB, conf) == MIB  # a power of two stays
    assert round_size(1000, conf) == 1024  # size <= 512 x divisions: 512 B rounding


def test_roundup_power2_divisions_per_interval() -> None:
    # parseRoundUpPower2Divisions: keys are MiB; the first fills every interval below it; '>' fills from the last
    # key's interval on (overwriting it)
    conf = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert conf.roundup_power2_divisions == (1,) * 9 + (4,) * 7


@pytest.mark.parametrize(("text", "words"), [
    ("max_split_size_mb:10", "too small"),
    ("garbage_collection_threshold:1.5", "(0.0, 1.0)"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("expandable_segments:true", "True/False"),
    ("expandable_segment:True", "unrecognized"),
])
def test_refused_settings(text: str, words: str) -> None:
    with pytest.raises(AllocConfError, match=r".*" + words.replace("(", r"\(").replace(")", r"\)")):
        parse_alloc_conf(text)


def test_defaults_and_combined_settings() -> None:
    assert parse_alloc_conf("") == AllocatorConf()
    conf = parse_alloc_conf("expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6")
    assert (conf.expandable_segments, conf.max_split_size, conf.garbage_collection_threshold) == (
        True, 128 * MIB, 0.6)


def test_region_peaks() -> None:
    s = replay([("region", "load"), ("alloc", 1, 12 * MIB), ("region", "step"), ("alloc", 2, 2 * MIB),
                ("free", 2, 0)])
    assert s.region_peaks["load"] == (12 * MIB, 12 * MIB)
    assert s.region_peaks["step"] == (14 * MIB, 32 * MIB)
