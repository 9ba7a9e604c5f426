"""Inspect a loaded model: what is really there, not what the flags said.

Reads parameter dtypes and devices, PEFT wrapping (LoRA layers, ``modules_to_save`` copies, ``ParamWrapper``
targets), bitsandbytes quantized modules (``Linear4bit``/``Params4bit``, ``Linear8bitLt``), which parameters
require gradients, checkpointing and ``use_cache``, and the accelerate device map, and turns them into the spec
pieces the estimator takes (:class:`~fitcheck.spec.LoraSpec`, :class:`~fitcheck.spec.QuantSpec`,
:class:`~fitcheck.spec.FreezeSpec`, the load dtype). DeepSpeed ZeRO-3 partitioned parameters are counted by
their ``ds_numel`` (the full size; ``numel()`` is 0 on a partitioned parameter).

Attribute names used, by library: peft ``tuners/lora/layer.py`` (``LoraLayer.r``, ``lora_A``,
``lora_dropout``, ``lora_magnitude_vector``, ``base_layer``), ``utils/other.py`` (``ModulesToSaveWrapper``);
bitsandbytes ``nn/modules.py`` (``Params4bit.quant_type``, ``blocksize``, ``compress_statistics``,
``quant_storage``; ``Linear4bit.compute_dtype``); transformers ``modeling_utils.py``
(``is_gradient_checkpointing``, ``hf_device_map``, ``config.use_cache``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fitcheck.findings import Finding
from fitcheck.spec import Dtype, FreezeSpec, LoraSpec, PeftAdapterSpec, QuantSpec

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True)
class LiveModelFacts:
    """What a loaded model holds.

    Attributes:
        model_id: ``config._name_or_path`` (or the class name).
        config: The base model's ``PretrainedConfig`` (None for a bare nn.Module).
        load_dtype: Dtype of most non-quantized, non-adapter parameters (what ``dtype=`` loaded), if floating.
        dtype_params: Parameter count per dtype name (adapters and quantized storage included).
        devices: Device types the parameters are on (``cuda``, ``cpu``, ``meta`` ...).
        total_params: Parameters, tied ones once, adapters included (4-bit weights as their element count).
        trainable_params: Parameters with ``requires_grad``.
        lora: The LoRA adapters found in the modules, if any.
        quant: The bitsandbytes quantization found in the modules, if any.
        freeze: Partial training without PEFT (some parameters frozen), if any.
        peft: A PEFT method other than LoRA, read from the model's ``peft_config`` (its active adapter), if any.
        gradient_checkpointing: ``model.is_gradient_checkpointing`` (False before ``Trainer.train`` turns it on).
        use_cache: ``config.use_cache``.
        hf_device_map: accelerate's device map when the model was dispatched.
        zero3_partitioned: Parameters carry DeepSpeed ZeRO-3 ``ds_numel``.
        notes: What was read and any approximation made, one line each.
    """

    model_id: str
    config: Any = field(compare=False, repr=False)
    load_dtype: Dtype | None
    dtype_params: dict[str, int]
    devices: tuple[str, ...]
    total_params: int
    trainable_params: int
    lora: LoraSpec | None = None
    quant: QuantSpec | None = None
    freeze: FreezeSpec | None = None
    peft: PeftAdapterSpec | None = None
    gradient_checkpointing: bool = False
    use_cache: bool | None = None
    hf_device_map: dict[str, Any] | None = None
    zero3_partitioned: bool = False
    notes: tuple[str, ...] = ()


def unwrap_model(model: Any) -> Any:
    """Strip DDP/DeepSpeed/accelerate wrappers (``.module``) and PEFT (``get_base_model``) down to the
    transformers model."""
    seen = 0
    while hasattr(model, "module") and seen < 8 and type(model).__name__ in (
        "DistributedDataParallel", "DataParallel", "DeepSpeedEngine", "FullyShardedDataParallel",
    ):
        model = model.module
        seen += 1
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    return model


def _numel(param: Any) -> int:
    ds = getattr(param, "ds_numel", None)  # DeepSpeed ZeRO-3 partitioned parameter: full element count
    if isinstance(ds, int):
        return ds
    n = int(param.numel())
    if type(param).__name__ == "Params4bit":
        return n * 2  # two 4-bit values per uint8 element (bitsandbytes packs weights as (numel // 2, 1))
    return n


def _dtype(param: Any) -> Dtype | None:
    return Dtype.from_name(param.dtype)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _lora_spec(model: Any) -> tuple[LoraSpec | None, list[str]]:
    """LoRA as the peft modules actually hold it (active adapter of each LoraLayer)."""
    notes: list[str] = []
    hosts: list[tuple[str, Any]] = []
    saved: list[str] = []
    target_params: list[str] = []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls == "ModulesToSaveWrapper":
            saved.append(_short(name))
        elif hasattr(module, "lora_A") and hasattr(module, "r") and isinstance(module.r, dict) and module.r:
            if cls == "ParamWrapper":
                pname = getattr(module, "parameter_name", None)
                if pname:
                    target_params.append(str(pname))
            else:
                hosts.append((name, module))
    if not hosts and not target_params:
        return None, notes
    ranks: Counter[int] = Counter()
    dropout = 0.0
    dora = False
    alpha = 8.0
    layers: set[int] = set()
    for name, module in hosts:
        adapter = next(iter(module.r))
        active = getattr(module, "active_adapters", None) or [adapter]
        adapter = active[0] if active[0] in module.r else adapter
        ranks[int(module.r[adapter])] += 1
        alpha = float(module.lora_alpha.get(adapter, alpha))
        drop = module.lora_dropout[adapter] if adapter in module.lora_dropout.keys() else None  # noqa: SIM118
        dropout = max(dropout, float(getattr(drop, "p", 0.0) or 0.0))
        mags = getattr(module, "lora_magnitude_vector", None)
        dora = dora or bool(mags is not None and adapter in mags)
        m = _LAYER_INDEX.search(name + ".")
        if m:
            layers.add(int(m.group(1)))
    r, _ = ranks.most_common(1)[0] if ranks else (8, 0)
    rank_pattern = {}
    if len(ranks) > 1:
        notes.append(f"LoRA ranks differ between modules ({dict(ranks)}): per-module ranks kept as rank_pattern")
        for name, module in hosts:
            adapter = next(iter(module.r))
            if int(module.r[adapter]) != r:
                rank_pattern[name] = int(module.r[adapter])
    targets = tuple(sorted({_short(n) for n, _ in hosts}))
    all_layers = {int(m.group(1)) for n, _ in model.named_modules() if (m := _LAYER_INDEX.search(n + "."))}
    layers_to_transform = tuple(sorted(layers)) if layers and layers != all_layers else None
    spec = LoraSpec(
        r=r,
        alpha=alpha,
        dropout=min(dropout, 0.999),
        target_modules=targets,
        modules_to_save=tuple(sorted(set(saved))),
        use_dora=dora,
        target_parameters=tuple(sorted(set(target_params))),
        layers_to_transform=layers_to_transform,
        rank_pattern=rank_pattern,
    )
    notes.append(f"read from the model's peft layers: LoRA r={r} on {len(hosts)} modules ({', '.join(targets)})")
    return spec, notes


def _quant_spec(model: Any, load: Dtype | None) -> tuple[QuantSpec | None, list[str]]:
    """bitsandbytes quantization as the modules hold it."""
    four = eight = None
    skip: set[str] = set()
    for module in model.modules():
        if hasattr(module, "base_layer"):  # peft's LoRA wrappers reuse the class names Linear4bit/Linear8bitLt
            continue
        weight_cls = type(getattr(module, "weight", None)).__name__
        if weight_cls == "Params4bit" and four is None:
            four = module
        elif weight_cls == "Int8Params" and eight is None:
            eight = module
    if four is None and eight is None:
        return None, []
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    if qc is not None:
        raw = qc if isinstance(qc, dict) else getattr(qc, "to_dict", lambda: {})()
        skip = set(raw.get("llm_int8_skip_modules") or [])
    # peft prepare_model_for_kbit_training casts every non-quantized 16-bit parameter to fp32; fp32 norms and
    # embeddings next to a 16-bit compute dtype say it ran.
    prepared = load is Dtype.FLOAT32
    if four is not None:
        w = four.weight
        compute = Dtype.from_name(getattr(four, "compute_dtype", None))
        storage = Dtype.from_name(getattr(w, "quant_storage", None) or w.dtype) or Dtype.UINT8
        spec = QuantSpec(
            bits=4,
            quant_type=str(getattr(w, "quant_type", "fp4")),
            double_quant=bool(getattr(w, "compress_statistics", False)),
            blocksize=int(getattr(w, "blocksize", 64) or 64),
            quant_storage=storage if storage is not Dtype.INT8 else Dtype.UINT8,
            compute_dtype=compute,
            skip_modules=tuple(sorted(skip)),
            prepare_for_kbit_training=prepared,
        )
        return spec, [f"read from the model's bitsandbytes layers: 4-bit {spec.quant_type}, blocksize "
                      f"{spec.blocksize}, double quant {spec.double_quant}"]
    # bitsandbytes 0.50.2 nn/modules.py Linear8bitLt.__init__: self.state.threshold = threshold (llm_int8_threshold)
    threshold = float(getattr(getattr(eight, "state", None), "threshold", QuantSpec.int8_threshold))
    return QuantSpec(bits=8, skip_modules=tuple(sorted(skip)), prepare_for_kbit_training=prepared,
                     int8_threshold=threshold), [
        f"read from the model's bitsandbytes layers: LLM.int8 (8-bit), outlier threshold {threshold:g}"
    ]


def _freeze_spec(names_trainable: list[str], names_all: list[str]) -> tuple[FreezeSpec | None, list[str]]:
    """Partial training without PEFT: generic names (layer index as ``*``) of trainable parameters."""
    if not names_trainable or len(names_trainable) == len(names_all):
        return None, []
    patterns = sorted({_LAYER_INDEX.sub(".*.", n, count=1) for n in names_trainable})
    layers = {int(m.group(1)) for n in names_trainable if (m := _LAYER_INDEX.search(n))}
    all_layers = {int(m.group(1)) for n in names_all if (m := _LAYER_INDEX.search(n))}
    trainable_layers = tuple(sorted(layers)) if layers and layers != all_layers else None
    notes = [f"{len(names_trainable)} of {len(names_all)} parameter tensors require grad: partial training"]
    if trainable_layers is not None:
        notes.append("trainable layer indices taken as one set for every trainable pattern")
    return FreezeSpec(trainable=tuple(patterns), trainable_layers=trainable_layers), notes


def _peft_adapter(model: Any) -> tuple[PeftAdapterSpec | None, list[str]]:
    """A PEFT method other than LoRA from the model's ``peft_config`` (peft 0.21.2 ``peft_model.py``
    ``PeftModel.peft_config``: adapter name -> ``PeftConfig``; ``active_adapter``), read by the adapter-config
    reader (``readers.adapter_from_object``). LoRA is read from its layers (:func:`_lora_spec`): None.

    Raises:
        NotModelledError: A PEFT method fitcheck does not estimate (BOFT, ...): its tensors would otherwise be
            estimated as partly frozen base parameters.
    """
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, Mapping) or not configs:
        return None, []
    active = getattr(model, "active_adapter", None)
    name = active if isinstance(active, str) and active in configs else next(iter(configs))
    config = configs[name]
    kind = getattr(config, "peft_type", None)
    if str(getattr(kind, "value", kind)).upper() == "LORA":
        return None, []
    from fitcheck.readers import adapter_from_object

    adapter = adapter_from_object(config, source=f"{type(model).__name__}.peft_config[{name!r}]")
    if not isinstance(adapter, PeftAdapterSpec):
        return None, []
    others = f" (the model holds {len(configs)} adapters; only the active one is estimated)" if len(configs) > 1 else ""
    return adapter, [f"read from the model's peft_config: {adapter.peft_type} adapter {name!r}{others}"]


def _checkpointing_on(model: Any) -> bool:
    """transformers 5 ``is_activation_checkpointing``; 4.x ``is_gradient_checkpointing`` (deprecated in 5)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def inspect_model(model: Any) -> LiveModelFacts:
    """Read what a loaded (possibly PEFT-wrapped, quantized, dispatched or DeepSpeed-partitioned) model holds.

    Args:
        model: The model the Trainer got (``PreTrainedModel``, ``PeftModel``, or a wrapper of either).

    Returns:
        The facts, with spec pieces for LoRA / quantization / freezing.
    """
    base = unwrap_model(model)
    outer = model
    while type(outer).__name__ in ("DistributedDataParallel", "DataParallel", "DeepSpeedEngine") and hasattr(
        outer, "module"
    ):
        outer = outer.module
    dtype_params: Counter[str] = Counter()
    devices: set[str] = set()
    total = trainable = 0
    zero3 = False
    plain: Counter[Dtype] = Counter()
    names_all: list[str] = []
    names_trainable: list[str] = []
    adapter_markers = ("lora_", "modules_to_save.", "original_module.")
    for name, p in outer.named_parameters():
        n = _numel(p)
        zero3 = zero3 or hasattr(p, "ds_numel")
        total += n
        dtype_params[str(p.dtype).replace("torch.", "")] += n
        devices.add(p.device.type)
        is_adapter = any(m in name for m in adapter_markers)
        if p.requires_grad:
            trainable += n
        if not is_adapter and type(p).__name__ not in ("Params4bit", "Int8Params"):
            dt = _dtype(p)
            if dt is not None and dt not in (Dtype.UINT8, Dtype.INT8):
                plain[dt] += n
            names_all.append(name)
            if p.requires_grad:
                names_trainable.append(name)
    load = plain.most_common(1)[0][0] if plain else None
    notes: list[str] = []
    peft, peft_notes = _peft_adapter(outer)
    notes += peft_notes
    lora, lora_notes = _lora_spec(outer)
    notes += lora_notes
    quant, quant_notes = _quant_spec(outer, load)
    notes += quant_notes
    if quant is not None and load is Dtype.FLOAT32 and quant.compute_dtype in (Dtype.BFLOAT16, Dtype.FLOAT16):
        load = quant.compute_dtype  # fp32 after prepare_model_for_kbit_training: it was loaded in compute dtype
    freeze = None
    if lora is None and quant is None and peft is None:  # an adapter's own tensors are no partial freezing
        freeze, freeze_notes = _freeze_spec(names_trainable, names_all)
        notes += freeze_notes
    config = getattr(base, "config", None)
    model_id = str(getattr(config, "_name_or_path", "") or type(base).__name__)
    dm = None
    for m in outer.modules():
        cand = getattr(m, "hf_device_map", None)
        if isinstance(cand, dict) and cand:
            dm = dict(cand)
            break
    return LiveModelFacts(
        model_id=model_id,
        config=config,
        load_dtype=load,
        dtype_params=dict(dtype_params),
        devices=tuple(sorted(devices)),
        total_params=total,
        trainable_params=trainable,
        lora=lora,
        quant=quant,
        freeze=freeze,
        peft=peft,
        gradient_checkpointing=_checkpointing_on(base),
        use_cache=getattr(config, "use_cache", None),
        hf_device_map=dm,
        zero3_partitioned=zero3,
        notes=tuple(notes),
    )


def config_mapping(config: Any) -> dict[str, Any]:
    """A ``PretrainedConfig`` as a config.json mapping (``to_dict``), for the inventory readers."""
    if isinstance(config, dict):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"{type(config).__name__} is not a transformers config")
    out = dict(to_dict())
    if out.get("model_type") is None and getattr(config, "model_type", None):
        out["model_type"] = config.model_type
    return out


def live_placement(model: Any) -> dict[str, int | str] | None:
    """The placement of a live model: ``hf_device_map`` when accelerate dispatched it, else None."""
    for module in model.modules():
        dm = getattr(module, "hf_device_map", None)
        if isinstance(dm, Mapping) and dm:
            prefix = ""
            for name, m in model.named_modules():
                if m is module:
                    prefix = f"{name}." if name else ""
                    break
            return {f"{prefix}{k}" if k else prefix.rstrip("."): v for k, v in dm.items()}
    return None


def _param_device(param: Any, module: Any) -> str:
    hook = getattr(module, "_hf_hook", None)
    if param.device.type == "meta" and hook is not None and getattr(hook, "offload", False):
        return "cpu"  # accelerate AlignDevicesHook(offload=True): the weight lives in the hook's weights_map
    return str(param.device.type)


def live_device_map_findings(model: Any, *, num_processes: int = 1) -> tuple[Finding, ...]:
    """The same check on a loaded model: trainable parameters (``requires_grad``) that sit on cpu/disk.

    Reads ``hf_device_map`` when accelerate dispatched the model (more than one device or disk); otherwise the
    parameters' own devices (a CPU-only model is not "offloaded").
    """
    from fitcheck.torch_adapters.device_map import OFFLOAD_DEVICES, Placement, device_for
    from fitcheck.torch_adapters.device_map_check import placement_findings

    dm = live_placement(model)
    trainable: dict[str, int] = {}
    module_of = dict(model.named_modules())
    device_types: set[str] = set()
    for name, param in model.named_parameters():
        owner = module_of.get(name.rsplit(".", 1)[0] if "." in name else "", model)
        dev = _param_device(param, owner)
        device_types.add(dev)
        if param.requires_grad:
            trainable[name] = param.numel()
    offloaded: dict[str, int] = {}
    if dm is not None:
        for name, count in trainable.items():
            if device_for(name, dm) in OFFLOAD_DEVICES:
                key = max((k for k in dm if k == "" or name == k or name.startswith(k + ".")), key=len)
                offloaded[key] = offloaded.get(key, 0) + count
        devices = tuple(dict.fromkeys(dm.values()))
    else:
        if device_types & {"cuda", "xpu", "npu", "mps"}:
            for name, param in model.named_parameters():
                owner = module_of.get(name.rsplit(".", 1)[0] if "." in name else "", model)
                if param.requires_grad and _param_device(param, owner) == "cpu":
                    key = name.rsplit(".", 1)[0]
                    offloaded[key] = offloaded.get(key, 0) + param.numel()
        devices = tuple(sorted(device_types))
    placement = Placement(
        device_map=dict(dm or {k: "cpu" for k in offloaded}),
        max_memory={},
        offloaded_modules=tuple(offloaded),
        offloaded_trainable_params=sum(offloaded.values()),
        trainable_params=sum(trainable.values()),
        devices=devices,
    )
    label = "The loaded model's device map" if dm is not None else "The loaded model"
    return placement_findings(placement, label=label, num_processes=num_processes)
