"""Flat TrainingArguments / TRL ``ModelConfig`` values -> a :class:`~fitcheck.spec.TrainingSpec`.

Every other reader (command-line flags, a TrainingArguments file or object, a training script's argv, the
accelerate and DeepSpeed configs) ends in one flat mapping of the names users already pass to their scripts
(``per_device_train_batch_size``, ``bf16``, ``optim``, ``use_peft``, ``lora_r``, ``load_in_4bit``, ...). This
module is the single place that turns those values into the frozen spec, with the defaults the libraries use:

* ``dtype``: transformers 5 ``from_pretrained`` defaults to ``"auto"`` = the config's ``dtype``/``torch_dtype``
  (transformers/modeling_utils.py, ``if dtype is None: dtype = "auto"``); float32 when the config has none.
* ``optim``: ``adamw_torch_fused`` on torch >= 2.8 (transformers/training_args.py ``default_optim``).
* ``bf16``/``fp16``: False (training_args.py).
* LoRA: TRL ``ModelConfig`` defaults r=16, alpha=32, dropout=0.05; target modules default to peft's
  per-architecture table (peft/utils/constants.py ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``).
* ``max_seq_length``: TRL ``SFTConfig.max_length`` default 1024.
* BitsAndBytes: ``bnb_4bit_compute_dtype`` = ``dtype`` as TRL's ``get_quantization_config`` passes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding
from fitcheck.readers.sources import as_bool, as_float, as_int
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    Dtype,
    FreezeSpec,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    ModelInventory,
    OptimizerSpec,
    PrecisionSpec,
    QuantSpec,
    ShardingSpec,
    Strategy,
    TrainingSpec,
)
from fitcheck.units import parse_bytes

T = TypeVar("T")

DEFAULT_OPTIM = "adamw_torch_fused"  # transformers/training_args.py default_optim for torch >= 2.8
DEFAULT_SEQ_LEN = 1024  # TRL SFTConfig.max_length default
DEFAULT_GPU = "H100-80GB"

# peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (peft 0.21.2), for the catalog families.
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "phi": ("q_proj", "v_proj", "fc1", "fc2"),
    "gpt2": ("c_attn",),
    "bert": ("query", "value"),
    "falcon": ("query_key_value",),
    "bloom": ("query_key_value",),
}

# Names users paste for the same field; the first is canonical. transformers 5 renamed several.
ALIASES: dict[str, tuple[str, ...]] = {
    "dtype": ("torch_dtype",),
    "gradient_checkpointing": ("activation_checkpointing",),
    "max_seq_length": ("max_length", "seq_length", "model_max_length"),
    "use_bnb_nested_quant": ("bnb_4bit_use_double_quant",),
    "lora_target_modules": ("target_modules",),
    "lora_modules_to_save": ("modules_to_save",),
    "lora_r": ("r",),
}


def canonical_key(key: str) -> str:
    """Map an alias (``torch_dtype``, ``activation_checkpointing``, ``max_length``) to its canonical name."""
    k = key.replace("-", "_").lstrip("_")
    for canon, aliases in ALIASES.items():
        if k in aliases:
            return canon
    return k


def _where(key: str, provenance: Mapping[str, str]) -> str:
    return provenance.get(key, f"--{key}")


def _bool(values: Mapping[str, object], key: str, default: bool, prov: Mapping[str, str]) -> bool:
    v = values.get(key)
    return default if v is None else as_bool(v, at=_where(key, prov))


def _int(values: Mapping[str, object], key: str, default: int, prov: Mapping[str, str], minimum: int = 1) -> int:
    v = values.get(key)
    return default if v is None else as_int(v, at=_where(key, prov), minimum=minimum)


def _float(values: Mapping[str, object], key: str, default: float, prov: Mapping[str, str]) -> float:
    v = values.get(key)
    return default if v is None else as_float(v, at=_where(key, prov))


def _str_list(values: Mapping[str, object], key: str) -> tuple[str, ...] | None:
    v = values.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        parts = [p.strip() for p in v.replace(",", " ").split()]
        return tuple(p for p in parts if p)
    if isinstance(v, Sequence):
        return tuple(str(p) for p in v)
    return (str(v),)


def _choice(
    values: Mapping[str, object],
    key: str,
    convert: Callable[[str], T],
    default: T,
    prov: Mapping[str, str],
    allowed: str,
) -> T:
    v = values.get(key)
    if v is None:
        return default
    try:
        return convert(str(v).strip().lower())
    except (ValueError, KeyError):
        raise ConfigError(f"{_where(key, prov)}: {v!r} is not one of {allowed}") from None


def _dtype(name: str) -> Dtype:
    dtype = Dtype.from_name(name)
    if dtype is None or dtype is Dtype.INT8:  # int8 is no load, storage or compute dtype here
        raise KeyError(name)
    return dtype


def load_dtype(
    values: Mapping[str, object], model: ModelInventory, prov: Mapping[str, str]
) -> tuple[Dtype, str]:
    """The dtype the model is loaded in, and a line saying why."""
    raw = values.get("dtype")
    if raw is None or str(raw).strip().lower() == "auto":
        if model.shape.config_dtype is not None:
            return model.shape.config_dtype, (
                f"dtype 'auto' (transformers 5 default): {model.shape.config_dtype.value} from config.json"
            )
        return Dtype.FLOAT32, "dtype 'auto': config.json names no dtype, so float32"
    dt = _choice(values, "dtype", _dtype, Dtype.FLOAT32, prov, "auto, bfloat16, float16, float32")
    return dt, f"dtype {dt.value} ({_where('dtype', prov)})"


def _lora(values: Mapping[str, object], model: ModelInventory, prov: Mapping[str, str]) -> LoraSpec | None:
    if not _bool(values, "use_peft", False, prov):
        return None
    targets = _str_list(values, "lora_target_modules")
    if targets is None or not targets:
        targets = PEFT_DEFAULT_TARGETS.get(model.shape.family)
        if targets is None:
            raise ConfigError(
                f"--lora_target_modules: peft has no default target modules for model type "
                f"{model.shape.family!r}; pass them, e.g. --lora_target_modules all-linear"
            )
    layers = _str_list(values, "lora_layers_to_transform")
    try:
        return LoraSpec(
            r=_int(values, "lora_r", 16, prov),
            alpha=_float(values, "lora_alpha", 32.0, prov),
            dropout=_float(values, "lora_dropout", 0.05, prov),
            target_modules=targets,
            modules_to_save=_str_list(values, "lora_modules_to_save") or (),
            use_dora=_bool(values, "use_dora", False, prov),
            use_rslora=_bool(values, "use_rslora", False, prov),
            target_parameters=_str_list(values, "lora_target_parameters") or (),
            layers_to_transform=tuple(int(x) for x in layers) if layers else None,
        )
    except ValueError as exc:
        raise ConfigError(f"LoRA settings: {exc}") from None


def _quant(values: Mapping[str, object], load: Dtype, prov: Mapping[str, str]) -> QuantSpec | None:
    four = _bool(values, "load_in_4bit", False, prov)
    eight = _bool(values, "load_in_8bit", False, prov)
    if four and eight:
        raise ConfigError("--load_in_4bit and --load_in_8bit: pass only one of them")
    if not (four or eight):
        return None
    try:
        return QuantSpec(
            bits=4 if four else 8,
            quant_type=str(values.get("bnb_4bit_quant_type") or "nf4").lower(),
            double_quant=_bool(values, "use_bnb_nested_quant", False, prov),
            blocksize=_int(values, "bnb_4bit_blocksize", 64, prov),
            quant_storage=_choice(
                values,
                "bnb_4bit_quant_storage",
                _dtype,
                Dtype.UINT8,
                prov,
                "uint8, bfloat16, float16, float32",
            ),
            compute_dtype=_choice(
                values, "bnb_4bit_compute_dtype", _dtype, load, prov, "bfloat16, float16, float32"
            ),
            skip_modules=_str_list(values, "llm_int8_skip_modules") or (),
            prepare_for_kbit_training=_bool(values, "prepare_for_kbit_training", True, prov),
        )
    except ValueError as exc:
        raise ConfigError(f"quantization settings: {exc}") from None


def _pre_quantized(inventory: ModelInventory) -> QuantSpec | Finding | None:
    """A ``quantization_config`` already in config.json: the checkpoint's own quantization wins.

    transformers loads a pre-quantized checkpoint with the quantization stored in it (a
    ``quantization_config`` passed to ``from_pretrained`` is merged into, not instead of, the checkpoint's;
    transformers/quantizers/auto.py ``merge_quantization_configs``). Methods other than bitsandbytes come
    back as a "not modelled" finding, never as a silent 16-bit estimate.
    """
    if inventory.quantization_config is None:
        return None
    from fitcheck.readers.quantization_config import quant_from_model_config

    return quant_from_model_config(
        {"quantization_config": inventory.quantization_config}, source=f"{inventory.model_id} config.json"
    )


def _hardware(values: Mapping[str, object], prov: Mapping[str, str]) -> tuple[HardwareSpec, list[str]]:
    from fitcheck.catalog import lookup_gpu

    notes: list[str] = []
    device = _choice(values, "device_type", DeviceType, DeviceType.CUDA, prov, "cuda, cpu")
    host = values.get("host_memory")
    host_bytes = parse_bytes(str(host), what=_where("host_memory", prov)) if host is not None else None
    expandable = _bool(values, "expandable_segments", False, prov)
    gpu_memory = values.get("gpu_memory")
    gpu_name = values.get("gpu")
    info = None
    if gpu_name is not None:
        info = lookup_gpu(str(gpu_name))
    elif gpu_memory is None:
        info = lookup_gpu(DEFAULT_GPU)
        notes.append(f"no --gpu or --gpu_memory given: assuming {info.name}")
    memory = (
        parse_bytes(str(gpu_memory), what=_where("gpu_memory", prov))
        if gpu_memory is not None
        else (info.memory_bytes if info is not None else 0)
    )
    hw = HardwareSpec(
        gpu_name=info.name if info is not None else None,
        gpu_memory_bytes=memory,
        device_type=device,
        host_memory_bytes=host_bytes,
        peak_tflops_bf16=info.peak_tflops_bf16 if info is not None else None,
        expandable_segments=expandable,
    )
    return hw, notes


def spec_from_values(
    values: Mapping[str, object],
    *,
    inventory: ModelInventory,
    sharding: ShardingSpec | None = None,
    provenance: Mapping[str, str] | None = None,
    findings: Sequence[Finding] = (),
) -> tuple[TrainingSpec, tuple[str, ...]]:
    """Build the spec from flat TrainingArguments/TRL values.

    Args:
        values: Canonical names (see :data:`ALIASES`) to values; strings are coerced.
        inventory: The model's parameter inventory.
        sharding: Processes and sharding from the accelerate/DeepSpeed/FSDP readers; default: from
            ``num_processes``/``num_machines`` in ``values`` (DDP when more than one process).
        provenance: Canonical name -> where it was read (for error messages).
        findings: Findings the readers already made.

    Returns:
        The spec and the assumptions made (defaults taken), one line each.

    Raises:
        ConfigError: A value cannot be read; the message names where it came from and the fix.
    """
    prov = dict(provenance or {})
    vals = {canonical_key(k): v for k, v in values.items()}
    assumptions: list[str] = []
    load, why = load_dtype(vals, inventory, prov)
    assumptions.append(why)
    bf16 = _bool(vals, "bf16", False, prov)
    fp16 = _bool(vals, "fp16", False, prov)
    if bf16 and fp16:
        raise ConfigError(f"{_where('bf16', prov)} and {_where('fp16', prov)}: pass only one of bf16 / fp16")
    mixed = MixedPrecision.BF16 if bf16 else MixedPrecision.FP16 if fp16 else MixedPrecision.NO
    optim_name = str(vals.get("optim") or DEFAULT_OPTIM).strip().lower()
    if vals.get("optim") is None:
        assumptions.append(f"optim {DEFAULT_OPTIM} (TrainingArguments default on torch >= 2.8)")
    extra = list(findings)
    from fitcheck.core.optimizers import canonical_optimizer

    optim_name, note = canonical_optimizer(optim_name)
    if note is not None:
        extra.append(note)
    optim_args: dict[str, str] = {}
    raw_args = vals.get("optim_args")
    if raw_args:
        for part in str(raw_args).split(","):
            if "=" not in part:
                raise ConfigError(f"{_where('optim_args', prov)}: expected key=value pairs, got {part!r}")
            k, v = part.split("=", 1)
            optim_args[k.strip()] = v.strip()
    if vals.get("max_seq_length") is None:
        assumptions.append(f"max_seq_length {DEFAULT_SEQ_LEN} (TRL SFTConfig.max_length default)")
    batch = BatchSpec(
        micro_batch=_int(vals, "per_device_train_batch_size", 8, prov),
        seq_len=_int(vals, "max_seq_length", DEFAULT_SEQ_LEN, prov),
        grad_accum=_int(vals, "gradient_accumulation_steps", 1, prov),
    )
    if vals.get("per_device_train_batch_size") is None:
        assumptions.append("per_device_train_batch_size 8 (TrainingArguments default)")
    attn = _choice(
        vals, "attn_implementation", AttnImpl, AttnImpl.SDPA, prov, "eager, sdpa, flash_attention_2"
    )
    from fitcheck.readers.levers import lever_fields  # --loss, Liger, offloading, use_reentrant, torch_compile

    acts = ActivationSpec(
        checkpointing=_bool(vals, "gradient_checkpointing", False, prov),
        checkpoint_every_n_layers=_int(vals, "checkpoint_every_n_layers", 1, prov),
        attn_implementation=attn,
        **lever_fields(vals, prov),
    )
    if sharding is None:
        n = _int(vals, "num_processes", 1, prov)
        m = _int(vals, "num_machines", 1, prov)
        try:
            sharding = ShardingSpec(
                strategy=Strategy.DDP if n > 1 else Strategy.SINGLE, num_processes=n, num_machines=m
            )
        except ValueError as exc:
            raise ConfigError(f"--num_processes/--num_machines: {exc}") from None
    hardware, hw_notes = _hardware(vals, prov)
    assumptions.extend(hw_notes)
    freeze = None
    trainable = _str_list(vals, "trainable_parameters")
    layers = _str_list(vals, "trainable_layers")
    if trainable or layers:
        freeze = FreezeSpec(
            trainable=trainable or ("*",), trainable_layers=tuple(int(x) for x in layers) if layers else None
        )
    quant = _quant(vals, load, prov)
    pre = _pre_quantized(inventory)
    if isinstance(pre, QuantSpec):
        quant = pre
    elif pre is not None:
        extra.append(pre)
    spec = TrainingSpec(
        model=inventory,
        precision=PrecisionSpec(load_dtype=load, mixed_precision=mixed),
        optimizer=OptimizerSpec(
            name=optim_name,
            args=optim_args,
            target_modules=_str_list(vals, "optim_target_modules") or (),
        ),
        batch=batch,
        activations=acts,
        sharding=sharding,
        hardware=hardware,
        lora=_lora(vals, inventory, prov),
        quant=quant,
        freeze=freeze,
        provenance=prov,
        findings=tuple(extra),
    )
    from fitcheck.readers.levers import refuse_peft_problems

    refuse_peft_problems(spec)  # what peft raises on (ParamWrapper + lora_dropout): exit 2, not a traceback
    return spec, tuple(assumptions)
