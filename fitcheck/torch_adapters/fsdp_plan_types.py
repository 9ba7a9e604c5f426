"""What an FSDP rewrite needs of one run (a plan): its units, their parameters and dtypes, and FSDP1's flat
parameters (:func:`flat_layout`); the error a rewrite raises when the plain run's events lack what it needs.

Built by :mod:`fitcheck.torch_adapters.fsdp2_run_plan` (``fsdp2_plan`` / ``fsdp1_plan``), used by the event walk
(:mod:`fitcheck.torch_adapters.fsdp_run_walk`) and the rewrites (``fsdp2_run_events`` / ``fsdp1_run_events``).
Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.torch_adapters.fsdp_params import Param


class FsdpReplayError(ValueError):
    """The plain run's events do not carry what the rewrite needs (a parameter's storage, a step)."""


@dataclass(frozen=True)
class Unit:
    """One ``fully_shard`` unit.

    Attributes:
        params: Its parameters in ``named_parameters`` order (a tied weight once).
        reshard: ``reshard_after_forward``.
        kind: ``embed``, ``layer``, ``tail`` or ``root``.
    """

    params: tuple[Param, ...]
    reshard: bool
    kind: str


@dataclass(frozen=True)
class FsdpPlan:
    """What the rewrite needs of an FSDP2 run.

    Attributes:
        world: Shards (processes in the FSDP group).
        units: The units in forward order (embed, layers, tail; the root's own parameters first when any).
        wrap_order: Indices of :attr:`units` in the order ``fully_shard`` is called (layers bottom-up, the
            embedding, the tail, the root).
        orig: Bytes of an element of the sharded parameters (fp32 after accelerate's upcast,
            ``core/states/fsdp_upcast.py``).
        compute: Bytes of ``MixedPrecisionPolicy.param_dtype`` (the gathered parameters).
        reduce: Bytes of ``reduce_dtype`` (the reduce-scatter buffers).
        traced: Bytes of an element of the traced module's parameters and gradients (the 16-bit module,
            ``kernels/module_cast.py``).
        tied: Whether the input embedding is the LM head (it then sits in the tail unit).
        accum: Forward and backward passes per optimizer step the plain run composes
            (``allocator_compose.replayed_micro_batches`` of ``gradient_accumulation_steps``): all but the last
            under ``no_sync``.
        resident: The model is on the device before FSDP wraps it (a bitsandbytes 4-bit base: transformers 5.23
            ``quantizer_bnb_4bit.py`` ``update_device_map`` loads it onto each rank's GPU), so each unit is made
            from the storages the load made, which it frees, not moved from the host (``fsdp_resident``).
    """

    world: int
    units: tuple[Unit, ...]
    wrap_order: tuple[int, ...]
    orig: int
    compute: int
    reduce: int
    traced: int
    tied: bool
    accum: int = 1
    resident: bool = False

    @property
    def params(self) -> list[Param]:
        """Every parameter, unit by unit in forward order."""
        return [p for u in self.units for p in u.params]

    def orig_of(self, q: Param) -> int:
        """Bytes of an element of ``q``'s shard."""
        return q.orig or self.orig

    def traced_of(self, q: Param) -> int:
        """Bytes of an element of ``q`` in the traced module (its parameter and its traced gradient)."""
        return q.traced or self.traced


@dataclass(frozen=True)
class Fsdp1Plan(FsdpPlan):
    """What the FSDP1 rewrite needs beyond :class:`FsdpPlan` (units: the root first, then the layers).

    Attributes:
        load: Bytes of an element of the model as loaded (what ``FullyShardedDataParallel`` moves and flattens,
            before accelerate's upcast).
        align: ``_aligned_numel`` (torch 2.13 ``_flat_param.py`` ``_get_aligned_numel``: 16 bytes over the
            ``param_dtype`` size, ``use_orig_params=True`` only).
        split: peft's ``fsdp_auto_wrap_policy``: each trainable parameter its own flat (:meth:`handles`).
        sync: ``sync_module_states`` (transformers 5.23 ``training_args.py``: ``fsdp_config`` default ``true``),
            whose broadcast buckets flatten their tensors into temporaries.
    """

    load: int = 2
    align: int = 0
    split: bool = False
    sync: bool = True

    def handles(self, u: int) -> list[tuple[Param, ...]]:
        """Unit ``u``'s flat parameters, each as its parameters: one, or under :attr:`split` (peft's
        ``fsdp_auto_wrap_policy``, which transformers 5.23 ``Trainer`` sets for a peft model under FSDP:
        ``distributed/fsdp.py`` ``update_fsdp_plugin_peft``; peft 0.21.2 ``utils/other.py``: every leaf module
        whose weight requires grad, i.e. each LoRA A and B, an FSDP unit of its own, nested in its layer's) the
        frozen ones, then each trainable one alone."""
        params = self.units[u].params
        if not self.split:
            return [params]
        frozen = tuple(q for q in params if q.frozen)
        return ([frozen] if frozen else []) + [(q,) for q in params if not q.frozen]

    def layout(self, u: int, k: int = 0) -> tuple[int, list[int]]:
        """Unit ``u``'s (``k``-th) padded flat numel and each parameter's offset in it (:func:`flat_layout`)."""
        return flat_layout([q.numel for q in self.handles(u)[k]], self.align, self.world)

    def shard(self, u: int, k: int = 0) -> int:
        """Elements of one rank's shard of unit ``u``'s (``k``-th) flat parameter (the whole flat at one
        process)."""
        return self.layout(u, k)[0] // self.world

    def flat_orig(self, u: int, k: int = 0) -> int:
        """Bytes of an element of the (``k``-th) flat parameter after ``prepare``: accelerate 1.15 upcasts a flat
        parameter with ``requires_grad`` only; a frozen one stays as loaded (:attr:`Param.orig`)."""
        return self.orig_of(self.handles(u)[k][0])

    def flat_load(self, u: int, k: int = 0) -> int:
        """Bytes of an element of the (``k``-th) flat parameter as loaded: peft's adapters fp32 (their traced
        dtype, :attr:`Param.traced`), the rest :attr:`load`."""
        return self.handles(u)[k][0].traced or self.load

    def trainable(self, u: int, k: int = 0) -> bool:
        """Whether the (``k``-th) flat parameter requires grad (torch 2.13 ``_flat_param.py``: the OR of its
        parameters')."""
        return any(not q.frozen for q in self.handles(u)[k])

    def in_shard(self, u: int, rank: int = 0, k: int = 0) -> list[int]:
        """Elements of each parameter of unit ``u``'s (``k``-th) flat inside rank ``rank``'s shard
        (``_shard_param_infos``: the optimizer sees these views; 0 where a parameter lies outside it)."""
        flat, offsets = self.layout(u, k)
        size = flat // self.world
        lo, hi = rank * size, (rank + 1) * size
        return [max(0, min(hi, o + q.numel) - max(lo, o)) for q, o in zip(self.handles(u)[k], offsets, strict=True)]


def flat_layout(numels: list[int], align: int, world: int) -> tuple[int, list[int]]:
    """A ``FlatParameter``'s padded numel and its tensors' offsets (torch 2.13 ``_flat_param.py``
    ``flatten_tensors``: each tensor starts at a multiple of ``align``, the total padded to a multiple of the world
    size; no padding at all where ``align`` is 0).

    Args:
        numels: The tensors' elements, in order.
        align: ``_aligned_numel``.
        world: The world size.

    Returns:
        (padded numel, offsets).
    """
    total, offsets = 0, []
    for n in numels:
        pad = align - total % align if align else 0
        if 0 < pad < align:
            total += pad
        offsets.append(total)
        total += n
    pad = world - total % world if align else 0
    if 0 < pad < world:
        total += pad
    return total, offsets
