"""Flat TrainingArguments / TRL ``ModelConfig`` values -> a :class:`~fitcheck.spec.TrainingSpec`.

Every other reader (command-line flags, a TrainingArguments file or object, a training script's argv, the
accelerate and DeepSpeed configs) ends in one flat mapping of the names users already pass to their scripts
(``per_device_train_batch_size``, ``bf16``, ``optim``, ``use_peft``, ``lora_r``, ``load_in_4bit``, ...). This
module turns them into the frozen spec: the values are read once into typed
:class:`~fitcheck.readers.run_settings.RunSettings` (defaults there, names and spellings in
:mod:`fitcheck.readers.settings_table`), and each part of the spec is built from those fields:

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

from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from fitcheck.core.states import TrlLoadDtype
from fitcheck.errors import ConfigError, short_repr
from fitcheck.findings import Finding
from fitcheck.readers.checkpoint_dtype import missing_dtype_finding
from fitcheck.readers.families_legacy import inventory_for_stack
from fitcheck.readers.parallelism import check_layout
from fitcheck.readers.run_settings import DEFAULT_GPU, DEFAULTS, RunSettings
from fitcheck.readers.settings_table import SETTINGS, canonical_key
from fitcheck.readers.trl_settings import sequence_length, trainer_spec, trl_default_layer, trl_name_load
from fitcheck.readers.versions import stack_from_values
from fitcheck.spec import (
    DEFAULT_OPTIMIZER,
    ActivationSpec,
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
    StackSpec,
    Strategy,
    TrainingSpec,
)

__all__ = ["PEFT_DEFAULT_TARGETS", "canonical_key", "load_dtype", "spec_from_settings", "spec_from_values"]

# peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (peft 0.21.2), for the catalog families.
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "phi": ("q_proj", "v_proj", "fc1", "fc2"),
    "gpt2": ("c_attn",),
    "bert": ("query", "value"),
    "falcon": ("query_key_value",),
    "bloom": ("query_key_value",),
}


def load_dtype(settings: RunSettings, model: ModelInventory, stack: StackSpec | None = None) -> tuple[Dtype, str]:
    """The dtype the model is loaded in, and a line saying why (``stack``: transformers 4.x loads float32; a TRL
    trainer given the model by name loads what its release passes, ``readers/trl_settings.py`` ``trl_name_load``)."""
    from fitcheck.readers.checkpoint_dtype import auto_dtype_without_config

    release = stack.release("transformers") if stack is not None else None
    by_trl = None if settings.given("dtype") else trl_name_load(settings, stack or StackSpec())
    if by_trl is not None and by_trl[0] is TrlLoadDtype.FLOAT32:
        return Dtype.FLOAT32, by_trl[1]
    if not settings.given("dtype") and by_trl is None and release is not None and release[0] < 5:
        return auto_dtype_without_config(model, stack or StackSpec())
    if settings.dtype is None:
        if model.shape.config_dtype is not None:
            source = "transformers 5 default" if by_trl is None else by_trl[1]
            return model.shape.config_dtype, f"dtype 'auto' ({source}): {model.shape.config_dtype.value} from " \
                "config.json"
        return auto_dtype_without_config(model, StackSpec())
    return settings.dtype, f"dtype {settings.dtype.value} ({settings.where('dtype')})"


def _lora(s: RunSettings, model: ModelInventory) -> LoraSpec | None:
    if not s.use_peft:
        return None
    targets = s.lora_target_modules
    if not targets:
        targets = PEFT_DEFAULT_TARGETS.get(model.shape.family)
        if targets is None:
            raise ConfigError(
                f"--lora_target_modules: peft has no default target modules for model type "
                f"{model.shape.family!r}; pass them, e.g. --lora_target_modules all-linear"
            )
    try:
        return LoraSpec(
            r=s.lora_r,
            alpha=s.lora_alpha,
            dropout=s.lora_dropout,
            target_modules=targets,
            modules_to_save=s.lora_modules_to_save,
            use_dora=s.use_dora,
            use_rslora=s.use_rslora,
            target_parameters=s.lora_target_parameters,
            layers_to_transform=s.lora_layers_to_transform or None,
        )
    except ValueError as exc:
        raise ConfigError(f"LoRA settings: {exc}") from None


def _quant(s: RunSettings, load: Dtype) -> QuantSpec | None:
    if s.load_in_4bit and s.load_in_8bit:
        raise ConfigError("--load_in_4bit and --load_in_8bit: pass only one of them")
    if not (s.load_in_4bit or s.load_in_8bit):
        return None
    try:
        return QuantSpec(
            bits=4 if s.load_in_4bit else 8,
            quant_type=(s.bnb_4bit_quant_type or DEFAULTS.bnb_4bit_quant_type).lower(),
            double_quant=s.use_bnb_nested_quant,
            blocksize=s.bnb_4bit_blocksize,
            quant_storage=s.bnb_4bit_quant_storage,
            compute_dtype=s.bnb_4bit_compute_dtype or load,
            skip_modules=s.llm_int8_skip_modules,
            prepare_for_kbit_training=s.prepare_for_kbit_training,
        )
    except ValueError as exc:
        raise ConfigError(f"quantization settings: {exc}") from None


def fsdp_qlora_skips_kbit(quant: QuantSpec, sharding: ShardingSpec) -> bool:
    """FSDP-QLoRA (a float ``bnb_4bit_quant_storage`` under FSDP) runs without peft's fp32 upcast of the other
    weights: TRL 1.16's SFTTrainer never calls ``prepare_model_for_kbit_training`` (trl/trainer/sft_trainer.py),
    and torch FSDP1 refuses to flatten fp32 norms with the 16-bit packed weights of a layer ("Must flatten
    tensors with uniform dtype", distributed/fsdp/_flat_param.py)."""
    return (
        sharding.strategy is Strategy.FSDP
        and quant.method == "bitsandbytes"
        and quant.bits == 4
        and quant.quant_storage in (Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32)
    )


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


def _hardware(s: RunSettings) -> tuple[HardwareSpec, list[str]]:
    from fitcheck.catalog import lookup_gpu, resolve_gpu

    notes: list[str] = []
    info = None
    if s.device_type is DeviceType.CPU and s.gpu is None:
        # A CPU run (--device_type cpu, TrainingArguments use_cpu): no GPU; its budget is the RAM given
        # (--gpu_memory, else --host_memory). An H100's memory would be another machine's answer.
        memory = s.gpu_memory if s.gpu_memory is not None else s.host_memory
        if memory is None:  # the command line and the integrations pass this machine's RAM; a library caller may not
            memory = lookup_gpu(DEFAULT_GPU).memory_bytes
            notes.append(f"CPU run given no memory: budget {memory / 2**30:.2f} GiB assumed; pass --host_memory")
        else:
            notes.append(
                f"CPU run: the budget is {'--gpu_memory' if s.gpu_memory is not None else '--host_memory'}")
        hw = HardwareSpec(gpu_name=None, gpu_memory_bytes=memory, device_type=s.device_type,
                          host_memory_bytes=s.host_memory, peak_tflops_bf16=None,
                          expandable_segments=s.expandable_segments)
        return hw, notes
    if s.gpu is not None:
        info, assumed = resolve_gpu(s.gpu)
        if assumed:
            notes.append(assumed)
    elif s.gpu_memory is None:
        info = lookup_gpu(DEFAULT_GPU)
        notes.append(f"no --gpu or --gpu_memory given: assuming {info.name}")
    memory = s.gpu_memory if s.gpu_memory is not None else (info.memory_bytes if info is not None else 0)
    hw = HardwareSpec(
        gpu_name=info.name if info is not None else None,
        gpu_memory_bytes=memory,
        device_type=s.device_type,
        host_memory_bytes=s.host_memory,
        peak_tflops_bf16=info.peak_tflops_bf16 if info is not None else None,
        expandable_segments=s.expandable_segments or _alloc_conf(s.cuda_alloc_conf),
        cuda_alloc_conf=s.cuda_alloc_conf,
    )
    return hw, notes


def _alloc_conf(text: str) -> bool:
    """Check a ``PYTORCH_CUDA_ALLOC_CONF`` value as torch parses it (``fitcheck.core.caching``); True when it turns
    expandable segments on."""
    from fitcheck.core.caching import AllocConfError, parse_alloc_conf

    try:
        return parse_alloc_conf(text).expandable_segments
    except AllocConfError as exc:
        raise ConfigError(
            f"--cuda_alloc_conf / PYTORCH_CUDA_ALLOC_CONF {text!r}: {exc}; torch refuses it at its first CUDA "
            "allocation: fix the value (e.g. 'expandable_segments:True,max_split_size_mb:128')"
        ) from None


def _precision(
    s: RunSettings, inventory: ModelInventory, assumptions: list[str], stack: StackSpec | None = None
) -> PrecisionSpec:
    load, why = load_dtype(s, inventory, stack)
    assumptions.append(why)
    if s.bf16 and s.fp16:
        raise ConfigError(f"{s.where('bf16')} and {s.where('fp16')}: pass only one of bf16 / fp16")
    return PrecisionSpec(load_dtype=load, mixed_precision=MixedPrecision.from_flags(s.bf16, s.fp16))


def _optimizer(
    s: RunSettings, assumptions: list[str], findings: list[Finding], stack: StackSpec
) -> OptimizerSpec:
    from fitcheck.core.optimizers import canonical_optimizer

    torch_release = stack.release("torch")
    old_torch = torch_release is not None and torch_release[:2] < (2, 8)
    default_optim = "adamw_torch" if old_torch else DEFAULT_OPTIMIZER  # training_args.py: fused only on torch >= 2.8
    if not s.given("optim"):
        when = f"torch {stack.get('torch')} < 2.8" if old_torch else "torch >= 2.8"
        assumptions.append(f"optim {default_optim} (TrainingArguments default on {when})")
    name, note = canonical_optimizer(s.optim or default_optim, stack.release("transformers"))
    if note is not None:
        findings.append(note)
    args: dict[str, str] = {}
    for part in (s.optim_args or "").split(",") if s.optim_args else ():
        if "=" not in part:
            raise ConfigError(f"{s.where('optim_args')}: expected key=value pairs, got {part!r}")
        k, v = part.split("=", 1)
        args[k.strip()] = v.strip()
    return OptimizerSpec(name=name, args=args, target_modules=s.optim_target_modules)


def _batch(s: RunSettings, assumptions: list[str]) -> BatchSpec:
    if not s.given("max_seq_length"):
        assumptions.append(f"max_seq_length {DEFAULTS.max_seq_length} (TRL SFTConfig.max_length default)")
    batch = BatchSpec(
        micro_batch=s.per_device_train_batch_size,
        seq_len=s.max_seq_length,
        grad_accum=s.gradient_accumulation_steps,
    )
    if not s.given("per_device_train_batch_size"):
        assumptions.append(
            f"per_device_train_batch_size {DEFAULTS.per_device_train_batch_size} (TrainingArguments default)"
        )
    return batch


def _sharding(s: RunSettings) -> ShardingSpec:
    n, m = s.num_processes, s.num_machines
    try:
        return ShardingSpec(strategy=Strategy.DDP if n > 1 else Strategy.SINGLE, num_processes=n, num_machines=m)
    except ValueError as exc:
        raise ConfigError(f"--num_processes/--num_machines: {exc}") from None


def _freeze(s: RunSettings) -> FreezeSpec | None:
    if not (s.trainable_parameters or s.trainable_layers):
        return None
    return FreezeSpec(trainable=s.trainable_parameters or ("*",), trainable_layers=s.trainable_layers or None)


def _quantization(s: RunSettings, load: Dtype, inventory: ModelInventory, findings: list[Finding]) -> QuantSpec | None:
    quant = _quant(s, load)
    pre = _pre_quantized(inventory)
    if isinstance(pre, QuantSpec) and pre.method == "mxfp4":
        # training holds MXFP4 experts dequantized (core/states/mxfp4.py): no quantized base, a finding instead
        from fitcheck.core.states import mxfp4_findings

        findings.extend(mxfp4_findings(inventory, load))
    elif isinstance(pre, QuantSpec):
        return pre
    elif pre is not None:
        findings.append(pre)
    return quant


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
        values: Canonical names or their aliases (see :mod:`fitcheck.readers.settings_table`) to values;
            strings are coerced.
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
    unknown = [k for k in values if canonical_key(str(k)) not in SETTINGS]
    if unknown:  # a misspelt name would be passed over and its default estimated
        import difflib

        hints = [f"{short_repr(k)}" + "".join(f" (did you mean {c!r}?)" for c in
                                              difflib.get_close_matches(str(k), sorted(SETTINGS), n=1))
                 for k in unknown[:5]]
        raise ConfigError("unknown setting " + ", ".join(hints) + "; names are `fitcheck estimate` flags, "
                          "TrainingArguments or TRL fields (fitcheck.readers.SETTINGS)")
    layered = {canonical_key(k): v for k, v in values.items() if v is not None}
    prov = dict(provenance or {})
    trl = trl_default_layer(layered)  # the trainer's TRL config defaults for absent settings
    settings = RunSettings.from_values(
        {**values, **{k: v for k, (v, _) in trl.items()}}, {**prov, **{k: w for k, (_, w) in trl.items()}}
    )
    return spec_from_settings(settings, inventory=inventory, sharding=sharding, findings=findings)


def spec_from_settings(
    settings: RunSettings,
    *,
    inventory: ModelInventory,
    sharding: ShardingSpec | None = None,
    findings: Sequence[Finding] = (),
) -> tuple[TrainingSpec, tuple[str, ...]]:
    """Build the spec from typed settings (see :func:`spec_from_values`); ``spec.trainer`` from the TRL fields."""
    s = settings
    seq = sequence_length(s)  # DPO/KTO/GRPO: prompt + completion
    if seq != s.max_seq_length:
        s = replace(s, max_seq_length=seq)
    assumptions: list[str] = []
    extra = list(findings)
    stack = stack_from_values({} if s.stack is None else {"stack": s.stack}, s.where("stack"))
    inventory = inventory_for_stack(inventory, stack)  # transformers 4.x layouts (families_legacy.py)
    precision = _precision(s, inventory, assumptions, stack)
    by_trl = None if s.given("dtype") else trl_name_load(s, stack)
    if not s.given("dtype") and inventory.shape.config_dtype is None and (
            by_trl is None or by_trl[0] is not TrlLoadDtype.FLOAT32):  # TRL's float32 reads no config dtype
        extra.append(missing_dtype_finding(inventory, precision.load_dtype))  # checkpoint_dtype.py
    optimizer = _optimizer(s, assumptions, extra, stack)
    batch = _batch(s, assumptions)
    from fitcheck.readers.kernel_settings import (  # --loss, Liger, offloading, use_reentrant, torch_compile
        lever_fields,
        reentrant_default_applied,
    )

    acts = ActivationSpec(
        checkpointing=s.gradient_checkpointing,
        checkpoint_every_n_layers=s.checkpoint_every_n_layers,
        attn_implementation=s.attn_implementation,
        **lever_fields(s, stack),
    )
    if acts.checkpointing and reentrant_default_applied(s, stack):
        assumptions.append(f"use_reentrant=True: the default of transformers {stack.get('transformers')} "
                           "(before 5.0; pass gradient_checkpointing_kwargs to choose)")
    if sharding is None:
        sharding = _sharding(s)
    hardware, hw_notes = _hardware(s)
    assumptions.extend(hw_notes)
    freeze = _freeze(s)
    quant = _quantization(s, precision.load_dtype, inventory, extra)
    if quant is not None and not s.given("prepare_for_kbit_training") and fsdp_qlora_skips_kbit(quant, sharding):
        quant = replace(quant, prepare_for_kbit_training=False)
    spec = TrainingSpec(
        model=inventory,
        precision=precision,
        optimizer=optimizer,
        batch=batch,
        activations=acts,
        sharding=sharding,
        hardware=hardware,
        lora=_lora(s, inventory),
        quant=quant,
        freeze=freeze,
        provenance=MappingProxyType(dict(s.provenance)),  # read-only after the readers
        findings=tuple(extra),
        stack=stack,
    )
    check_layout(spec)  # tp/cp/sp/HSDP sizes checked as accelerate checks them (exit 2)
    from fitcheck.readers.kernel_settings import refuse_peft_problems

    refuse_peft_problems(spec)  # what peft raises on (ParamWrapper + lora_dropout): exit 2, not a traceback
    try:
        trainer, notes = trainer_spec(s, spec)  # --trainer and TRL's config fields (readers/trl_settings.py)
    except ConfigError:
        raise
    except ValueError as exc:  # TrainerSpec's own checks (vllm_gpu_memory_utilization in (0, 1], ...)
        raise ConfigError(str(exc)) from None
    if trainer is not None:
        spec = replace(spec, trainer=trainer)
    if s.save_only_model:  # checkpoints without the optimizer (core/saving)
        spec = replace(spec, trainer=replace(spec.trainer, save_only_model=True))
    return spec, (*assumptions, *notes)
