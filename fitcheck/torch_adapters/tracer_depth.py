"""Depth extrapolation of a fake-tensor trace: one and two repeating layer groups traced, the full depth drawn.

Where it was shown exact: ``tests/test_depth_extrapolation.py`` (every per-phase, per-category number of the
full-depth trace). Also a spec's extrapolated trace and its components. Moved out of :mod:`tracer` (which runs one step)
unchanged.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

from fitcheck.core.activations import other_half_autocast
from fitcheck.report import Component, Phase
from fitcheck.spec import FreezeSpec, TrainingSpec
from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs, trace_kwargs
from fitcheck.torch_adapters.trace_result import (
    CATEGORIES,
    LOGITS,
    PhaseBreakdown,
    TraceResult,
    accumulating_step,
    breakdown_at_peak,
    components_from_trace,
    resident_gradients_step,
)
from fitcheck.torch_adapters.tracer import trace_step


def _line(a: PhaseBreakdown, b: PhaseBreakdown, groups: float) -> PhaseBreakdown:
    cats = set(a.by_category) | set(b.by_category)
    by_cat = {c: round(a.get(c) + (b.get(c) - a.get(c)) * (groups - 1)) for c in cats}
    return PhaseBreakdown(sum(by_cat.values()), by_cat)


def _head_and_layer_peaks(series: tuple[tuple[int, ...], ...]) -> tuple[PhaseBreakdown | None, PhaseBreakdown | None]:
    """The peak of a phase's series while vocabulary-sized logits are alive, and the peak after they are freed."""
    at = CATEGORIES.index(LOGITS)
    # "alive": at least half the phase's largest logits bytes (the loss scalars stay in the category after the
    # vocabulary-sized tensors are freed)
    big = max(row[at] for row in series) / 2
    head = tuple(row for row in series if row[at] > big)
    rest = tuple(row for row in series if row[at] <= big)
    return (breakdown_at_peak(head) if head else None), (breakdown_at_peak(rest) if rest else None)


def extrapolate(one: TraceResult, two: TraceResult, groups: float, depth: int) -> TraceResult:
    """Linear extrapolation of every per-phase, per-category number from 1 and 2 groups to ``groups``.

    A phase's peak is the largest of several moments, each affine in the depth, and the one that wins at one or
    two groups need not win at the full depth. During backward, the LM head's moment (the vocabulary-sized logits
    and their gradient alive, no layer gradient yet) wins at shallow depths, while the bottom layer's (a recomputed
    layer with every other layer's gradient) wins at 32 layers: Llama-3.1-8B full fine-tune, checkpointing,
    8 x 4096, extrapolated from 1 and 2 layers gave 34.0 GB where the 32-layer trace holds 37.9 GB (the formula's
    figure). So, where the series are kept, the peak while logits are alive and the peak after they are freed are
    each extrapolated on their own line and the larger is taken. That is still a peak picked before extrapolating:
    after the logits are freed, the one-layer trace's worst moment can be the end of backward and the two-layer
    trace's the top layer's (Mistral-Small-24B full eager bf16, 1 x 1792: 538 MiB under the 40-layer trace), so
    :func:`combine_depths` draws every event on its own line (:func:`extrapolate_aligned`) and this is only where
    the two traces' events do not align.
    """
    phases: dict[Phase, PhaseBreakdown] = {}
    for phase in one.phases:
        line = _line(one.phases[phase], two.phases[phase], groups)
        if one.series.get(phase) and two.series.get(phase):
            pairs = zip(_head_and_layer_peaks(one.series[phase]), _head_and_layer_peaks(two.series[phase]),
                        strict=True)
            lines = [_line(a, b, groups) for a, b in pairs if a is not None and b is not None]
            line = max(lines, key=lambda br: br.total, default=line)
        phases[phase] = line
    grads = round(one.final_grads + (two.final_grads - one.final_grads) * (groups - 1))
    return TraceResult(phases, depth, grads, one.seconds + two.seconds)


def _aligned_peak(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...],
                  groups: float) -> PhaseBreakdown | None:
    """A phase's peak at ``groups`` from its series at two depths one group apart, every event of the deeper trace
    drawn on its own line and the largest total taken (never a peak picked before extrapolating). None where the
    events the two traces share from the start and from the end do not cover the shallower trace.

    The deeper trace is the shallower one with one group inserted in the stack; deeper still, more groups are
    inserted there. An event the two traces share from the start (the head and the top layer during backward, the
    embedding and the bottom layer during the forward) comes before any inserted group has run: each holds what
    a group holds at the phase's first event (one more checkpoint or layer's saved tensors during backward), the
    slope of its line. An event shared from the end comes after every inserted group has run: each holds what a
    group holds at the phase's last event (one more layer's gradients during backward). Any other event of the
    deeper trace is in a group whose place in the stack the two traces do not tell (the middle group of a
    three-group trace: a layer in the middle is, at the full depth, as high as the one under the top layer or as
    low as the one over the bottom layer; or, one and two groups deep, the part of the top or bottom layer that
    differs from the single layer, which is both): it is drawn with both slopes.

    Where the phase's worst moment changes with the depth, the peaks of the two traces are different moments and a
    line through them is no moment's: Mistral-Small-24B full fine-tune, eager, bf16, 1 x 1792 tokens, during
    backward, the one-layer trace's peak after the LM head's is the end of backward (every gradient, the
    embedding's too), the two-layer trace's the top layer's softmax backward; the line through them fell under the
    head's, which was 538 MiB under the 40-layer trace (s19-probes; every event on its line: exact). Llama-2-7B
    (float16 config) SFT LoRA all-linear, bf16, checkpointing, 1 x 2048 (``residual_promoted``: the bottom layer
    reads the 16-bit embedding), during backward, each further layer adds 414.8 / 438.3 / 443.3 / 443.3 MB from 1
    to 5 layers (the bottom layer's moment wins at 2, the top layer's from 3 on), and the line through 2 and 3
    layers fell 144.9 MB under the 32-layer trace (s18-depth). Llama-3.1-8B LoRA, eager, fp32, 1 x 4096 (the
    bottom layer's input needs no gradient: ``first_layer_apart``), during backward: the line through the peaks
    was 1920 MiB over the 32-layer trace; drawing only the events shared from the start or the end, 463 MiB under
    (the top layer's softmax backward is in neither); every event drawn, exact.
    """
    def deltas(rows: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
        return [tuple(x - y for x, y in zip(r, p, strict=True)) for p, r in itertools.pairwise(rows)]

    da, db = deltas(a), deltas(b)
    head = next((i for i, (x, y) in enumerate(zip(da, db, strict=False)) if x != y), len(da))
    tail = next((i for i, (x, y) in enumerate(zip(da[::-1], db[::-1], strict=False)) if x != y), len(da))
    # rows 0..head share their events from the start; the last tail + 1 rows from the end
    if head + tail + 2 < len(a):
        return None
    first = tuple(y - x for x, y in zip(a[0], b[0], strict=True))  # what a group holds at the phase's first event
    last = tuple(y - x for x, y in zip(a[-1], b[-1], strict=True))  # ... and at its last
    from_end = len(b) - tail - 1

    def drawn(i: int) -> tuple[float, ...]:
        slopes = ((first,) if i <= head else ()) + ((last,) if i >= from_end else ()) or (first, last)
        return max((tuple(y + s * (groups - 2) for y, s in zip(b[i], slope, strict=True)) for slope in slopes),
                   key=sum)

    best = max((drawn(i) for i in range(len(b))), key=sum)
    by_cat = {c: round(n) for c, n in zip(CATEGORIES, best, strict=True)}
    by_cat = {c: n for c, n in by_cat.items() if n}
    return PhaseBreakdown(sum(by_cat.values()), by_cat)


def extrapolate_aligned(one: TraceResult, two: TraceResult, groups: float, depth: int) -> TraceResult:
    """:func:`extrapolate` with each phase's peak drawn event by event (:func:`_aligned_peak`) where both series
    are kept and align (else the peaks' lines of :func:`extrapolate`): what :func:`combine_depths` draws."""
    base = extrapolate(one, two, groups, depth)
    phases = dict(base.phases)
    for phase in one.phases:
        a, b = one.series.get(phase), two.series.get(phase)
        peak = _aligned_peak(a, b, groups) if a and b else None
        if peak is not None:
            phases[phase] = peak
    return dataclasses.replace(base, phases=phases)


def depth_plan(config: Mapping[str, Any], freeze: FreezeSpec | None = None,
               skip_first: bool = False) -> tuple[int, ...]:
    """The depths to trace for a config: one and two repeating layer groups, or the whole stack when it is at
    most two groups deep or only some layers are trainable (no repeating group to extrapolate from).

    ``skip_first``: two and three groups (the whole stack up to three), for a step whose bottom layer's moment
    differs from the others' (:func:`first_layer_apart`), so that neither traced depth has it as its top layer.
    """
    from fitcheck.torch_adapters.tracer_build import config_layers, layer_group

    depth, group = config_layers(config), layer_group(config)
    if depth <= (3 if skip_first else 2) * group or (freeze is not None and freeze.trainable_layers is not None):
        return (depth,)
    return (2 * group, 3 * group) if skip_first else (group, 2 * group)


def first_layer_apart(kwargs: Mapping[str, Any]) -> bool:
    """Whether a one-group trace of this step misplaces the full depth's during-backward peak: eager attention
    without checkpointing over frozen embeddings (LoRA / QLoRA).

    The peak is in the top layer's eager attention backward (the s² softmax gradient) while every layer below
    holds its saved tensors. The bottom layer's input needs no gradient, so at one layer that moment is lower
    than the top layer's of a deeper model by a different amount than the bottom layer's saved tensors are, and
    the line through one and two layers has the wrong slope: Llama-3.1-8B LoRA fp32, 1 x 4096, during backward,
    6 layers traced 36919.7 MiB of activations, logits and temporaries, extrapolated from 1 and 2 layers
    37175.7 MiB, from 2 and 3 layers 36919.7 MiB (exact); at 32 layers the first line is +1.7 .. +5.2 % over the
    formula, which is exact at 2, 4 and 32 traced layers (``benchmarks/envelope_ranges.py``).
    """
    return (kwargs.get("attn_implementation") == "eager" and not kwargs.get("checkpointing")
            and kwargs.get("lora") is not None)


def residual_promoted(kwargs: Mapping[str, Any]) -> bool:
    """Whether the bottom layer reads another dtype than the layers above it: 16-bit weights under the other
    16-bit autocast dtype (TRL's default for Phi-2 and the fp16 Llama-2 configs: config ``torch_dtype`` float16,
    ``bf16=True``).

    The embedding output is in the weights' dtype (``nn.Embedding`` is on no autocast list), the layer's matmul
    outputs in the autocast dtype, and the residual add (transformers 5.23 ``models/phi/modeling_phi.py``
    ``PhiDecoderLayer.forward``: ``attn_outputs + feed_forward_hidden_states + residual``; ``modeling_llama.py``
    ``LlamaDecoderLayer.forward``: ``residual + hidden_states``) runs outside autocast's lists, so it promotes
    float16 + bfloat16 to float32: layer 0 reads the 16-bit embedding and casts its input gradient back to it,
    every layer above reads and returns an fp32 residual. A one-group trace has only layer 0, and the line through
    one and two groups has the wrong slope: Phi-2 SFT LoRA all-linear, checkpointing, 1 x 2048, during backward,
    traced at 1 / 2 / 3 / 4 layers 1,588,847,744 / 1,759,625,344 / 1,940,888,704 / 2,122,152,064 B (increments
    170.8 M, then 181.3 M twice): from 1 and 2 layers 20,971,520 B under the 4-layer trace, from 2 and 3 exact.

    The same for TRL 0.7.5-0.25.1's SFTTrainer cast (``trl_cast``, ``core/states/trl_adapters.py``): the bf16
    embedding under a k-bit prepared fp32 residual. Mistral-7B QLoRA q/k/v/o, reentrant checkpointing, 4 x 4096
    (fms-acceleration's row): from 1 and 2 layers the end of forward drew 14.79 GiB of activations and no logits
    (16.75 GiB with transformers 4.48's copy, the formula 15.49); from 2 and 3 layers its moments align.
    """
    dtype, mixed = kwargs.get("dtype"), kwargs.get("mixed_precision")
    if kwargs.get("trl_cast"):
        return True
    return isinstance(dtype, str) and isinstance(mixed, str) and other_half_autocast(dtype, mixed)


def combine_depths(config: Mapping[str, Any], results: tuple[TraceResult, ...]) -> TraceResult:
    """The full-depth result from the traces of :func:`depth_plan` (extrapolated linearly from two groups)."""
    from fitcheck.torch_adapters.tracer_build import config_layers, layer_group

    if len(results) == 1:
        return results[0]
    depth, group = config_layers(config), layer_group(config)
    first = results[0].num_layers / group  # groups in the shallower trace: 1, or 2 (depth_plan's skip_first)
    return extrapolate_aligned(results[0], results[1], depth / group - (first - 1), depth)


def trace_extrapolated(config: Mapping[str, Any], accumulating: bool = False, resident: bool = False,
                       **kwargs: Any) -> TraceResult:
    """Trace one and two repeating layer groups (two and three where :func:`residual_promoted`) and extrapolate to
    the config's depth; ``accumulating``: each depth's trace seen as a later micro-step of a gradient accumulation
    window (``trace_result.accumulating_step``), as ``trace_batch.BatchTraces.result`` does; ``resident``: every
    gradient held from the start of backward (``trace_result.resident_gradients_step``).

    Other keyword arguments are those of :func:`trace_step` (``num_layers`` excepted).
    """
    plan = depth_plan(config, kwargs.get("freeze"), residual_promoted(kwargs))
    results = tuple(trace_step(config, num_layers=n, **kwargs) for n in plan)
    seen = tuple(map(accumulating_step, results)) if accumulating else results
    seen = tuple(map(resident_gradients_step, seen)) if resident else seen
    # the allocation sequence is the deepest trace's (allocator_replay replays it at that depth)
    return dataclasses.replace(combine_depths(config, seen), alloc_events=results[-1].alloc_events)


def trace_components(spec: TrainingSpec) -> tuple[Component, ...]:
    """Activation, logits and temporary components of a spec, measured by a fake-tensor trace.

    Same phase semantics as ``fitcheck.core.activations.decoder.activation_components``: parameters, gradients and
    optimizer states are left to ``fitcheck.core.states.model_states`` (no gradient exists before the logits
    gradient; all gradients exist in BACKWARD and OPTIMIZER_STEP), so the sum of both reproduces the trace.

    Args:
        spec: The training spec; its model must carry the raw config.json (``spec.model.config``).

    Returns:
        Components ``activations.traced``, ``logits.traced`` and ``temporaries.traced``.
    """
    from fitcheck.errors import UnsupportedModelError

    if not spec.model.config:
        raise UnsupportedModelError(f"{spec.model.model_id}: no config.json mapping to trace")
    from fitcheck.torch_adapters.run_scope import accumulates_in_grad, gradients_resident

    result = trace_result(spec, activation_trace_kwargs(spec), accumulating=accumulates_in_grad(spec),
                          resident=gradients_resident(spec))
    return components_from_trace(result)


def trace_result(spec: TrainingSpec, kwargs: Mapping[str, Any] | None = None, accumulating: bool = False,
                 resident: bool = False) -> TraceResult:
    """The extrapolated trace of a spec's step (its ``alloc_events`` are those of the deepest trace run);
    ``accumulating``: as a later micro-step of a gradient accumulation window; ``resident``: every gradient held from
    the start of backward (``trace_extrapolated``)."""
    from fitcheck.errors import UnsupportedModelError

    if not spec.model.config:
        raise UnsupportedModelError(f"{spec.model.model_id}: no config.json mapping to trace")
    return trace_extrapolated(spec.model.config, accumulating=accumulating, resident=resident,
                              **(trace_kwargs(spec) if kwargs is None else kwargs))
