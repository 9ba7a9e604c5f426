"""A run of several training steps' allocations, composed from one step's trace and the optimizer's own trace.

The whole-run replay (``allocator_replay.replay_whole_run``) needs what ``tracer.trace_step(steps=3)`` with the
optimizer records; the headline has already traced one step without an optimizer (its activation trace, the
same forward and backward: ``tracer.activation_trace_kwargs``). :func:`whole_run` repeats that step's forward
and backward once per step, with storages renamed per step and the warm-up steps' regions suffixed as
``trace_step`` names them, puts the optimizer's events of the same step (``tracer_optimizer.trace_optimizer``)
between backward and ``zero_grad``, and returns the region starts ``allocator_deepen.deepen`` cuts at. Checked
against real multi-step traces in ``tests/test_allocator_compose.py``: equal, event for event up to storage
renaming and the order of frees inside a run of consecutive frees (an order the caching allocator's state does
not depend on: ``allocator_deepen.frees_in_allocation_order``).

Pure Python: no torch import.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

Event = tuple[int, int, str]  # (storage serial, +bytes allocated / -bytes freed, region allocated in)

# the regions trace_step enters in every step, in order, then "done" (tracer.trace_step)
STEP_REGIONS = ("forward", "forward_head", "backward_start", "backward", "optimizer", "zero_grad")


class ComposeError(ValueError):
    """A trace does not have the regions of ``tracer.trace_step`` (one step) or ``trace_optimizer``."""


def whole_run(step: Sequence[Event], step_starts: Sequence[int], opt: Sequence[Event], opt_starts: Sequence[int],
              steps: int, micro_batches: int = 1) -> tuple[list[Event], tuple[int, ...]]:
    """The events of ``steps`` training steps.

    Args:
        step: ``alloc_events`` of one step traced without an optimizer (``optimizer=None, steps=1``).
        step_starts: Its ``region_starts`` (the six regions of :data:`STEP_REGIONS`, then ``done``).
        opt: ``alloc_events`` of ``trace_optimizer`` over ``steps`` steps at the same depth.
        opt_starts: Its region starts (``optimizer`` and ``zero_grad`` per step, then ``done``).
        steps: Steps in the run.
        micro_batches: Forward and backward passes per optimizer step (``gradient_accumulation_steps``): from the
            second on, each gradient is allocated, added into ``.grad`` and freed (:func:`_accumulated`).

    Returns:
        (the events, the index of the first event of each region of each micro-batch's forward .. backward and of
        each step's optimizer and ``zero_grad``, then of ``done``).

    Raises:
        ComposeError: The traces do not have those regions, or the step frees a storage it did not allocate
            outside the setup.
    """
    if len(step_starts) != len(STEP_REGIONS) + 1 or len(opt_starts) != 2 * steps + 1:
        raise ComposeError(f"region starts {len(step_starts)} / {len(opt_starts)} do not match one step and "
                           f"{steps} optimizer steps")
    fwd, _fh, _bs, _bw, opt_at, zero_at, done_at = step_starts
    setup = step[:fwd]
    before = {s for s, n, _ in setup if n > 0}
    once = _first_step_only(step[fwd:], before)
    grads = _gradients(step[fwd:zero_at], step[zero_at:done_at], before)
    top = 1 + max((s for s, _, _ in step), default=0)
    opt_base = top * (steps * micro_batches + 1)
    out: list[Event] = list(setup)
    starts: list[int] = []
    for k in range(steps):
        for m in range(micro_batches):
            # trace_step names every pass but the last step's last one a warm-up (tracer.trace_step, grad_accum)
            suffix = "" if (k, m) == (steps - 1, micro_batches - 1) else "_warmup"
            renamed = _renaming(before, (k * micro_batches + m + 1) * top, suffix)

            def again(ev: Event, first: bool = k == 0 and m == 0) -> bool:
                return first or ev[0] not in once

            for a, b in itertools.pairwise(step_starts[:5]):  # forward .. backward
                starts.append(len(out))
                events = [renamed(ev) for ev in step[a:b] if again(ev)]
                out += events if m == 0 else _accumulated(events, {renamed((g, 0, ""))[0] for g in grads})
        # this step's optimizer events (its optimizer region; anything in its zero_grad region follows zero_grad)
        o_at, z_at, next_at = opt_starts[2 * k], opt_starts[2 * k + 1], opt_starts[2 * k + 2]
        starts.append(len(out))
        out += [(s + opt_base, n, tag) for s, n, tag in opt[o_at:z_at]]
        # the first pass's gradients are .grad (stolen), freed by zero_grad
        first = _renaming(before, (k * micro_batches + 1) * top,
                          "" if (k, micro_batches) == (steps - 1, 1) else "_warmup")
        out += [first(ev) if ev[0] in grads else renamed(ev) for ev in step[opt_at:zero_at]
                if k == 0 or ev[0] not in once]
        starts.append(len(out))
        out += [first(ev) if ev[0] in grads else renamed(ev) for ev in step[zero_at:done_at]
                if k == 0 or ev[0] not in once]
        out += [(s + opt_base, n, tag) for s, n, tag in opt[z_at:next_at]]
    starts.append(len(out))
    out += [renamed(ev) for ev in step[done_at:]]  # the last pass's renaming
    _check_frees(out)
    return out, tuple(starts)


def _renaming(before: set[int], offset: int, suffix: str) -> Callable[[Event], Event]:
    """Storages of one forward and backward pass renamed apart from every other pass's (setup storages kept)."""

    def renamed(ev: Event) -> Event:
        s, n, tag = ev
        if s in before:
            return ev
        return (s + offset, n, tag + suffix if tag != "setup" else tag)

    return renamed


def _gradients(step: Sequence[Event], zero_grad: Sequence[Event], before: set[int]) -> set[int]:
    """The parameters' ``.grad`` storages: made in the pass, freed by ``zero_grad(set_to_none=True)``."""
    made = {s for s, n, _ in step if n > 0 and s not in before}
    return {s for s, n, _ in zero_grad if n < 0 and s in made}


def _accumulated(events: Sequence[Event], grads: set[int]) -> list[Event]:
    """A later pass of an accumulation window: each new gradient freed when the node that made it returns.

    torch 2.13 ``torch/csrc/autograd/functions/accumulate_grad.h`` ``accumulateGrad``: with ``.grad`` undefined
    (the first pass after ``zero_grad(set_to_none=True)``) the new gradient is stolen (no copy: it becomes
    ``.grad``, as the one-step trace records); with ``.grad`` defined and grad mode off (the engine runs
    ``AccumulateGrad`` without ``create_graph``) it runs ``variable_grad += new_grad`` in place, and the new
    gradient is released when ``AccumulateGrad`` returns. The engine runs it as soon as the node that made the
    gradient has returned (its ``sequence_nr`` is ``UINT64_MAX``: ``torch/csrc/autograd/node.h``; first in the
    ready queue: ``engine.h`` ``CompareNodeTaskTime``), after that node's own later allocations and the frees of
    its inputs and saved tensors and after the engine has added its outputs into the input buffers of the nodes
    they feed (``input_buffer.cpp`` ``InputBuffer::add``: a sum allocated, then the two addends freed): the free
    goes at the end of the first run of frees after the gradient, or after the next allocation and its run of
    frees when that run frees one of the node's outputs (the sum). The order inside a run of frees does not
    change the allocator's state. Checked against the real accumulating trace (``tracer.trace_step(grad_accum=
    2)``) in ``tests/test_allocator_accumulation.py``."""
    out: list[Event] = []
    pending: list[Event] = []
    made: set[int] = set()  # storages allocated since the first pending gradient
    freeing = False
    for i, ev in enumerate(events):
        if ev[1] > 0 and freeing and not _sums_outputs(events, i, made):
            out += [(s, -n, tag) for s, n, tag in pending]
            pending, freeing = [], False
            made.clear()
        out.append(ev)
        if ev[1] > 0 and ev[0] in grads:
            pending.append(ev)
        if pending and ev[1] > 0:
            made.add(ev[0])
        freeing = freeing or (bool(pending) and ev[1] <= 0)
    return out + [(s, -n, tag) for s, n, tag in pending]


def _sums_outputs(events: Sequence[Event], at: int, made: set[int]) -> bool:
    """Whether the allocation at ``at`` is followed by a run of frees that frees a storage in ``made``."""
    for s, n, _ in events[at + 1:]:
        if n > 0:
            return False
        if s in made:
            return True
    return False


def _first_step_only(events: Sequence[Event], before: set[int]) -> set[int]:
    """Storages whose events happen in the first step only: a parameter the step frees (re-cast in place) and
    what the step allocates and never frees (its replacement).

    bitsandbytes 0.50.2 ``nn/modules.py`` ``Linear4bit.forward`` (line 634) and ``Linear8bitLt.forward`` (1187) run
    ``bias.data = bias.data.to(x.dtype)`` when the bias is not in the input's dtype: a QLoRA model whose
    ``prepare_model_for_kbit_training`` made the biases fp32 (Qwen2's q/k/v) frees each fp32 bias and keeps a
    16-bit copy in the first forward; from the second step on the dtypes agree and nothing happens."""
    freed = {s for s, n, _ in events if n <= 0}
    return {s for s, n, _ in events if (n <= 0 and s in before) or (n > 0 and s not in freed)}


def _check_frees(events: Sequence[Event]) -> None:
    live: set[int] = set()
    for s, n, _ in events:
        if n > 0:
            live.add(s)
        elif s in live:
            live.discard(s)
        else:
            raise ComposeError(f"storage {s} is freed but was not allocated in the composed run")
