"""A run of several training steps' allocations, composed from one step's trace and the optimizer's own trace.

The whole-run replay (``allocator_whole_run.replay_whole_run``) needs what ``tracer.trace_step(steps=3)`` with the
optimizer records; the headline has already traced one step without an optimizer (its activation trace, the
same forward and backward: ``trace_arguments.activation_trace_kwargs``). :func:`whole_run` repeats that step's forward
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
# the tag of GRPO's log-prob pre-pass storages (``tracer_recorder.tagged``, ``tracer_grpo``): a pass that does not
# generate reuses the buffered batch and runs no pre-pass (``generating``)
PREPASS = "prepass"


# Forward and backward passes per optimizer step the replays compose at most. From the second pass on, every pass
# allocates each gradient, adds it into ``.grad`` and frees it from the same live set (the first pass's ``.grad``,
# the parameters, the optimizer's states), so the caching allocator's blocks repeat and later passes add no segment:
# replayed reserved and allocated at 8 passes equal those at 4 (tests/test_allocator_accumulation.py, tiny Llama,
# plain Trainer, bf16; all-linear LoRA too when the test was written), and Llama-3.2-1B bf16 gave the same reserved
# at 2 and 4 (CHANGELOG, session 11). The cap bounds the replay's event count and ``allocator_deepen``'s ``difflib``
# alignment, quadratic in it: 64 passes per step (Llama-2-7B LoRA, FSDP) ran over 20 CPU minutes, now 20 s.
MAX_REPLAYED_MICRO_BATCHES = 4


def replayed_micro_batches(grad_accum: int) -> int:
    """Passes per optimizer step a replay composes for ``gradient_accumulation_steps`` = ``grad_accum``: all of
    them up to :data:`MAX_REPLAYED_MICRO_BATCHES`, then that many (the later ones repeat)."""
    return min(max(grad_accum, 1), MAX_REPLAYED_MICRO_BATCHES)


class ComposeError(ValueError):
    """A trace does not have the regions of ``tracer.trace_step`` (one step) or ``trace_optimizer``."""


def whole_run(step: Sequence[Event], step_starts: Sequence[int], opt: Sequence[Event], opt_starts: Sequence[int],
              steps: int, micro_batches: int = 1, accumulated_after: Sequence[tuple[int, int, int]] = (),
              generating: Callable[[int], bool] | None = None) -> tuple[list[Event], tuple[int, ...]]:
    """The events of ``steps`` training steps.

    Args:
        step: ``alloc_events`` of one step traced without an optimizer (``optimizer=None, steps=1``).
        step_starts: Its ``region_starts`` (the six regions of :data:`STEP_REGIONS`, then ``done``).
        opt: ``alloc_events`` of ``trace_optimizer`` over ``steps`` steps at the same depth.
        opt_starts: Its region starts (``optimizer`` and ``zero_grad`` per step, then ``done``).
        steps: Steps in the run.
        micro_batches: Forward and backward passes per optimizer step (``gradient_accumulation_steps``): from the
            second on, each gradient is allocated, added into ``.grad`` and freed (:func:`_accumulated`).
        accumulated_after: The step trace's ``TraceResult.accumulated_after``: where each gradient's
            ``AccumulateGrad`` returned (needed when ``micro_batches`` > 1).
        generating: Whether the pass of that index (``step x micro_batches + micro-batch``) generates: the
            step's :data:`PREPASS` storages are kept in those passes only (GRPO: ``tracer_grpo``); None: in all.

    Returns:
        (the events, the index of the first event of each region of each micro-batch's forward .. backward and of
        each step's optimizer and ``zero_grad``, then of ``done``).

    Raises:
        ComposeError: The traces do not have those regions, the step frees a storage it did not allocate
            outside the setup, or an accumulating run lacks ``accumulated_after``.
    """
    if micro_batches > 1 and not accumulated_after:
        raise ComposeError("accumulation needs where each gradient's AccumulateGrad returned (accumulated_after)")
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

            generates = generating is None or generating(k * micro_batches + m)

            def again(ev: Event, first: bool = k == 0 and m == 0, generates: bool = generates) -> bool:
                if not generates and ev[2] == PREPASS:
                    return False
                return first or ev[0] not in once

            for a, b in itertools.pairwise(step_starts[:5]):  # forward .. backward
                starts.append(len(out))
                events = [renamed(ev) for ev in step[a:b] if again(ev)]
                if m:
                    events = _accumulated(events, {(renamed((s, 0, ""))[0], sign): renamed((g, 0, ""))[0]
                                                   for g, s, sign in accumulated_after if g in grads})
                out += events
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


def _accumulated(events: Sequence[Event], after: dict[tuple[int, int], int]) -> list[Event]:
    """A later pass of an accumulation window: each new gradient freed where the first pass's ``AccumulateGrad``
    returned (``after``: (serial, +1 / -1) of that event -> the gradient's serial in this pass).

    torch 2.13 ``torch/csrc/autograd/functions/accumulate_grad.h`` ``accumulateGrad``: with ``.grad`` undefined
    (the first pass after ``zero_grad(set_to_none=True)``) the new gradient is stolen (no copy: it becomes
    ``.grad``, as the one-step trace records); with ``.grad`` defined and grad mode off (the engine runs
    ``AccumulateGrad`` without ``create_graph``) it runs ``variable_grad += new_grad`` in place, and the new
    gradient is released when ``AccumulateGrad`` returns. The engine runs the same nodes in the same order in every
    pass (``AccumulateGrad``'s ``sequence_nr`` is ``UINT64_MAX``: ``torch/csrc/autograd/node.h``), so only that
    release is added; a tied weight's ``AccumulateGrad`` runs after its last use's gradient is summed in. Equal to
    the real accumulating trace (``tracer.trace_step(grad_accum=)``), event for event:
    ``tests/test_allocator_accumulation.py``."""
    made = {s: (n, t) for s, n, t in events if n > 0}
    out: list[Event] = []
    for ev in events:
        out.append(ev)
        g = after.get((ev[0], 1 if ev[1] > 0 else -1))
        if g is not None and g in made:
            out.append((g, -made[g][0], made[g][1]))
    return out


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
