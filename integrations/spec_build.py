"""Build a :class:`~fitcheck.spec.TrainingSpec` from what users hold in a script: a model (id, config or the
loaded model itself), a ``TrainingArguments``, a ``LoraConfig``, a ``BitsAndBytesConfig`` — and add the findings
only a live process can make (``use_cache`` with checkpointing, ``PYTORCH_CUDA_ALLOC_CONF``, eval batch).

Everything ends in the readers' flat values (``fitcheck.readers.trainer_args`` / ``merge`` /
``run_args.spec_from_values``), so a run described by objects and the same run described by flags give the
same spec. A loaded model then overrides what flags can only guess: its real load dtype, LoRA layers,
quantized layers and frozen parameters (``fitcheck.torch_adapters.live_model``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from fitcheck.findings import Finding, Severity
from fitcheck.spec import DeviceType, Dtype, ModelInventory, PeftAdapterSpec, TrainingSpec
from fitcheck.torch_adapters import meta_inventory
from fitcheck.units import format_bytes


def transformers_major() -> int:
    """Major version of the installed transformers (0 when it is not installed)."""
    try:
        import transformers
    except ImportError:
        return 0
    head = str(getattr(transformers, "__version__", "0")).split(".")[0]
    return int(head) if head.isdigit() else 0


def is_live_model(obj: object) -> bool:
    """True for a loaded torch module (not a config, not a string)."""
    return hasattr(obj, "named_parameters") and hasattr(obj, "modules")


def inventory_for(model_or_config: object, env: Mapping[str, str]) -> ModelInventory:
    """The parameter inventory of a model id/path, a ``PretrainedConfig``/config mapping, or a loaded model.

    A loaded model is inventoried from its (base) config: the live parameters add adapters and quantized
    storage, which :func:`apply_live_facts` reads separately.
    """
    from fitcheck.readers import inventory_from_config, load_inventory

    if isinstance(model_or_config, str):
        return load_inventory(model_or_config, env=env, meta_fallback=meta_inventory)
    from fitcheck.torch_adapters import config_mapping, unwrap_model

    source = "PretrainedConfig"
    config: Any = model_or_config
    if is_live_model(model_or_config):
        config = getattr(unwrap_model(model_or_config), "config", None)
        source = "loaded model's config"
        if config is None:
            from fitcheck.errors import UnsupportedModelError

            raise UnsupportedModelError(
                f"{type(model_or_config).__name__} has no transformers config: pass the model id or its config"
            )
    mapping = config_mapping(config)
    model_id = str(mapping.get("_name_or_path") or mapping.get("model_type") or "model")
    return inventory_from_config(mapping, model_id, source)


def training_args_values(args: object) -> tuple[dict[str, object], dict[str, str], list[Finding]]:
    """Flat canonical values of a ``TrainingArguments`` (or TRL config) object, with provenance strings."""
    from fitcheck.readers import read_training_args_object

    read = read_training_args_object(args, source=type(args).__name__)
    prov = {k: f"{src}.{key}" for k, (src, key) in read.provenance.items()}
    values = {k: _plain(v) for k, v in read.values.items()}
    return values, prov, list(read.findings)


def _plain(value: object) -> object:
    """Live config objects inside TrainingArguments (``AcceleratorConfig``, enums) as plain data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return getattr(value, "value", value) if type(value).__module__ != "builtins" else value


def lora_values(peft_config: object) -> dict[str, object]:
    """TRL-style flat values (``use_peft``, ``lora_r``, ...) of a peft ``LoraConfig`` (attribute names from
    peft/tuners/lora/config.py); a setting fitcheck does not model (``refuse_unmodelled_lora_settings``) raises
    ``NotModelledError``."""
    from fitcheck.readers import refuse_unmodelled_lora_settings

    get = peft_config.get if isinstance(peft_config, Mapping) else lambda k, d=None: getattr(peft_config, k, d)
    refuse_unmodelled_lora_settings(get, source=type(peft_config).__name__)
    targets = get("target_modules")
    out: dict[str, object] = {"use_peft": True, "lora_r": get("r", 8), "lora_alpha": get("lora_alpha", 8),
                              "lora_dropout": get("lora_dropout", 0.0)}
    if isinstance(targets, str):
        out["lora_target_modules"] = [targets]
    elif targets:
        out["lora_target_modules"] = sorted(str(t) for t in targets)
    for key, flag in (("modules_to_save", "lora_modules_to_save"), ("target_parameters", "lora_target_parameters")):
        items = get(key)
        if items:
            out[flag] = [str(x) for x in items]
    layers = get("layers_to_transform")
    if layers is not None:
        out["lora_layers_to_transform"] = [layers] if isinstance(layers, int) else list(layers)
    out["use_dora"] = bool(get("use_dora", False))
    out["use_rslora"] = bool(get("use_rslora", False))
    return out


def adapter_of(peft_config: object) -> PeftAdapterSpec | None:
    """A ``peft_config`` (``PeftConfig`` object or mapping) of a PEFT method other than LoRA as its adapter spec,
    read by the adapter-config reader; None for a LoRA config (:func:`lora_values` reads it).

    Raises:
        NotModelledError: A PEFT method fitcheck does not estimate.
    """
    from fitcheck.readers import adapter_from_mapping, adapter_from_object

    source = type(peft_config).__name__
    read = (adapter_from_mapping(peft_config, source=source) if isinstance(peft_config, Mapping)
            else adapter_from_object(peft_config, source=source))
    return read if isinstance(read, PeftAdapterSpec) else None


def quantization_values(bnb_config: object) -> dict[str, object]:
    """TRL-style flat values of a transformers ``BitsAndBytesConfig`` (transformers/utils/quantization_config.py)."""
    get = bnb_config.get if isinstance(bnb_config, Mapping) else lambda k, d=None: getattr(bnb_config, k, d)
    out: dict[str, object] = {}
    if get("load_in_4bit", False):
        out["load_in_4bit"] = True
        out["bnb_4bit_quant_type"] = get("bnb_4bit_quant_type", "fp4")
        out["use_bnb_nested_quant"] = bool(get("bnb_4bit_use_double_quant", False))
        for key in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
            value = get(key)
            if value is not None:
                out[key] = str(value).replace("torch.", "")
    elif get("load_in_8bit", False):
        out["load_in_8bit"] = True
    skip = get("llm_int8_skip_modules")
    if skip:
        out["llm_int8_skip_modules"] = list(skip)
    return out


def detect_hardware(device: Any = None) -> dict[str, object]:
    """``gpu``/``gpu_memory``/``device_type`` values for the device this process trains on.

    CUDA: the device's total memory and, when the GPU table knows it, its name. CPU: ``device_type cpu``
    with the host's RAM as the budget (CPU runs validate against live tensors, not a GPU).
    """
    import torch

    dev = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    )
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        out: dict[str, object] = {"device_type": "cuda", "gpu_memory": int(props.total_memory)}
        try:
            from fitcheck.catalog import lookup_gpu

            info = lookup_gpu(str(props.name))
            out["gpu"] = info.name
            out.pop("gpu_memory")
        except Exception:  # an unknown GPU name: its memory size is enough
            pass
        return out
    import psutil  # type: ignore[import-untyped]  # (accelerate's dependency)

    return {"device_type": "cpu", "gpu_memory": int(psutil.virtual_memory().total)}


def detected_gpu() -> dict[str, object]:
    """This machine's GPU when it has one (a preflight or the axolotl plugin on the training node); else nothing
    (the estimate's default GPU)."""
    try:
        import torch

        if torch.cuda.is_available():
            return detect_hardware()
    except Exception:  # no usable torch: the estimate's default GPU applies
        pass
    return {}


def expandable_segments_set(env: Mapping[str, str]) -> bool:
    """``PYTORCH_CUDA_ALLOC_CONF`` (or torch 2.9+'s ``PYTORCH_ALLOC_CONF``) has ``expandable_segments:True``."""
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + env.get("PYTORCH_ALLOC_CONF", "")
    return "expandable_segments:true" in conf.replace(" ", "").lower()


def build_spec(
    inventory: ModelInventory,
    values: Mapping[str, object],
    provenance: Mapping[str, str],
    findings: list[Finding],
    env: Mapping[str, str],
) -> tuple[TrainingSpec, tuple[str, ...]]:
    """Merge the values with the DeepSpeed/FSDP/accelerate settings they name, and build the spec.

    ``values`` may carry ``deepspeed`` (a file, or the resolved dict of a live ``TrainingArguments``),
    ``fsdp``/``fsdp_config`` (TrainingArguments fields) and ``config_file`` (an accelerate YAML). Files go
    through ``fitcheck.readers.merge.merge_sources`` (explicit values win over files), and so does a live
    ``deepspeed``/``fsdp_config`` dict (``TrainingArguments`` accepts a dict for both). accelerate's default
    config file is read only when named in ``config_file``: a script run with ``python`` or inside a launched
    process does not read it.
    """
    vals = dict(values)
    prov = dict(provenance)
    if "expandable_segments" not in vals and expandable_segments_set(env):
        vals["expandable_segments"] = True
        prov["expandable_segments"] = "environment PYTORCH_CUDA_ALLOC_CONF"
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF")
    if "cuda_alloc_conf" not in vals and conf:
        vals["cuda_alloc_conf"] = conf
        prov["cuda_alloc_conf"] = "environment PYTORCH_CUDA_ALLOC_CONF"
    fsdp = vals.pop("fsdp", None)
    fsdp_config = vals.pop("fsdp_config", None)
    if not fsdp:  # TrainingArguments always carries an fsdp_config dict; it matters only with fsdp set
        fsdp, fsdp_config = None, (fsdp_config if isinstance(fsdp_config, str) else None)
    from fitcheck.readers import merge_sources

    cli = {k: v for k, v in vals.items() if v is not None}
    accelerate_file = cli.pop("config_file", None)
    if fsdp_config is not None:
        cli["fsdp_config"] = fsdp_config
    if fsdp is True:  # transformers 5.23 _process_fsdp_args: `fsdp` becomes True, its options moved to fsdp_config
        cli["fsdp"], fsdp = True, None
    no_default = {**env, "HF_HOME": "/nonexistent/fitcheck-no-default-accelerate-config"}
    merged = merge_sources(
        cli,
        training_args_file=None,
        deepspeed_file=None,
        accelerate_config_file=str(accelerate_file) if accelerate_file else None,
        fsdp=" ".join(str(getattr(x, "value", x)) for x in fsdp) if isinstance(fsdp, (list, tuple))
        else str(fsdp) if fsdp else None,
        env=env if accelerate_file else no_default,
        hidden_size=inventory.shape.hidden_size,
        cli_provenance=prov,
    )
    merged_prov = {**prov, **{k: v for k, v in merged.provenance.items() if not v.startswith("--") or k not in prov}}
    from fitcheck.readers import spec_from_settings

    return spec_from_settings(
        dataclasses.replace(merged.settings, provenance=merged_prov),
        inventory=inventory,
        sharding=merged.sharding,
        # the values were read (and their spellings reported) before; the merge re-reads them as "command line"
        findings=[*findings, *(f for f in merged.findings if f.code not in ("spelling-read", "keys-passed-over"))],
    )


def apply_live_facts(spec: TrainingSpec, facts: Any) -> tuple[TrainingSpec, list[str]]:
    """Replace what flags guessed with what the loaded model holds (load dtype, LoRA, quantization, freezing).

    Returns:
        The spec and lines saying what was read from the model.
    """
    notes = [f"read from the loaded model: {n}" for n in facts.notes]
    precision = spec.precision
    if facts.load_dtype is not None and facts.load_dtype is not precision.load_dtype:
        notes.append(f"parameters are {facts.load_dtype.value} in the loaded model (flags said "
                     f"{precision.load_dtype.value})")
        precision = dataclasses.replace(precision, load_dtype=facts.load_dtype)
    lora, quant, freeze, peft = facts.lora, facts.quant, facts.freeze, facts.peft
    if peft is not None:
        notes.append(f"{peft.peft_type} adapters: estimated from peft's own model and a traced step")
    if lora is not None and spec.lora is not None:
        lora = dataclasses.replace(lora, alpha=spec.lora.alpha, use_rslora=spec.lora.use_rslora)
    if quant is not None and quant.compute_dtype is None and spec.quant is not None:
        quant = dataclasses.replace(quant, compute_dtype=spec.quant.compute_dtype)
    if lora is None and quant is None and freeze is None and peft is None and (
            facts.trainable_params == facts.total_params):
        notes.append("every parameter requires grad: full fine-tune")
    return dataclasses.replace(spec, precision=precision, lora=lora, quant=quant, freeze=freeze,
                               peft=peft), notes


def field_findings(
    spec: TrainingSpec,
    values: Mapping[str, object],
    env: Mapping[str, str],
    *,
    use_cache: bool | None = None,
    device_used_fraction: float | None = None,
    existing: Sequence[Finding] = (),
) -> tuple[Finding, ...]:
    """Lessons from the field that a flag-level estimate cannot see.

    Args:
        spec: The run.
        values: The flat values (for the eval batch and strategy).
        env: The process environment (``PYTORCH_CUDA_ALLOC_CONF``).
        use_cache: ``model.config.use_cache`` when known.
        device_used_fraction: Predicted device use / budget, when an estimate exists.
        existing: Findings the estimate already made (not repeated).
    """
    out: list[Finding] = []
    if spec.activations.checkpointing and use_cache:
        # transformers/modeling_layers.py GradientCheckpointingLayer: "Caching is incompatible with gradient
        # checkpointing ... Setting `use_cache=False`" (per forward); 4.x models did the same at model level.
        out.append(Finding(
            "use-cache-with-checkpointing", Severity.INFO,
            "gradient checkpointing is on and model.config.use_cache is True: transformers switches the KV cache "
            "off at every training forward (with a warning); custom layers outside transformers keep it, which "
            "costs memory.",
            "set model.config.use_cache = False before training",
        ))
    covered = any(f.code == "alloc-fragmentation" for f in existing)
    if spec.hardware.device_type is DeviceType.CUDA and not expandable_segments_set(env) and not covered and (
        device_used_fraction is not None and 0.85 < device_used_fraction <= 1.0
    ):
        # Variable-length batches make the caching allocator fragment (reserved >> allocated); expandable
        # segments (PyTorch CUDA semantics notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF") avoid it.
        out.append(Finding(
            "expandable-segments", Severity.WARNING,
            f"the run uses {device_used_fraction:.0%} of the GPU: fragmentation of the caching allocator "
            "(variable sequence lengths, growing batches) can push it over the edge.",
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the shell or launcher — it must be set "
            "before torch is imported; setting it inside the script after `import torch` has no effect",
        ))
    train_b = spec.batch.micro_batch
    eval_b = values.get("per_device_eval_batch_size")
    strategy = str(values.get("eval_strategy") or "no").lower()
    evaluates = strategy not in ("no", "intervalstrategy.no") or bool(values.get("do_eval"))
    if isinstance(eval_b, int) and evaluates and eval_b > train_b:
        v = spec.model.shape.vocab_size
        # Evaluation keeps the full logits of the eval batch (upcast to fp32 for the loss): b*s*V*4 bytes,
        # and, without eval_accumulation_steps, every batch's predictions stay on the GPU until the end.
        logits = eval_b * spec.batch.seq_len * v * Dtype.FLOAT32.nbytes
        out.append(Finding(
            "eval-batch-larger", Severity.WARNING,
            f"per_device_eval_batch_size={eval_b} is larger than the training micro-batch ({train_b}): the eval "
            f"forward alone holds {format_bytes(logits)} of fp32 logits at seq {spec.batch.seq_len}, on top of the "
            "weights and optimizer states that stay resident during evaluation.",
            "keep per_device_eval_batch_size <= per_device_train_batch_size, set eval_accumulation_steps, or "
            "prediction_loss_only=True when you do not need the logits",
        ))
    return tuple(out)
