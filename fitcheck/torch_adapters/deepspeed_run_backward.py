"""One backward's gradients as DeepSpeed 0.19.8's engine takes them, and the writer of the rewritten events
(``deepspeed_run_events``, whose module docstring cites each piece).

Pure Python: no torch import.
"""

from __future__ import annotations

from fitcheck.torch_adapters.deepspeed_run_plan import DeepSpeedPlan

Event = tuple[int, int, str]  # (storage serial, +bytes allocated / -bytes freed, region), allocator_compose's
EMPTY_CACHE = "empty_cache"  # a (-1, 0, EMPTY_CACHE) event: torch.cuda.empty_cache()
RESET_PEAKS = "reset_peaks"  # a (-1, 0, RESET_PEAKS) event: torch.cuda.reset_peak_memory_stats() (after a load)
SIDE = "side:"  # a region prefix: allocated on a DeepSpeed side stream (not the default stream's pool)


class EventWriter:
    """The rewritten event list, with fresh serials for DeepSpeed's own tensors."""

    def __init__(self, top: int) -> None:
        self.out: list[Event] = []
        self.serial = top

    def new(self, nbytes: int, tag: str) -> int:
        """Allocate ``nbytes`` in region ``tag``; returns the new storage's serial."""
        self.serial += 1
        self.out.append((self.serial, nbytes, tag))
        return self.serial

    def free(self, serial: int, nbytes: int, tag: str) -> None:
        """Free storage ``serial`` of ``nbytes``."""
        self.out.append((serial, -nbytes, tag))


Handle = tuple[int, int, str]  # (serial, bytes, region allocated in)


class RankEvents:
    """A rewritten rank's own allocations as handles on an :class:`EventWriter` (the FSDP rewrites' ranks)."""

    def __init__(self, w: EventWriter) -> None:
        self.w = w

    def new(self, nbytes: int, tag: str) -> Handle:
        """Allocate ``nbytes`` in region ``tag``."""
        return self.w.new(nbytes, tag), nbytes, tag

    def free(self, h: Handle | None) -> None:
        """Free a handle (None: nothing)."""
        if h is not None:
            self.w.free(*h)


class Backward:
    """One backward's gradients as the engine takes them (``deepspeed_run_events``' module docstring)."""

    def __init__(self, plan: DeepSpeedPlan) -> None:
        self.plan = plan
        self.held: list[tuple[int, int]] = []  # ZeRO-1 without overlap_comm: every gradient until the end
        self.big: tuple[int, int] | None = None  # a gradient larger than the bucket, reduced at the next one
        self.buckets: list[tuple[int, int]] = []
        self.partition: tuple[int, int] | None = None  # ZeRO-1/2 grads_in_partition
        self.late = plan.stage == 1 and not plan.overlap
        # grads_in_partition (copy_grads_in_partition): every parameter of this rank's partition, whole
        self.held_bytes = plan.elem * plan.held()

    def gradient(self, w: EventWriter, s: int, n: int, t: str) -> None:
        """A gradient autograd made (``s``, ``n`` bytes, region ``t``)."""
        p = self.plan
        w.out.append((s, n, t))
        if p.stage == 3:  # partition_grads: copied into grad_partitions_flat_buffer
            w.free(s, n, t)
            return
        if not self.buckets and not self.partition:  # setup_buckets at the first gradient hook
            for _ in range((2 if p.overlap else 1) if p.contiguous else 0):
                self.buckets.append((w.new(p.elem * p.bucket, t), p.elem * p.bucket))
            if not self.late:
                self.partition = (w.new(self.held_bytes, (SIDE if p.overlap else "") + t), self.held_bytes)
        if self.late:
            self.held.append((s, n))
            return
        if self.big is not None:
            w.free(*self.big, t)
            self.big = None
        if n > p.elem * p.bucket:
            self.big = (s, n)
        else:
            w.free(s, n, t)

    def accumulate(self, w: EventWriter, kept: tuple[int, int] | None, t: str, boundary: bool,
                   ) -> tuple[int, int] | None:
        """ZeRO-2 with gradient accumulation, at the end of a micro-batch's backward (``stage_1_and_2.py``
        ``independent_gradient_partition_epilogue``): the first micro-batch's ``grads_in_partition`` is kept
        (``all_grad_tensors``: views of it) and every later one's is added into it (``add_``) and dropped with
        ``param.grad`` (``_clear_param_grad_only``); at the boundary the kept one is the step's. Returns the kept
        partition (None after the boundary)."""
        if kept is None and not boundary:
            return self.partition
        if kept is not None and self.partition is not None:
            w.free(*self.partition, (SIDE if self.plan.overlap else "") + t)
            self.partition = kept
        return None if boundary else kept

    def epilogue(self, w: EventWriter, t: str) -> None:
        """The end of backward: ZeRO-1's ``reduce_gradients``, the last bucket reduced, ``_release_ipg_buffers``."""
        p = self.plan
        if p.stage == 3:
            return
        if self.late:
            self.partition = (w.new(self.held_bytes, t), self.held_bytes)
            for g in reversed(self.held):  # parameter order: backward made them in reverse
                w.free(*g, t)
        if self.big is not None:
            w.free(*self.big, t)
        for b in self.buckets:
            w.free(*b, t)
