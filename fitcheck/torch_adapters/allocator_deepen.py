"""A traced step's allocations and frees at full depth, built from its traces at one and two layer groups.

The caching allocator's gap does not scale with depth (``allocator_replay``: Llama-3.2-1B with checkpointing
leaves 3377 MiB at two layers and 8272 MiB at sixteen), so the replay needs every layer's events; tracing all of
them takes 12-34 s on a CPU. The events of a deeper stack are those of two layer groups with each group's block
repeated: :func:`deepen` aligns the one-group trace with the two-group trace (``difflib``: the second group's
events are insertions, one block per pass over the layers -- forward, checkpoint recompute, backward, optimizer,
``zero_grad``, in every step), repeats each inserted block, and renames the storages each copy allocates and frees
so that a block frees its own layer's tensors, takes its input from the block before it in time and leaves its
output to the block after it. Which layer a block is (forward and parameter order ascend, backward descends)
follows from the region its allocations were made in, or, for blocks that only free, from the layer of what
they free. Checked equal, event for event up to storage renaming, to real deeper traces
(``tests/test_allocator_deepen.py``); where the alignment is not of that shape, :class:`DeepenError`.

Pure Python: no torch import.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Event = tuple[int, int, str]  # (storage serial, +bytes allocated / -bytes freed, region allocated in)


class DeepenError(ValueError):
    """The two traces do not differ by repeated layer blocks: the deeper sequence cannot be built."""


@dataclass(frozen=True)
class _Block:
    """One inserted block of the two-group trace and its twin (the other group's block of the same pass).

    Attributes:
        start: Position of the inserted block in the two-group trace.
        size: Its number of events.
        twin: Block offset -> position of the twin's event at that offset (signature-aligned; boundary events of the
            first or last layer may have none).
        twin_after: Whether the twin comes after the block in time.
        descending: Whether the pass runs the layers from the last to the first (backward).
    """

    start: int
    size: int
    twin: dict[int, int]
    twin_after: bool
    descending: bool

    def layer(self, copy: int | None, depth: int) -> int:
        """The layer group a copy of this block (None: its twin) stands for in a stack ``depth`` groups deep."""
        last = depth - 1 if self.twin_after else 0
        rank = last if copy is None else copy + (0 if self.twin_after else 1)
        return depth - 1 - rank if self.descending else rank


def canonical(events: Sequence[Event]) -> list[Event]:
    """The events with storages renumbered in order of first appearance (equal sequences up to renaming)."""
    ids: dict[int, int] = {}
    return [(ids.setdefault(s, len(ids)), n, tag) for s, n, tag in events]


def deepen(one: Sequence[Event], two: Sequence[Event], groups: int,
           starts: tuple[Sequence[int], Sequence[int]] = ((), ())) -> list[Event]:
    """The events of a stack of ``groups`` layer groups, from the traces of one and two groups.

    Where the two traces do not align as they are, their runs of consecutive frees are put in allocation order
    (:func:`frees_in_allocation_order`) and aligned again. The caching allocator's state after a run of frees does
    not depend on their order (``fitcheck.core.caching``: a freed block merges with its free neighbours, so the
    run leaves each segment's maximal free ranges, and no peak moves while bytes are freed), so the replay is the
    same; QLoRA's end of forward frees bitsandbytes' per-layer tensors in an order that differs with the depth.

    Args:
        one: ``alloc_events`` of the trace at one layer group.
        two: ``alloc_events`` of the same step traced at two layer groups.
        groups: Layer groups of the stack wanted (>= 2).
        starts: ``region_starts`` of the two traces (``TraceResult.region_starts``): an inserted block is cut
            where a region begins and placed inside its region. Without them a LoRA stack fails: its last
            layer's optimizer states are allocated right before ``zero_grad`` frees the first layer's gradients,
            and ``difflib`` sees one insertion across the two passes.

    Returns:
        The deeper trace's events (new serials for the storages of the added groups).

    Raises:
        DeepenError: The two traces do not differ by repeated blocks.
    """
    if groups < 2:
        raise DeepenError(f"groups must be >= 2, got {groups}")
    normal = (frees_in_allocation_order(one, starts[0]), frees_in_allocation_order(two, starts[1]))
    tries = [(one, two, False), (*normal, False), (one, two, True), (*normal, True)]
    for k, (a, b, merge) in enumerate(tries):
        try:
            out = _deepen(a, b, groups, starts[1], merge)
            _check_pairs(one, two, out, groups)
            return out
        except DeepenError:
            if k == len(tries) - 1:
                raise
    raise AssertionError("unreachable")


def deepen_past_first(traced: Callable[[int], tuple[Sequence[Event], Sequence[int]]], groups: int,
                      skip_first: bool = False) -> list[Event]:
    """:func:`deepen` from the traces of one and two layer groups, else, where those do not align, from two and three.

    The first group can hold other tensors than the groups above it: with LoRA on the MLP only, layer 0's
    attention input needs no gradient (the embedding is frozen), so its rotary multiplications save nothing
    (transformers 5.23 ``models/llama/modeling_llama.py`` ``apply_rotary_pos_emb``: ``q * cos``, ``k * cos``
    record ``cos`` / ``sin`` for backward only when ``q`` / ``k`` require grad), while every layer above it, whose
    input already carries the adapters' gradient, saves them. The one-group trace then frees ``cos`` and ``sin`` at
    the end of the forward, a deeper one after layer 1's backward: a deletion, not an insertion, and
    :func:`deepen` refuses (the peft MetaMathQA row Llama-3.2-3B LoRA r10 on up/gate/down fell back to the
    two-group gap, +10.0 % against +4.9 % from the formula). From two groups up, each added group is like the
    one below it: the first group stays in the part the two traces share, and the stack is the two-group trace
    deepened by ``groups - 2`` blocks (``tests/test_allocator_deepen.py``: equal, event for event up to the order
    of each run of frees, to the real four-layer trace).

    Args:
        traced: Layer groups -> ``(alloc_events, region_starts)`` of the step traced at that depth (called for 1
            and 2, and for 3 only where those two do not deepen).
        groups: Layer groups of the stack wanted (>= 2).
        skip_first: Deepen from two and three groups without trying one and two (the first group reads another
            dtype than those above it: ``tracer_depth.residual_promoted``).

    Raises:
        DeepenError: Neither pair deepens (or only one and two groups were possible).
    """
    if not skip_first:
        (one, one_starts), (two, two_starts) = traced(1), traced(2)
        try:
            return deepen(one, two, groups, (one_starts, two_starts))
        except DeepenError:
            if groups < 3:
                raise
    elif groups < 3:
        raise DeepenError(f"{groups} layer groups: no two- and three-group traces to deepen from")
    else:
        two, two_starts = traced(2)
    three, three_starts = traced(3)
    if groups == 3:
        return list(three)
    return deepen(two, three, groups - 1, (two_starts, three_starts))


def live_at_end(events: Sequence[Event]) -> tuple[int, int, int]:
    """(storages live at the end, their bytes, frees of a storage not live or of another size)."""
    live: dict[int, int] = {}
    unpaired = 0
    for s, n, _ in events:
        if n > 0:
            live[s] = n
        elif live.get(s) == -n:
            del live[s]
        else:
            unpaired += 1
    return len(live), sum(live.values()), unpaired


def _check_pairs(one: Sequence[Event], two: Sequence[Event], out: Sequence[Event], groups: int) -> None:
    """The built sequence frees what it allocates: every free of a storage it allocated with the same size (where
    the two-group trace's frees all pair), and what it leaves live at the end grows by the same storages per added
    group as from one group to two.

    ``difflib`` aligns a run of frees of equal-sized storages by position, not by storage: where the run mixes
    layers in an order that differs with the depth, the built copies free another layer's storage (twice) and
    leave one of their own live. The autocast cache is such a run: ``torch.amp.autocast.__exit__`` (torch 2.13
    ``torch/amp/autocast_mode.py``) calls ``torch.clear_autocast_cache()``, which clears ``cached_casts``, a
    ``ska::flat_hash_map`` keyed by ``TensorImpl*`` (pytorch ``aten/src/ATen/autocast_mode.cpp``), so the casts
    of fp32 LoRA weights are freed in pointer-hash order. Built from that order, Qwen-7B's LoRA step (SWIFT-1,
    checkpointed, 32 layers) left one 64 KiB cast per added layer live every step: 3.5-5.6 MiB a step that
    ``replay_whole_lengths`` never freed. Raising here sends :func:`deepen` on to the free runs in allocation
    order, where each layer's frees form one block.
    """
    n1, b1, _ = live_at_end(one)
    n2, b2, bad2 = live_at_end(two)
    n, b, bad = live_at_end(out)
    if bad > bad2 * (groups - 1):
        raise DeepenError(f"the built sequence frees {bad} storages it does not hold")
    if (n, b) != (n2 + (groups - 2) * (n2 - n1), b2 + (groups - 2) * (b2 - b1)):
        raise DeepenError(f"the built sequence leaves {n} storages ({b} bytes) live, not what the traces grow by")


def _inserts(one: Sequence[Event], sig: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(start, end) in the two-group trace of each block ``difflib`` finds inserted."""
    ops = difflib.SequenceMatcher(None, [(n, tag) for _, n, tag in one], sig, autojunk=False).get_opcodes()
    if any(op not in ("equal", "insert") for op, *_ in ops):
        raise DeepenError("the two-group trace is not the one-group trace with blocks inserted")
    return [(a, b) for op, _i1, _i2, a, b in ops if op == "insert"]


def _merged(spans: list[tuple[int, int]], sig: list[tuple[int, str]], cuts: list[int]) -> list[tuple[int, int]]:
    """Two insertions of one region with a short equal run between them, as one where that run's events also end
    (or start) the pair.

    A non-fused AdamW frees a parameter's ``denom`` while it steps the next parameter, so the first parameter of
    layer 1 frees layer 0's last ``denom``; ``difflib`` may match that free inside the layer's block and cut the
    block in two around it.
    """
    out = list(spans)
    k = 0
    while k + 1 < len(out):
        (a1, b1), (a2, b2) = out[k], out[k + 1]
        e = a2 - b1
        same_region = bisect.bisect_right(cuts, a1) == bisect.bisect_right(cuts, b2 - 1)
        if same_region and e <= _MERGE_GAP and sig[b2 - e:b2] == sig[b1:a2]:
            out[k:k + 2] = [(a1, b2 - e)]
        elif same_region and e <= _MERGE_GAP and sig[a1:a1 + e] == sig[b1:a2]:
            out[k:k + 2] = [(a1 + e, b2)]
        else:
            k += 1
    return out


_MERGE_GAP = 4  # events of an equal run _inserts closes (one parameter's steps: AdamW's four events)


def frees_in_allocation_order(events: Sequence[Event], starts: Sequence[int] = ()) -> list[Event]:
    """The events with each run of consecutive frees (inside one region) sorted by serial: allocation order."""
    cuts = set(starts)
    out: list[Event] = []
    run: list[Event] = []
    for p, ev in enumerate(events):
        if run and (ev[1] > 0 or p in cuts):
            out += sorted(run)
            run = []
        (run if ev[1] <= 0 else out).append(ev)
    return out + sorted(run)


def _deepen(one: Sequence[Event], two: Sequence[Event], groups: int, starts: Sequence[int],
            merge: bool) -> list[Event]:
    sig = [(n, tag) for _, n, tag in two]
    inserts = _inserts(one, sig)
    region: list[str] = []
    current = "setup"
    for _, n, tag in two:
        current = tag if n > 0 else current
        region.append(current)
    cuts = sorted({0, len(two), *starts})
    spans: list[tuple[int, int]] = []
    for a, b in inserts:  # cut where a region begins
        spans += itertools.pairwise([a, *(c for c in cuts if a < c < b), b])
    if merge:
        spans = _merged(spans, sig, cuts)
    spans = [part for a, b in spans for part in _one_pass(sig, a, b)]
    blocks = []
    for a, b in spans:
        k = bisect.bisect_right(cuts, a)
        blocks.append(_place(sig, a, b - a, region, (cuts[k - 1], cuts[k])))
    role = _roles(blocks)
    alloc_at = {s: p for p, (s, n, _t) in enumerate(two) if n > 0}
    blocks = _free_only_directions(two, blocks, role, alloc_at)
    return _Builder(two, blocks, role, alloc_at, groups).build()


def _one_pass(sig: list[tuple[int, str]], a: int, b: int) -> list[tuple[int, int]]:
    """An inserted block cut in two where it holds the end of one pass and the start of the next.

    Trainer's optimizer has two parameter groups (weight decay, then norms and biases without), so at two layers
    its states are [decay 0][decay 1][no-decay 0][no-decay 1] and ``difflib`` inserts [decay 1][no-decay 0] into
    the one-layer sequence as one block. Such a block has no equal block next to it; its head equals the events
    just before it and its tail the events just after: it is cut there. A block with an equal neighbour is one
    layer's and is kept whole."""
    n = b - a
    block = sig[a:b]
    if sig[max(0, a - n):a] == block or sig[b:b + n] == block:
        return [(a, b)]
    for k in range(1, min(n, a + 1)):
        if sig[a - k:a] == block[:k] and sig[b:b + n - k] == block[k:]:
            return [(a, a + k), (a + k, b)]
    return [(a, b)]


def _place(sig: list[tuple[int, str]], a: int, n: int, region: list[str], bounds: tuple[int, int]) -> _Block:
    """The inserted block among its equivalent placements whose twin aligns best (an insertion into a run of
    repeated blocks can be placed at any rotation; the one that lines up with the neighbouring block is the
    layer's). Placements and their twins stay inside ``bounds``, the region the block was inserted in.

    The first placement with the most matched events wins. Two shortcuts leave that choice unchanged: a placement
    whose events and window share no more signatures (as multisets) than the best so far matched cannot match
    more, so ``difflib`` is not run for it; a placement whose every event matched cannot be beaten, so the search
    stops there (``tests/test_allocator_deepen.py`` checks the blocks against the exhaustive search)."""
    slack = max(4, n // 8)
    lo = hi = a
    while lo > bounds[0] and sig[lo - 1] == sig[lo - 1 + n]:
        lo -= 1
    while hi + n < bounds[1] and sig[hi] == sig[hi + n]:
        hi += 1
    best: tuple[int, bool, dict[int, int]] | None = None
    for start in range(lo, hi + 1):
        end = start + n
        block = sig[start:end]
        have = Counter(block)
        for after, (w0, w1) in ((True, (end, min(bounds[1], end + n + slack))),
                                (False, (max(bounds[0], start - n - slack), start))):
            if best is not None and _shared(have, sig[w0:w1]) <= len(best[2]):
                continue
            sm = difflib.SequenceMatcher(None, block, sig[w0:w1], autojunk=False)
            pos = {i + t: w0 + j + t for i, j, size in sm.get_matching_blocks() for t in range(size)}
            if best is None or len(pos) > len(best[2]):
                best = (start, after, pos)
        if best is not None and len(best[2]) == n:
            break
    assert best is not None
    start, after, twin = best
    return _Block(start, n, twin, after, region[start].startswith("backward"))


def _shared(have: Counter[tuple[int, str]], window: list[tuple[int, str]]) -> int:
    """How many events of a block (``have``: its signatures counted) can match a window: the multiset overlap."""
    return sum(min(k, have[s]) for s, k in Counter(window).items() if s in have)


def _roles(blocks: list[_Block]) -> dict[int, tuple[int, int, bool]]:
    """Position -> (block index, offset, in the twin) for every event of an inserted block or its twin."""
    role: dict[int, tuple[int, int, bool]] = {}
    for k, blk in enumerate(blocks):
        for o in range(blk.size):
            for p, in_twin in ((blk.start + o, False), (blk.twin.get(o), True)):
                if p is None:
                    continue
                if role.get(p, (k, o, in_twin)) != (k, o, in_twin):
                    raise DeepenError(f"event {p} belongs to two blocks")
                role[p] = (k, o, in_twin)
    return role


def _free_only_directions(two: Sequence[Event], blocks: list[_Block], role: dict[int, tuple[int, int, bool]],
                          alloc_at: dict[int, int]) -> list[_Block]:
    """Blocks that only free (``zero_grad``, the end of backward) take their layer from what they free."""
    out: list[_Block] = []
    for k, blk in enumerate(blocks):
        if any(two[blk.start + o][1] > 0 for o in range(blk.size)):
            out.append(blk)
            continue
        votes = []
        for o in range(blk.size):
            q = alloc_at.get(two[blk.start + o][0])
            if q is not None and q in role and role[q][0] < k:
                kq, _oq, in_twin = role[q]
                votes.append(out[kq].layer(None if in_twin else 0, 2))
        if votes:
            mine = max(set(votes), key=votes.count)
            blk = _Block(blk.start, blk.size, blk.twin, blk.twin_after, (mine == 1) == blk.twin_after)
        out.append(blk)
    return out


class _Builder:
    """Emits the deeper sequence: each inserted block repeated, every free resolved to the right copy."""

    def __init__(self, two: Sequence[Event], blocks: list[_Block], role: dict[int, tuple[int, int, bool]],
                 alloc_at: dict[int, int], groups: int) -> None:
        self.two, self.blocks, self.role, self.alloc_at, self.groups = two, blocks, role, alloc_at, groups
        self.top = max((s for s, _, _ in two), default=0) + 1
        self.fresh: dict[tuple[int, int, int], int] = {}

    def build(self) -> list[Event]:
        out: list[Event] = []
        starts = {blk.start: k for k, blk in enumerate(self.blocks)}
        p = 0
        while p < len(self.two):
            if p in starts:
                k = starts[p]
                blk = self.blocks[k]
                for copy in range(self.groups - 1):
                    for o in range(blk.size):
                        out.append(self._emit(blk.start + o, blk.layer(copy, self.groups), copy))
                p = blk.start + blk.size
                continue
            r = self.role.get(p)
            layer = self.blocks[r[0]].layer(None, self.groups) if r is not None and r[2] else None
            out.append(self._emit(p, layer, None))
            p += 1
        return out

    def _serial(self, k: int, offset: int, copy: int | None) -> int:
        blk = self.blocks[k]
        if copy is None:
            if offset not in blk.twin:
                raise DeepenError("a freed storage of the twin block has no aligned allocation")
            return self.two[blk.twin[offset]][0]
        if copy == 0:
            return self.two[blk.start + offset][0]
        key = (k, offset, copy)
        if key not in self.fresh:
            self.fresh[key] = self.top
            self.top += 1
        return self.fresh[key]

    def _copy_of(self, k: int, layer: int) -> int | None:
        blk = self.blocks[k]
        for copy in range(self.groups - 1):
            if blk.layer(copy, self.groups) == layer:
                return copy
        if blk.layer(None, self.groups) == layer:
            return None
        raise DeepenError(f"block {k} has no layer {layer}")

    def _two_layer(self, p: int) -> int | None:
        r = self.role.get(p)
        return None if r is None else self.blocks[r[0]].layer(None if r[2] else 0, 2)

    def _emit(self, p: int, layer: int | None, copy: int | None) -> Event:
        s, n, tag = self.two[p]
        r = self.role.get(p)
        if n > 0:
            return (s if r is None else self._serial(r[0], r[1], copy if not r[2] else None), n, tag)
        q = self.alloc_at.get(s)
        if r is None or layer is None:  # outside the blocks: the first group's, or the last's
            if q is None or q not in self.role:
                return (s, n, tag)
            kq, oq, _ = self.role[q]
            return (self._serial(kq, oq, self._copy_of(kq, 0 if self._two_layer(q) == 0 else self.groups - 1)),
                    n, tag)
        k, o, in_twin = r
        if in_twin and q is not None and q not in self.role:
            # the twin is emitted once, and so is a storage allocated in no block (an unaligned event of the twin or
            # one outside the blocks): the twin frees it itself. Mapped through the block's aligned event instead, it
            # freed that event's neighbour: Llama-2-7B's LoRA backward (two 32 MiB gradients allocated two events
            # apart, freed in reverse order) freed one twice and kept the other, 290 MiB every step at 2048 tokens.
            return (s, n, tag)
        other = self.blocks[k].start + o if in_twin else self.blocks[k].twin.get(o)
        cands = [(q, self._two_layer(p))]
        if other is not None:
            cands.append((self.alloc_at.get(self.two[other][0]), self._two_layer(other)))
        for qq, lb in cands:  # a storage of a layer: the same relative layer as in the two-group trace
            if qq is not None and qq in self.role and lb is not None:
                lq = self._two_layer(qq)
                assert lq is not None
                target = layer + lq - lb
                if 0 <= target < self.groups:
                    kq, oq, _ = self.role[qq]
                    return (self._serial(kq, oq, self._copy_of(kq, target)), n, tag)
        for qq, _lb in cands:  # the first or last layer's input or output: outside the stack
            if qq is None or qq not in self.role:
                return (self.two[qq][0] if qq is not None else s, n, tag)
        raise DeepenError(f"the storage freed at event {p} has no layer in the deeper stack")
