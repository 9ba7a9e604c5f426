"""Predict the ``device_map="auto"`` placement offline, and which trainable parameters it puts on cpu/disk.

``from_pretrained(..., device_map="auto")`` places *weights* only: it fills the GPUs, then CPU RAM, then disk.
This module predicts that placement with the libraries' own placement code on a meta model and counts the
trainable parameters (for the run's full/LoRA/freezing regime) it offloads; the findings are
:mod:`fitcheck.torch_adapters.device_map_check`.

Predicted placement, as ``transformers.modeling_utils.PreTrainedModel.from_pretrained`` computes it
(transformers 5: ``transformers/integrations/accelerate.py::_get_device_map``): ``get_balanced_memory`` for
``auto``/``balanced`` (``get_max_memory`` for ``sequential``), then ``hf_quantizer.adjust_max_memory`` (x0.90
for bitsandbytes, ``quantizers/quantizer_bnb_4bit.py``), then ``infer_auto_device_map`` with
``no_split_module_classes=model._no_split_modules``. transformers 4.x used accelerate's own
``get_balanced_memory``/``infer_auto_device_map`` with ``special_dtypes``/``CustomDtype.INT4`` for 4-bit
weights: that path is the fallback here when the transformers 5 functions are missing.

torch, transformers and accelerate are imported lazily, inside the functions.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from fitcheck.spec import Dtype, LoraSpec, TrainingSpec

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
OFFLOAD_DEVICES = ("cpu", "disk")
# A CPU budget nobody runs out of: when no max_memory is given for "cpu", whatever does not fit on the GPUs
# goes to CPU RAM (accelerate's default is the host's available RAM, accelerate/utils/modeling.py::get_max_memory).
UNBOUNDED_CPU = 1 << 50


@dataclass(frozen=True)
class Placement:
    """A device map and what it does to the trainable parameters.

    Attributes:
        device_map: Module name -> device (GPU index, ``"cpu"`` or ``"disk"``), as from_pretrained gets it.
        max_memory: The per-device budget the placement used (after balancing and the quantizer's margin).
        offloaded_modules: device-map keys on cpu/disk that hold trainable parameters.
        offloaded_trainable_params: Trainable parameters (adapters counted, not their frozen hosts) offloaded.
        trainable_params: Trainable parameters in the whole model.
        offloaded_bytes: Bytes of weights placed on cpu/disk.
        quantizer_error: The error from_pretrained would raise for this map (bitsandbytes refuses CPU/disk
            offload of 4/8-bit models), if any.
    """

    device_map: Mapping[str, int | str]
    max_memory: Mapping[int | str, int]
    offloaded_modules: tuple[str, ...] = ()
    offloaded_trainable_params: int = 0
    trainable_params: int = 0
    offloaded_bytes: int = 0
    quantizer_error: str | None = None
    devices: tuple[int | str, ...] = field(default=())


def parse_max_memory(
    max_memory: str | Mapping[str, int | str] | Mapping[int | str, int | str] | None,
) -> dict[int | str, int]:
    """Turn ``"0=24GiB,cpu=200GiB"`` or ``{"0": n, "cpu": "200GiB"}`` into accelerate's form
    ``{0: bytes, "cpu": bytes}`` (GPU indices as ints).

    Raises:
        ConfigError: A malformed entry or size (names ``--max_memory``).
    """
    from fitcheck.errors import ConfigError
    from fitcheck.units import parse_bytes

    items: list[tuple[Any, Any]]
    if isinstance(max_memory, str):
        items = []
        for part in max_memory.replace(";", ",").split(","):
            if not part.strip():
                continue
            key, eq, value = part.partition("=")
            if not eq:
                raise ConfigError(f"--max_memory: {part!r} is not DEVICE=SIZE; write it like 0=24GiB,cpu=200GiB")
            items.append((key, value))
    else:
        items = list((max_memory or {}).items())
    out: dict[int | str, int] = {}
    for key, value in items:
        k = str(key).strip().lower()
        if not (k.isdigit() or k in ("cpu", "disk", "mps")):
            raise ConfigError(f"--max_memory: device {key!r} must be a GPU index, cpu or disk")
        out[int(k) if k.isdigit() else k] = parse_bytes(value if isinstance(value, (int, float, str)) else str(value),
                                                        what=f"--max_memory {k}")
    return out


def device_for(name: str, device_map: Mapping[str, int | str]) -> int | str | None:
    """The device of a parameter or module name: the longest device-map key that is a prefix of it."""
    best: tuple[int, int | str] | None = None
    for key, device in device_map.items():
        if (key == "" or name == key or name.startswith(key + ".")) and (best is None or len(key) > best[0]):
            best = (len(key), device)
    return None if best is None else best[1]



def _torch_dtype(dtype: Dtype) -> Any:
    import torch

    return {
        Dtype.FLOAT32: torch.float32,
        Dtype.BFLOAT16: torch.bfloat16,
        Dtype.FLOAT16: torch.float16,
    }.get(dtype, torch.float32)


def _bnb_config(spec: TrainingSpec) -> Any:
    """The BitsAndBytesConfig for spec.quant (transformers' class), or None (also for pre-quantized GPTQ/AWQ/FP8
    bases, which are sized by ``device_map_prequant.PackedSizes``: their quantizers need gptqmodel/kernels)."""
    if spec.quant is None or spec.quant.method != "bitsandbytes":
        return None
    from transformers import BitsAndBytesConfig

    compute = spec.quant.compute_dtype
    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=spec.quant.bits == 4,
        load_in_8bit=spec.quant.bits == 8,
        bnb_4bit_quant_type=spec.quant.quant_type,
        bnb_4bit_use_double_quant=spec.quant.double_quant,
        bnb_4bit_compute_dtype=_torch_dtype(compute) if compute is not None else None,
        llm_int8_skip_modules=list(spec.quant.skip_modules) or None,
    )


def build_meta_model(spec: TrainingSpec) -> tuple[Any, Any]:
    """Build the model class from ``spec.model.config`` on the meta device, as from_pretrained would load it.

    Returns:
        ``(model, hf_quantizer)``; the quantizer is None without a bitsandbytes base. With one, the model's
        Linear layers are replaced by bitsandbytes layers (``hf_quantizer.preprocess_model``, what
        from_pretrained does before placement).

    Raises:
        ValueError: When the config cannot be turned into a transformers model offline.
    """
    import torch
    import transformers
    from transformers import AutoConfig

    raw = dict(spec.model.config)
    model_type = str(raw.pop("model_type", None) or spec.model.shape.family)
    if not model_type:
        raise ValueError(f"{spec.model.model_id}: config has no model_type; cannot build the model offline")
    raw.pop("auto_map", None)  # never run remote code
    raw.pop("quantization_config", None)
    config = AutoConfig.for_model(model_type, **raw)
    dtype = _torch_dtype(spec.precision.load_dtype)
    arch = spec.model.shape.architecture
    model_cls = getattr(transformers, arch, None) if arch else None
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if model_cls is not None:
            model = model_cls._from_config(config, dtype=dtype)
        elif spec.model.shape.causal_lm:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
        else:
            model = transformers.AutoModel.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    quantizer = None
    bnb = _bnb_config(spec)
    if bnb is not None:
        from transformers.quantizers.auto import AutoHfQuantizer

        quantizer = AutoHfQuantizer.from_config(bnb)
        with contextlib.redirect_stderr(io.StringIO()):
            quantizer.preprocess_model(
                model=model, dtype=dtype, device_map="auto", checkpoint_files=None, use_kernels=False
            )
    if quantizer is None:  # GPTQ / AWQ / FP8: placed at their packed bytes (device_map_prequant.py)
        from fitcheck.torch_adapters.device_map_prequant import packed_sizes

        quantizer = packed_sizes(spec)
    return model, quantizer


def _infer_v5(model: Any, strategy: str, max_memory: dict[int | str, int], quantizer: Any) -> tuple[Any, Any]:
    """transformers >= 5: the exact steps of ``_get_device_map`` minus ``validate_environment``."""
    from transformers.integrations import accelerate as hf_acc

    no_split = model._no_split_modules
    if strategy != "sequential":
        mem = hf_acc.get_balanced_memory(
            model,
            max_memory=dict(max_memory),
            no_split_module_classes=no_split,
            hf_quantizer=quantizer,
            low_zero=strategy == "balanced_low_0",
        )
    else:
        mem = hf_acc.get_max_memory(dict(max_memory))
    if quantizer is not None:
        mem = quantizer.adjust_max_memory(mem)
    kwargs: dict[str, Any] = {"max_memory": mem, "no_split_module_classes": no_split, "hf_quantizer": quantizer}
    no_placement = getattr(model, "_no_placement_params", None)
    if no_placement is not None:
        kwargs["no_placement_params"] = no_placement
    return hf_acc.infer_auto_device_map(model, **kwargs), mem


def _infer_accelerate(
    model: Any, strategy: str, max_memory: dict[int | str, int], spec: TrainingSpec
) -> tuple[Any, Any]:
    """transformers 4.x: accelerate's functions, with 4-bit weights as ``CustomDtype.INT4`` special dtypes."""
    import torch
    from accelerate.utils import CustomDtype, get_balanced_memory, get_max_memory, infer_auto_device_map

    no_split = list(getattr(model, "_no_split_modules", None) or [])
    special: dict[str, Any] = {}
    if spec.quant is not None:
        target = CustomDtype.INT4 if spec.quant.bits == 4 else torch.int8
        skip = set(spec.quant.skip_modules) | {"lm_head"}
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] not in skip:
                special[f"{name}.weight"] = target
    dtype = _torch_dtype(spec.precision.load_dtype)
    if strategy != "sequential":
        mem = get_balanced_memory(
            model,
            max_memory=dict(max_memory),
            no_split_module_classes=no_split,
            dtype=dtype,
            special_dtypes=special or None,
            low_zero=strategy == "balanced_low_0",
        )
    else:
        mem = get_max_memory(dict(max_memory))
    if spec.quant is not None:
        # transformers 4.x Bnb4BitHfQuantizer.adjust_max_memory: "need more space for buffers" -> x0.90.
        mem = {k: v * 0.90 for k, v in mem.items()}
    dm = infer_auto_device_map(
        model, max_memory=mem, no_split_module_classes=no_split, dtype=dtype, special_dtypes=special or None
    )
    return dm, mem


def _lora_matcher(lora: LoraSpec, model: Any) -> SimpleNamespace:
    """An object with the attributes peft's ``check_target_module_exists`` reads, for spec.lora."""
    import torch

    targets: Any
    if lora.target_regex:
        targets = lora.target_regex
    elif [t.lower() for t in lora.target_modules] == ["all-linear"]:
        # peft tuners_utils._maybe_include_all_linear_layers: every Linear/Conv1D except the output embedding.
        out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        targets = {
            name.split(".")[-1]
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) or type(m).__name__ in ("Conv1D", "Linear4bit", "Linear8bitLt")
            if m is not out_emb
        }
        out_names = {n for n, m in model.named_modules() if m is out_emb}
        targets -= {n.split(".")[-1] for n in out_names}
    else:
        targets = list(lora.target_modules)
    return SimpleNamespace(
        target_modules=targets,
        exclude_modules=None,
        modules_to_save=list(lora.modules_to_save) or None,
        target_parameters=list(lora.target_parameters) or None,
        layers_to_transform=list(lora.layers_to_transform) if lora.layers_to_transform is not None else None,
        layers_pattern=None,
    )


def _is_lora_target(matcher: SimpleNamespace, name: str) -> bool:
    try:
        from peft.tuners.tuners_utils import check_target_module_exists
    except ImportError:  # peft missing: its documented suffix rule
        targets = matcher.target_modules
        if isinstance(targets, str):
            return re.fullmatch(targets, name) is not None
        return any(name == t or name.endswith("." + t) for t in targets)
    found = check_target_module_exists(matcher, name)
    return bool(found) and type(found).__name__ != "_ExcludedModule"


def trainable_by_module(spec: TrainingSpec, model: Any) -> dict[str, int]:
    """Module (or parameter) name -> trainable parameters it holds or hosts, for the spec's regime.

    Full fine-tune: every parameter. LoRA: r*(in+out) per targeted module (+ out for DoRA's magnitude), the
    parameters named in target_parameters, and modules_to_save in full. Freezing: the parameters matching the
    FreezeSpec patterns.
    """
    import fnmatch

    out: dict[str, int] = {}
    if spec.lora is not None:
        lora = spec.lora
        matcher = _lora_matcher(lora, model)
        for name, module in model.named_modules():
            if not name:
                continue
            if lora.modules_to_save and any(
                re.match(rf"(^|.*\.){re.escape(m)}$", name) for m in lora.modules_to_save
            ):
                out[name] = sum(p.numel() for p in module.parameters())
                continue
            weight = getattr(module, "weight", None)
            if weight is None or list(module.children()) or not _is_lora_target(matcher, name):
                continue
            in_f = getattr(module, "in_features", None) or (weight.shape[1] if weight.dim() > 1 else 0)
            out_f = getattr(module, "out_features", None) or weight.shape[0]
            out[name] = lora.r * (int(in_f) + int(out_f)) + (int(out_f) if lora.use_dora else 0)
        for pname, param in model.named_parameters():
            if any(pname == t or pname.endswith("." + t) for t in lora.target_parameters):
                shape = tuple(param.shape)
                experts = shape[0] if len(shape) == 3 else 1
                out[pname] = lora.r * experts * (shape[-1] + shape[-2])
        return out
    if spec.quant is not None:
        return out  # a quantized base is frozen; without adapters nothing trains
    if spec.freeze is not None:
        fz = spec.freeze
        for pname, param in model.named_parameters():
            layer = re.search(r"\.(\d+)\.", pname)
            generic = re.sub(r"\.\d+\.", ".*.", pname, count=1)
            ok = any(fnmatch.fnmatchcase(generic, p) or fnmatch.fnmatchcase(pname, p) for p in fz.trainable)
            if ok and fz.trainable_layers is not None and layer is not None:
                ok = int(layer.group(1)) in fz.trainable_layers
            if ok:
                out[pname] = param.numel()
        return out
    return {name: p.numel() for name, p in model.named_parameters()}


def predict_placement(
    spec: TrainingSpec,
    device_map: str,
    max_memory: str | Mapping[str, int] | Mapping[int | str, int] | None = None,
) -> Placement:
    """Compute the device map from_pretrained would build, and the trainable parameters it offloads.

    Args:
        spec: The run (model config, load dtype, LoRA/quantization/freezing, hardware).
        device_map: ``"auto"``, ``"balanced"``, ``"balanced_low_0"`` or ``"sequential"``.
        max_memory: Per-device budget in bytes (``{"0": ..., "cpu": ...}``). None: one GPU of
            ``spec.hardware.gpu_memory_bytes`` per process on a node, CPU RAM = ``host_memory_bytes`` (or
            unbounded) — with the 90% single-GPU margin transformers applies when the user sets none.

    Returns:
        The placement.
    """
    if device_map not in DEVICE_MAP_STRATEGIES:
        raise ValueError(f"device_map must be one of {', '.join(DEVICE_MAP_STRATEGIES)}; got {device_map!r}")
    mem = parse_max_memory(max_memory)
    if not mem:
        gpus = spec.sharding.processes_per_machine
        mem = {i: spec.hardware.gpu_memory_bytes for i in range(gpus)}
        if gpus == 1 and device_map != "sequential":
            # transformers get_balanced_memory: "90% is a good compromise" when max_memory is not set.
            mem[0] = int(mem[0] * 0.9)
        mem["cpu"] = spec.hardware.host_memory_bytes or UNBOUNDED_CPU
    elif "cpu" not in mem:
        mem["cpu"] = UNBOUNDED_CPU
    model, quantizer = build_meta_model(spec)
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging

        logging.getLogger("accelerate.utils.modeling").setLevel(logging.ERROR)
        try:
            from transformers.integrations import accelerate as hf_acc

            v5 = hasattr(hf_acc, "infer_auto_device_map") and hasattr(hf_acc, "get_balanced_memory")
        except ImportError:
            v5 = False
        if v5:
            dm, used = _infer_v5(model, device_map, mem, quantizer)
        else:
            dm, used = _infer_accelerate(model, device_map, mem, spec)
    dm = {str(k): v for k, v in dict(dm).items()}
    return _placement_from_map(spec, model, dm, used, quantizer)


def _placement_from_map(
    spec: TrainingSpec, model: Any, dm: Mapping[str, int | str], used: Mapping[Any, Any], quantizer: Any
) -> Placement:
    trainable = trainable_by_module(spec, model)
    offloaded: dict[str, int] = {}
    for name, count in trainable.items():
        device = device_for(name, dm)
        if device in OFFLOAD_DEVICES:
            key = max((k for k in dm if k == "" or name == k or name.startswith(k + ".")), key=len)
            offloaded[key] = offloaded.get(key, 0) + count
    off_bytes = 0
    for pname, param in model.named_parameters():
        if device_for(pname, dm) in OFFLOAD_DEVICES:
            size = quantizer.param_element_size(model, pname, param) if quantizer is not None else None
            off_bytes += int(param.numel() * (size if size is not None else param.element_size()))
    q_error = None
    bnb = quantizer is not None and hasattr(quantizer, "quantization_config")
    if bnb and any(d in OFFLOAD_DEVICES for d in dm.values()) and set(dm.values()) != {"cpu"}:
        # transformers quantizers/quantizer_bnb_4bit.py validate_environment raises this for such a map.
        q_error = (
            "from_pretrained refuses this map for a bitsandbytes model: 'Some modules are dispatched on the CPU "
            "or the disk. Make sure you have enough GPU RAM to fit the quantized model.'"
        )
    return Placement(
        device_map=dict(dm),
        max_memory={k: int(v) for k, v in used.items()},
        offloaded_modules=tuple(offloaded),
        offloaded_trainable_params=sum(offloaded.values()),
        trainable_params=sum(trainable.values()),
        offloaded_bytes=off_bytes,
        quantizer_error=q_error,
        devices=tuple(dict.fromkeys(dm.values())),
    )
