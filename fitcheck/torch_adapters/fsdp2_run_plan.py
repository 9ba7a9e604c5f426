"""Which FSDP2 runs ``fsdp2_run_events`` replays, and what its rewrite needs of one (a plan).

The units are accelerate 1.15's (``utils/fsdp_utils.py`` ``fsdp2_prepare_model``, as
``core/states/fsdp2_units.py`` describes them): every decoder layer (``reshard_after_forward`` from the config), an
untied input embedding, the tail ``[final norm, (tied embedding,) lm_head]`` with ``reshard_after_forward=False``,
and the root with what is left (``reshard_after_forward=None`` -> False for the root). Each parameter is sharded on
dim 0, padded to a multiple of the world size (torch 2.13 ``_fsdp_param.py`` ``_init_sharded_param``:
``padded_sharded_size = chunks[0].size()``). Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.spec import Role, TrainingSpec

FP32 = 4


class FsdpReplayError(ValueError):
    """The plain run's events do not carry what the rewrite needs (a parameter's storage, a step)."""


@dataclass(frozen=True)
class Param:
    """One parameter of a unit: its elements and its dim-0 size (FSDP2 shards dim 0)."""

    numel: int
    dim0: int

    def shard(self, world: int) -> int:
        """Elements of one rank's padded shard (``chunks[0]`` of ``torch.chunk`` on dim 0)."""
        rows = -(-self.dim0 // world) if self.dim0 else 0
        return rows * (self.numel // max(self.dim0, 1))

    def local(self, world: int, rank: int = 0) -> int:
        """Elements of rank ``rank``'s unpadded shard (the DTensor's local tensor: the optimizer states' size)."""
        rows = -(-self.dim0 // world) if self.dim0 else 0
        mine = max(0, min(rows, self.dim0 - rank * rows))
        return mine * (self.numel // max(self.dim0, 1))


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
    """

    world: int
    units: tuple[Unit, ...]
    wrap_order: tuple[int, ...]
    orig: int
    compute: int
    reduce: int
    traced: int
    tied: bool

    @property
    def params(self) -> list[Param]:
        """Every parameter, unit by unit in forward order."""
        return [p for u in self.units for p in u.params]


def not_replayed(spec: TrainingSpec) -> str:
    """What of an FSDP run :func:`fsdp2_run_events.fsdp2_run` does not describe ("" when it describes the run).

    Args:
        spec: An FSDP spec.

    Returns:
        The part not replayed, for the ``reserved-published-gap`` INFO, or "".
    """
    from fitcheck.spec import MixedPrecision
    from fitcheck.torch_adapters.deepspeed_run_plan import FUSED_ADAM

    fs = spec.sharding.fsdp
    parts = []
    if fs is None or fs.version != 2:
        return "FSDP1 (its flat parameters are not rewritten)"
    if fs.offload_params:
        parts.append("CPU offload of parameters")
    if fs.auto_wrap_policy != "TRANSFORMER_BASED_WRAP" or fs.wrap_unit_params:
        parts.append("a wrap policy other than one decoder layer per unit")
    if fs.sharding_strategy not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        parts.append(f"the {fs.sharding_strategy} strategy")
    if spec.precision.mixed_precision is MixedPrecision.NO:
        parts.append("no mixed precision (the plain run's replay answers)")
    if spec.lora is not None or spec.freeze is not None or spec.quant is not None:
        parts.append("frozen parameters or a quantized base")
    if spec.batch.grad_accum > 1:
        parts.append("gradient accumulation (unsharded gradients kept across micro-batches)")
    if spec.optimizer.name not in FUSED_ADAM:
        parts.append(f"the {spec.optimizer.name} optimizer on the shards (replayed: {FUSED_ADAM[0]})")
    if spec.sharding.parallelism is not None and spec.sharding.parallelism.active:
        parts.append("a tp/cp/sp layout")
    return "; ".join(parts)


def fsdp2_plan(spec: TrainingSpec) -> FsdpPlan:
    """The plan of an FSDP2 spec :func:`not_replayed` accepts.

    Args:
        spec: The training spec.

    Returns:
        Its units, world size and dtypes.
    """
    from fitcheck.core.kernels import deepspeed_module_view
    from fitcheck.core.states import fsdp_fp32_upcast, param_compute_bytes, partition

    fs = spec.sharding.fsdp
    reshard = fs.reshard_after_forward if fs is not None else True
    params = spec.model.params
    outside = [p for p in params if not p.per_layer]
    tied = not any(p.role is Role.LM_HEAD for p in outside)

    def one(shape: tuple[int, ...]) -> Param:
        numel = 1
        for d in shape:
            numel *= d
        return Param(numel, shape[0] if shape else 1)

    layer = tuple(one(p.shape) for p in params if p.per_layer)
    embed = [one(p.shape) for p in outside if p.role is Role.EMBEDDING]
    head = [one(p.shape) for p in outside if p.role is Role.LM_HEAD]
    norms = [one(p.shape) for p in outside if p.role is Role.NORM]
    rest = [one(p.shape) for p in outside if p.role not in (Role.EMBEDDING, Role.LM_HEAD, Role.NORM)]
    layers = [Unit(layer, reshard, "layer") for _ in range(spec.model.shape.num_layers)]
    tail = Unit(tuple(norms[-1:] + (embed if tied else head)), False, "tail")
    root = Unit(tuple(rest + norms[:-1]), False, "root") if rest or norms[:-1] else None
    front = [] if tied else [Unit(tuple(embed), reshard, "embed")]
    units = ([root] if root else []) + front + layers + [tail]
    first_layer = len(units) - len(layers) - 1
    order = list(range(first_layer, first_layer + len(layers))) + list(range(first_layer - len(front), first_layer))
    order += [len(units) - 1] + ([0] if root else [])
    orig = FP32 if fsdp_fp32_upcast(spec) else spec.precision.load_dtype.nbytes
    compute = param_compute_bytes(spec)
    traced = deepspeed_module_view(spec).precision.load_dtype.nbytes
    # accelerate 1.15 dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision (FSDP2):
    # MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    return FsdpPlan(max(partition(spec).weights, 1), tuple(units), tuple(order), orig, compute, compute, traced,
                    tied)
