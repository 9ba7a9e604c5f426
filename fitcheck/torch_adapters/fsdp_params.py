"""The parameters the FSDP rewrites shard, read from the spec (:mod:`.fsdp2_run_plan` builds the units from them):
one decoder layer's and those outside the layers by role, a LoRA run's adapters with them (peft 0.21), a
bitsandbytes 4-bit base's packed weights (:func:`packed_param`), and what of a LoRA run the FSDP2 rewrite does not
describe. Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fitcheck.spec import Role, TrainingSpec

FP32 = 4


@dataclass(frozen=True)
class Param:
    """One parameter of a unit: its elements and its dim-0 size (FSDP2 shards dim 0).

    Attributes:
        numel: Elements.
        dim0: Size of dim 0.
        frozen: ``requires_grad=False`` (a LoRA run's base): no gradient, no reduce-scatter, no optimizer state.
        orig: Bytes of its sharded element where not the plan's :attr:`FsdpPlan.orig` (0: the plan's): a frozen
            base stays in its load dtype (accelerate upcasts ``requires_grad`` parameters only).
        traced: Bytes of its element in the traced module where not the plan's :attr:`FsdpPlan.traced` (0: the
            plan's): peft's fp32 adapters.
    """

    numel: int
    dim0: int
    frozen: bool = False
    orig: int = 0
    traced: int = 0

    def shard(self, world: int) -> int:
        """Elements of one rank's padded shard (``chunks[0]`` of ``torch.chunk`` on dim 0)."""
        rows = -(-self.dim0 // world) if self.dim0 else 0
        return rows * (self.numel // max(self.dim0, 1))

    def local(self, world: int, rank: int = 0) -> int:
        """Elements of rank ``rank``'s unpadded shard (the DTensor's local tensor: the optimizer states' size)."""
        rows = -(-self.dim0 // world) if self.dim0 else 0
        mine = max(0, min(rows, self.dim0 - rank * rows))
        return mine * (self.numel // max(self.dim0, 1))



def model_params(spec: TrainingSpec) -> tuple[tuple[Param, ...], dict[str, list[Param]], bool]:
    """One decoder layer's parameters and the ones outside the layers by role (``embed``, ``head``, ``norms``,
    ``rest``), each in ``named_parameters`` order, and whether the LM head is the input embedding (tied)."""
    params = spec.model.params
    outside = [p for p in params if not p.per_layer]
    tied = not any(p.role is Role.LM_HEAD for p in outside)

    def one(shape: tuple[int, ...]) -> Param:
        numel = 1
        for d in shape:
            numel *= d
        return Param(numel, shape[0] if shape else 1)

    layer = tuple(packed_param(spec, p) or one(p.shape) for p in params if p.per_layer)
    roles = {"embed": [one(p.shape) for p in outside if p.role is Role.EMBEDDING],
             "head": [one(p.shape) for p in outside if p.role is Role.LM_HEAD],
             "norms": [one(p.shape) for p in outside if p.role is Role.NORM],
             "rest": [packed_param(spec, p) or one(p.shape) for p in outside
                      if p.role not in (Role.EMBEDDING, Role.LM_HEAD, Role.NORM)]}
    if spec.lora is not None:
        layer, roles = _with_adapters(spec, [p for p in params if p.per_layer], roles)
    return layer, roles, tied


def _with_adapters(spec: TrainingSpec, entries: list[Any], roles: dict[str, list[Param]],
                   ) -> tuple[tuple[Param, ...], dict[str, list[Param]]]:
    """A LoRA run's layer and outside parameters: the base frozen in its load dtype (accelerate 1.15
    ``fsdp2_prepare_model`` upcasts ``param.requires_grad`` parameters only), each target's ``lora_A`` and
    ``lora_B`` after its weight (peft 0.21 ``LoraLayer``: ``base_layer``, ``lora_A``, ``lora_B`` in
    ``named_parameters``), fp32 sharded (the upcast; peft's ``autocast_adapter_dtype=True`` made them fp32 already)
    and fp32 in the traced module (``tracer_build._wrap_lora``: ``get_peft_model``'s defaults). :func:`not_replayed`
    admits adapters on every layer's targets only."""
    from fitcheck.core.states import plan_lora

    load = spec.precision.load_dtype.nbytes
    adapters = {t.entry.name: t for t in plan_lora(spec).targets}

    def frozen(q: Param) -> Param:  # a packed 4-bit weight keeps its storage dtype (packed_param)
        return Param(q.numel, q.dim0, frozen=True, orig=q.orig or load, traced=q.traced)

    def shaped(shape: tuple[int, ...]) -> Param:
        numel = 1
        for d in shape:
            numel *= d
        # fp32 whether or not accelerate upcasts: peft made them fp32, and the FSDP1 upcast skips an fp32 flat
        return Param(numel, shape[0], orig=FP32, traced=FP32)

    layer: list[Param] = []
    for p in entries:
        numel = 1
        for d in p.shape:
            numel *= d
        packed = packed_param(spec, p)
        layer.append(packed or Param(numel, p.shape[0] if p.shape else 1, frozen=True, orig=load))
        t = adapters.get(p.name)
        if t is not None:
            layer += [shaped(t.lora_a_shape), shaped(t.lora_b_shape)]
    return tuple(layer), {k: [frozen(q) for q in v] for k, v in roles.items()}


def packed_param(spec: TrainingSpec, entry: Any) -> Param | None:
    """A bitsandbytes 4-bit weight as FSDP flattens it (None for any other parameter): bitsandbytes 0.50.2
    ``nn/modules.py`` ``Params4bit`` holds the packed weight as ``[n / (2 * itemsize), 1]`` elements of
    ``bnb_4bit_quant_storage`` (``core/states/quantization.py`` ``quantized_bytes``), frozen, in that dtype in the
    traced module and on the device; its ``QuantState`` is a module attribute FSDP neither flattens nor frees
    (``core/states/fsdp_qlora.py``)."""
    from fitcheck.core.states import is_quantized, quantized_bytes

    quant = spec.quant
    if quant is None or quant.method != "bitsandbytes" or quant.bits != 4 or not is_quantized(spec, entry):
        return None
    size = quant.quant_storage.nbytes
    data = quantized_bytes(entry.numel_each, quant, entry.out_features or entry.shape[0]).data
    return Param(data // size, data // size, frozen=True, orig=size, traced=size)


def lora_not_replayed(spec: TrainingSpec) -> str:
    """What of a LoRA run the FSDP2 rewrite does not describe ("" for peft adapters on every decoder layer's
    targets over an unquantized base; also "" without LoRA)."""
    from fitcheck.core.states import plan_lora

    lora = spec.lora
    if lora is None:
        return ""
    plan = plan_lora(spec)
    odd = (lora.use_dora or plan.saved or plan.problems or lora.target_parameters
           or any(not t.entry.per_layer or t.layers != t.entry.repeat or t.magnitude or t.via_param_wrapper
                  for t in plan.targets))
    return "LoRA adapters other than A/B on every decoder layer (DoRA, modules_to_save, layers_to_transform, " \
           "targets outside the layers)" if odd else ""
