"""PEFT LoRA as peft 0.21.2 builds it: which modules/parameters get adapters, and how many parameters each
adds.

Rules (peft source, ``site-packages/peft``):

* ``target_modules`` list: a module matches when its full name equals a target or ends with ``"." + target``
  (``tuners/tuners_utils.py::check_target_module_exists``); ``layers_to_transform`` keeps only those layer
  indices (first numbered segment of the name).
* ``target_modules="all-linear"``: every ``nn.Linear``/``Conv1D`` except the output embedding
  (``tuners_utils.py::_maybe_include_all_linear_layers``).
* ``target_regex`` (peft's string ``target_modules``): ``re.fullmatch`` over full module names.
* ``modules_to_save``: a full trainable copy of the module next to the frozen original (``utils/other.py::
  ModulesToSaveWrapper``); adapters never target those modules.
* transformers 5 MoE (Mixtral, Qwen2-MoE): peft rewrites v4 expert targets (``w1``/``w3``/``w2``/``gate``, or
  ``gate_proj``/``up_proj``/``down_proj``/``gate``) and ``all-linear`` into ``target_parameters`` on the fused
  3-D tensors, with rank ``2r`` on the fused ``gate_up_proj`` (``utils/transformers_weight_conversion.py::
  _convert_peft_config_moe``).
* ``target_parameters``: ``lora.ParamWrapper``; for a ``(E, d1, d2)`` tensor it builds ``lora_A: Linear(d2,
  r*E)``
  and ``lora_B: Linear(r*E, d1)`` -> ``r*E*(d1+d2)`` parameters; for a 2-D ``(out, in)`` tensor ``r*(in+out)``
  (``tuners/lora/layer.py::ParamWrapper``). It refuses ``lora_dropout != 0`` and DoRA.
* Linear targets: ``lora_A: (r, in)``, ``lora_B: (out, r)`` -> ``r*(in+out)``; DoRA adds a magnitude vector of
  ``out_features`` (``tuners/lora/layer.py::LoraLayer.update_layer``, ``tuners/lora/dora.py``).
* Adapters are fp32: ``get_peft_model(autocast_adapter_dtype=True)`` upcasts fp16/bf16 adapter weights
  (``tuners/tuners_utils.py::cast_adapter_dtype``); modules_to_save copies keep the base dtype (the wrapper is
  not a ``BaseTunerLayer``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass

from fitcheck.spec import Kind, LoraSpec, MoeConversion, ParamEntry, Role, TrainingSpec

_SRC_LINEAR = "peft 0.21.2 tuners/lora/layer.py LoraLayer.update_layer: lora_A (r,in) + lora_B (out,r)"
_SRC_PARAM = (
    "peft 0.21.2 tuners/lora/layer.py ParamWrapper.update_layer: lora_A (in, r*E) + lora_B (r*E, out)"
)

# peft utils/transformers_weight_conversion.py: v4 target names rewritten for transformers-5 fused MoE
# tensors.
_MOE_TARGET_MAPPING: dict[MoeConversion, dict[str, str]] = {
    MoeConversion.MIXTRAL: {"gate": "gate.weight", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"},
    MoeConversion.QWEN2_MOE: {
        "gate": "gate.weight",
        "gate_proj": "gate_up_proj",
        "up_proj": "gate_up_proj",
        "down_proj": "down_proj",
    },
}
# Which mapping applies to a model type: ``ModelShape.traits.moe_conversion`` (fitcheck/families/peft_moe.py).
# Fused targets whose rank peft multiplies by the number of v4 projections fused into them.
_MOE_FUSED: dict[MoeConversion, dict[str, tuple[str, ...]]] = {
    MoeConversion.MIXTRAL: {"gate_up_proj": ("w1", "w3")},
    MoeConversion.QWEN2_MOE: {"gate_up_proj": ("gate_proj", "up_proj")},
}


@dataclass(frozen=True)
class AdapterTarget:
    """Adapters on one parameter entry (possibly per layer).

    Attributes:
        entry: The base parameter the adapter wraps.
        layers: How many instances of the entry carry an adapter.
        rank: LoRA rank for this target.
        params_each: Adapter parameters per instance (A + B, + DoRA magnitude).
        lora_a_shape: Shape of lora_A of one instance.
        lora_b_shape: Shape of lora_B of one instance.
        magnitude: DoRA magnitude elements per instance (0 without DoRA).
        via_param_wrapper: True when peft wraps a raw parameter (``target_parameters``).
    """

    entry: ParamEntry
    layers: int
    rank: int
    params_each: int
    lora_a_shape: tuple[int, ...]
    lora_b_shape: tuple[int, ...]
    magnitude: int
    via_param_wrapper: bool

    @property
    def params(self) -> int:
        """Adapter parameters over all instances."""
        return self.params_each * self.layers


@dataclass(frozen=True)
class SavedModule:
    """A ``modules_to_save`` entry: a trainable full copy of the base parameter, the original kept frozen."""

    entry: ParamEntry

    @property
    def params(self) -> int:
        """Parameters of the copy."""
        return self.entry.numel


@dataclass(frozen=True)
class LoraPlan:
    """Everything peft adds for a LoRA spec.

    Attributes:
        targets: Adapter targets.
        saved: modules_to_save copies.
        problems: What peft would refuse (message, hint), e.g. ParamWrapper with dropout.
    """

    targets: tuple[AdapterTarget, ...]
    saved: tuple[SavedModule, ...]
    problems: tuple[tuple[str, str], ...] = ()

    @property
    def adapter_params(self) -> int:
        """LoRA A/B (+ DoRA magnitude) parameters."""
        return sum(t.params for t in self.targets)

    @property
    def saved_params(self) -> int:
        """Parameters of the modules_to_save copies."""
        return sum(s.params for s in self.saved)


def module_name(entry: ParamEntry) -> str:
    """Full module name of a parameter (``"model.layers.*.self_attn.q_proj"`` for ``...q_proj.weight``)."""
    return entry.name.rsplit(".", 1)[0] if "." in entry.name else entry.name


def _instances(name: str, repeat: int) -> Iterator[tuple[int | None, str]]:
    """Concrete names of each instance: the first ``*`` replaced by the layer index."""
    if "*" not in name:
        yield None, name
        return
    for i in range(repeat):
        yield i, name.replace("*", str(i), 1)


def _suffix_match(name: str, targets: tuple[str, ...] | set[str]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def _saved_match(name: str, saved: tuple[str, ...]) -> bool:
    # peft check_target_module_exists: modules_to_save names are excluded from adapter targeting.
    return any(re.match(rf"(^|.*\.){re.escape(m)}($|\..*)", name) for m in saved)


def _rank_for(lora: LoraSpec, key: str, rank_pattern: dict[str, int]) -> int:
    # peft utils/other.py get_pattern_key: re.match(rf"(.*\.)?({key})$", name).
    for pattern, rank in rank_pattern.items():
        if re.match(rf"(.*\.)?({pattern})$", key):
            return rank
    return lora.r


def _linear_dims(entry: ParamEntry) -> tuple[int, int]:
    if entry.in_features and entry.out_features:
        return entry.in_features, entry.out_features
    if len(entry.shape) == 2:
        return entry.shape[1], entry.shape[0]
    raise ValueError(f"{entry.name}: cannot tell in/out features of shape {entry.shape}")


def _is_weight(entry: ParamEntry) -> bool:
    return entry.name.endswith(".weight") or entry.kind is Kind.FUSED_EXPERTS


def _linear_target(entry: ParamEntry, lora: LoraSpec, layers: int, rank: int) -> AdapterTarget:
    fin, fout = _linear_dims(entry)
    magnitude = fout if lora.use_dora else 0
    return AdapterTarget(
        entry=entry,
        layers=layers,
        rank=rank,
        params_each=rank * (fin + fout) + magnitude,
        lora_a_shape=(rank, fin),
        lora_b_shape=(fout, rank),
        magnitude=magnitude,
        via_param_wrapper=False,
    )


def _param_target(entry: ParamEntry, layers: int, rank: int) -> AdapterTarget:
    shape = entry.shape
    if len(shape) == 3:
        experts, d1, d2 = shape
        # ParamWrapper swaps in/out for 3-D params that are not marked is_transposed: in=d2, out=d1.
        fin, fout = d2, d1
    elif len(shape) == 2:
        experts, fin, fout = 1, shape[1], shape[0]
    else:
        raise ValueError(f"{entry.name}: peft ParamWrapper supports 2-D and 3-D parameters, got {shape}")
    return AdapterTarget(
        entry=entry,
        layers=layers,
        rank=rank,
        params_each=rank * experts * (fin + fout),
        lora_a_shape=(rank * experts, fin),
        lora_b_shape=(fout, rank * experts),
        magnitude=0,
        via_param_wrapper=True,
    )


def _moe_rewrite(
    lora: LoraSpec, base: MoeConversion, params: tuple[ParamEntry, ...]
) -> tuple[set[str] | None, set[str], dict[str, int]]:
    """peft's v4->v5 MoE rewrite: (remaining module targets or None for regex, parameter targets, rank
    pattern)."""
    rank_pattern = dict(lora.rank_pattern)
    targets: set[str] = set(lora.target_modules)
    mapping = _MOE_TARGET_MAPPING.get(base)
    params_t: set[str] = set(lora.target_parameters)
    if mapping is None or lora.target_regex is not None:
        return (targets if lora.target_regex is None else None), params_t, rank_pattern
    if {t.lower() for t in targets} == {"all-linear"}:
        linear = {
            module_name(p).rsplit(".", 1)[-1]
            for p in params
            if p.kind is Kind.LINEAR and p.role is not Role.LM_HEAD
        }
        targets = linear | set(mapping)
    remaining: set[str] = set()
    matched: dict[str, set[str]] = {}
    for t in targets:
        hit = next(((old, new) for old, new in mapping.items() if t == old or t.endswith("." + old)), None)
        if hit is None:
            remaining.add(t)
            continue
        params_t.add(hit[1])
        matched.setdefault(hit[1], set()).add(hit[0])
    for fused, olds in _MOE_FUSED.get(base, {}).items():
        present = matched.get(fused, set())
        if len(present) == len(olds) and len(olds) > 1:
            rank_pattern[rf".*\.{re.escape(fused)}"] = lora.r * len(olds)
    return remaining, params_t, rank_pattern


def plan_lora(spec: TrainingSpec) -> LoraPlan:
    """Resolve a LoRA spec against the model inventory the way peft does.

    The plan depends on the LoRA spec and the model's parameters only; it is computed once per pair (the
    advisor and the batch search estimate hundreds of variants of one run, and the plan walks every layer).

    Args:
        spec: The training spec (``spec.lora`` must be set).

    Returns:
        The adapter targets, modules_to_save copies and the problems peft would raise on.
    """
    lora = spec.lora
    if lora is None:
        return LoraPlan((), ())
    key = _frozen(lora)
    if key is None:
        return _plan(lora, spec.model.params, spec.model.shape.traits.moe_conversion)
    conversion = spec.model.shape.traits.moe_conversion
    full = (key, spec.model.params, conversion)
    plan = _PLANS.get(full)
    if plan is None:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        plan = _PLANS[full] = _plan(lora, spec.model.params, conversion)
    return plan


# plan_lora's results by (LoRA spec, parameters, MoE conversion): a pure function's memo (LoraPlan is frozen).
_PLANS: dict[Hashable, LoraPlan] = {}


def _frozen(lora: LoraSpec) -> Hashable | None:
    """A hashable key equal for equal LoRA specs (mappings as sorted items), or None."""
    parts: list[object] = []
    for f in dataclasses.fields(lora):
        value = getattr(lora, f.name)
        parts.append(tuple(sorted(value.items())) if isinstance(value, Mapping) else value)
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _plan(lora: LoraSpec, params: tuple[ParamEntry, ...], conversion: MoeConversion) -> LoraPlan:
    module_targets, param_targets, rank_pattern = _moe_rewrite(lora, conversion, params)
    all_linear = module_targets is not None and {t.lower() for t in module_targets} == {"all-linear"}
    regex = re.compile(lora.target_regex) if lora.target_regex else None
    layer_filter = set(lora.layers_to_transform) if lora.layers_to_transform is not None else None

    targets: list[AdapterTarget] = []
    saved: list[SavedModule] = []
    problems: list[tuple[str, str]] = []
    for entry in params:
        mod = module_name(entry)
        counts: dict[tuple[bool, int], int] = {}  # (via param wrapper, rank) -> instances
        n_saved = 0
        for index, name in _instances(mod, entry.repeat):
            if lora.modules_to_save and _saved_match(name, lora.modules_to_save):
                n_saved += 1
                continue
            full_param = name + "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else name
            if param_targets and _suffix_match(full_param, param_targets):
                rank = _rank_for(lora, full_param, rank_pattern)
                counts[(True, rank)] = counts.get((True, rank), 0) + 1
                continue
            if entry.kind is not Kind.LINEAR or not _is_weight(entry):
                continue
            if regex is not None:
                hit = regex.fullmatch(name) is not None
            elif all_linear:
                hit = entry.role is not Role.LM_HEAD
            else:
                hit = module_targets is not None and _suffix_match(name, module_targets)
                if hit and layer_filter is not None and regex is None:
                    hit = index is not None and index in layer_filter
            if hit:
                rank = _rank_for(lora, name, rank_pattern)
                counts[(False, rank)] = counts.get((False, rank), 0) + 1
        for (wrapped, rank), n in counts.items():
            targets.append(_param_target(entry, n, rank) if wrapped else _linear_target(entry, lora, n, rank))
        if n_saved:
            saved.append(SavedModule(_with_repeat(entry, n_saved)))
    if any(t.via_param_wrapper for t in targets):
        wrapped_names = sorted({t.entry.name for t in targets if t.via_param_wrapper})
        if lora.dropout:
            problems.append(
                (
                    f"peft's lora.ParamWrapper (LoRA on raw parameters: {', '.join(wrapped_names)}) raises "
                    f"ValueError for lora_dropout != 0 (got {lora.dropout})",
                    "set --lora_dropout 0 (TRL's default is 0.05), or leave the fused experts/router out of "
                    "the targets",
                )
            )
        if lora.use_dora:
            problems.append(
                (
                    "peft's lora.ParamWrapper raises ValueError with use_dora=True "
                    f"({', '.join(wrapped_names)})",
                    "drop --use_dora, or leave the fused experts/router out of the targets",
                )
            )
    return LoraPlan(tuple(targets), tuple(saved), tuple(problems))


def _with_repeat(entry: ParamEntry, repeat: int) -> ParamEntry:
    return ParamEntry(
        name=entry.name,
        shape=entry.shape,
        role=entry.role,
        kind=entry.kind,
        repeat=repeat,
        module=entry.module,
        in_features=entry.in_features,
        out_features=entry.out_features,
    )


def adapter_param_count(spec: TrainingSpec) -> int:
    """Parameters peft adds to the model: LoRA A/B, DoRA magnitudes and modules_to_save copies.

    Args:
        spec: The training spec.

    Returns:
        The added parameter count (0 without LoRA).
    """
    plan = plan_lora(spec)
    return plan.adapter_params + plan.saved_params


def source_for(target: AdapterTarget) -> str:
    """The peft source line a target's count comes from."""
    return _SRC_PARAM if target.via_param_wrapper else _SRC_LINEAR
