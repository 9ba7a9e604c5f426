"""The tensors an optimizer steps, in the order it steps them, and the transient bytes of one step.

The Trainer hands the optimizer two parameter groups built from ``model.named_parameters()`` (transformers
5.23 ``trainer.py::create_optimizer``): weight decay (everything but biases and norm weights,
``get_decay_parameter_names``) and no decay. torch optimizers run one functional call per group
(``torch/optim/adam.py::Adam.step``: ``for group in self.param_groups: adam(...)``), so a local that outlives
its loop iteration (``denom``, ``exp_avg_sq_sqrt``) is alive beside the next tensor's only within a group.

An inventory lists per-layer parameters once (``model.layers.*.…``, ``repeat`` = layers); the real order is
layer by layer. :func:`step_runs` rebuilds that order run-length encoded, so that a peak over consecutive
tensors needs at most two passes over a layer's tensors, whatever the depth.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from fitcheck.spec import Dtype

# transformers 5.23 trainer.py::get_decay_parameter_names: parameters whose lower-cased full name matches one of
# these, or that belong to an nn.LayerNorm, go to the no-decay group.
_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


def trainer_decays(name: str, *, layer_norm: bool = False) -> bool:
    """Whether the Trainer puts a parameter in its weight-decay group.

    Args:
        name: Full parameter name (a ``*`` for the layer index is fine).
        layer_norm: The parameter belongs to an ``nn.LayerNorm`` module.

    Returns:
        False for biases, norm weights and ``nn.LayerNorm`` parameters.
    """
    return not layer_norm and _NO_DECAY.search(name.lower()) is None


@dataclass(frozen=True)
class TensorGroup:
    """``repeat`` trainable tensors of one shape and dtype, as the optimizer sees them.

    Attributes:
        name: Parameter name (layer index as ``*``).
        shape: Shape of one tensor.
        dtype: Parameter (and gradient) dtype.
        repeat: Number of tensors.
        embedding: An ``nn.Embedding`` weight (bnb 8-bit: the Trainer forces 32-bit states).
        decay: In the Trainer's weight-decay group (not a bias or norm).
        low_rank: A GaLore target (``optim_target_modules``, an ``nn.Linear`` weight).
    """

    name: str
    shape: tuple[int, ...]
    dtype: Dtype
    repeat: int = 1
    embedding: bool = False
    decay: bool = True
    low_rank: bool = False

    @property
    def numel_each(self) -> int:
        """Elements of one tensor."""
        return math.prod(self.shape)

    @property
    def nbytes_each(self) -> int:
        """Bytes of one tensor."""
        return self.numel_each * self.dtype.nbytes


@dataclass(frozen=True)
class OptimizerMemory:
    """What an optimizer holds and allocates for a set of trainable tensors (one process, unsharded).

    Attributes:
        states: State bytes in torch's caching allocator.
        managed: State bytes in CUDA managed memory (paged optimizers; outside torch's allocator).
        projections: GaLore projection matrices (torch allocator).
        step_counters_host: 0-d step tensors kept on the CPU.
        step_counters_device: 0-d step tensors on the device.
        step_temporary: Largest transient allocation during ``optimizer.step()``.
        in_backward: The update runs inside backward (LOMO, layer-wise GaLore): no full gradient set exists.
        detail: One line on the layout.
        source: Where the layout comes from.
    """

    states: int
    managed: int = 0
    projections: int = 0
    step_counters_host: int = 0
    step_counters_device: int = 0
    step_temporary: int = 0
    in_backward: bool = False
    detail: str = ""
    source: str = ""


@dataclass(frozen=True)
class Run:
    """``count`` consecutive repetitions of ``tensors`` (one per layer, each tensor once per repetition)."""

    tensors: tuple[TensorGroup, ...]
    count: int


def step_runs(tensors: Sequence[TensorGroup]) -> list[Run]:
    """The tensors in ``model.named_parameters()`` order, run-length encoded layer by layer.

    Names with ``*`` that share the text before the ``*`` (``model.layers.``) form one stack, placed where
    its first tensor is listed; layer ``j`` of a stack holds the stack's tensors with ``repeat > j``, in list
    order (entries present in fewer layers are taken to be missing from the last ones). Other names stand
    where they are listed, ``repeat`` times in a row.

    Args:
        tensors: Trainable tensors, in inventory (module) order.

    Returns:
        The runs, in step order.
    """
    segments: list[str | TensorGroup] = []
    stacks: dict[str, list[TensorGroup]] = {}
    for t in tensors:
        if t.repeat < 1:
            continue
        if "*" not in t.name:
            segments.append(t)
            continue
        prefix = t.name.split("*", 1)[0]
        if prefix not in stacks:
            stacks[prefix] = []
            segments.append(prefix)
        stacks[prefix].append(t)
    runs: list[Run] = []
    for seg in segments:
        if isinstance(seg, TensorGroup):
            runs.append(Run((seg,), seg.repeat))
            continue
        stack = stacks[seg]
        done = 0
        for depth in sorted({t.repeat for t in stack}):
            runs.append(Run(tuple(t for t in stack if t.repeat >= depth), depth - done))
            done = depth
    return runs


def trainer_groups(tensors: Sequence[TensorGroup]) -> list[list[Run]]:
    """The Trainer's two parameter groups (decay, then no decay), each in step order; empty groups dropped."""
    runs = step_runs(tensors)
    out: list[list[Run]] = []
    for decay in (True, False):
        group = [Run(kept, r.count) for r in runs if (kept := tuple(t for t in r.tensors if t.decay is decay))]
        if group:
            out.append(group)
    return out


def _walk(runs: Iterable[Run]) -> Iterator[TensorGroup]:
    """Every distinct consecutive pair of the flattened order: a run's tensors at most twice in a row (the
    second pass adds the pair last -> first between two layers; further layers repeat the same pairs)."""
    for run in runs:
        for _ in range(min(run.count, 2)):
            yield from run.tensors


def pair_peak(sizes: Iterable[int], prev: int, cur: int) -> int:
    """``max_i(prev * sizes[i-1] + cur * sizes[i])`` over a sequence (``sizes[-1]`` = 0)."""
    best = last = 0
    for size in sizes:
        best = max(best, prev * last + cur * size)
        last = size
    return best


def single_tensor_peak(tensors: Sequence[TensorGroup], prev: int, cur: int) -> int:
    """Peak of a per-tensor loop that allocates ``cur`` param-sized buffers per tensor while the previous
    tensor's ``prev`` buffers are still bound to loop variables; one loop per Trainer param group."""
    return max((pair_peak((t.nbytes_each for t in _walk(g)), prev, cur) for g in trainer_groups(tensors)), default=0)


def one_loop_peak(tensors: Sequence[TensorGroup], prev: int, cur: int) -> int:
    """:func:`single_tensor_peak` for one loop over the Trainer's groups in turn, whose loop variables stay bound
    from one group into the next (transformers' ``AdamW.step``: ``for group ...: for p in group["params"]``)."""
    return pair_peak((t.nbytes_each for g in trainer_groups(tensors) for t in _walk(g)), prev, cur)


def dtype_totals(group: Iterable[Run]) -> list[int]:
    """Bytes per dtype of a param group, in order of first appearance.

    ``Optimizer._group_tensors_by_device_and_dtype`` (torch 2.13 ``optim/optimizer.py``) splits a group's
    tensor lists by (device, dtype), keyed in first-seen order; foreach kernels run once per sub-list.
    """
    totals: dict[Dtype, int] = {}
    for run in group:
        for t in run.tensors:
            totals[t.dtype] = totals.get(t.dtype, 0) + t.nbytes_each * run.count
    return list(totals.values())


def foreach_peak(tensors: Sequence[TensorGroup], prev: int, cur: int) -> int:
    """Peak of a foreach step that allocates ``cur`` copies of each (device, dtype) sub-list of a group while
    the previous sub-list's ``prev`` copies are still bound; one call per Trainer param group."""
    return max((pair_peak(dtype_totals(g), prev, cur) for g in trainer_groups(tensors)), default=0)


def adafactor_peak(tensors: Sequence[TensorGroup]) -> int:
    """Peak fp32 temporaries of transformers' ``Adafactor.step`` over the Trainer's groups.

    ``optimization.py`` (5.23) lines 1215-1292, per parameter: ``grad.float()`` and ``p.float()`` (16-bit
    params only), ``update = grad**2 + eps`` (two buffers while the sum is taken, with the previous
    parameter's ``update`` still bound), then ``_approx_sq_grad``'s full product beside the old ``update``
    and the fp32 row/col factors, and ``p.add_(-update)``. The loop variables outlive the group loop (one
    Python frame for all groups), so the previous tensor spans groups.
    """
    best = last = 0
    for group in trainer_groups(tensors):
        for t in _walk(group):
            n = t.numel_each
            copies = 4 if t.dtype.is_half else 2  # (grad32, p32,) the two of grad**2 + eps / update + product
            s = t.shape
            factors = math.prod(s[:-1]) + math.prod(s[:-2]) * s[-1] if len(s) >= 2 else 0
            best = max(best, 4 * (copies * n + max(last, factors)))
            last = n
    return best
