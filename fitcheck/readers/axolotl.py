"""An axolotl YAML config read as ``fitcheck estimate`` settings, with axolotl's own defaults and normalisation.

axolotl 0.19.0 does not install with fitcheck's pinned stack (its wheel pins transformers==5.16.1, peft==0.20.0,
accelerate==1.13.0, trl==1.9.0), so its source is read at commit ``067b021c8b87a9e5e380b9173c704cf7340e30f5``
(github.com/axolotl-ai-cloud/axolotl); every rule below cites the file it comes from:

* defaults: ``utils/schemas/training.py`` (``micro_batch_size`` 1, ``gradient_accumulation_steps`` 1,
  ``optimizer`` adamw_torch_fused), ``utils/schemas/config.py`` (``sequence_len`` 512, ``gradient_checkpointing``
  false, ``activation_offloading`` false), ``utils/schemas/peft.py`` (``lora_dropout`` 0.0);
* dtypes: ``utils/config/__init__.py`` ``resolve_dtype``: ``bf16: auto`` is true on a GPU with bf16 (every GPU
  fitcheck's table targets from Ampere on); the model loads in bf16 when ``bf16``/``bfloat16``, fp16 when
  ``load_in_8bit``/``fp16``/``float16``, else fp32; ``core/builders/base.py`` passes ``bf16``/``fp16`` to the
  Trainer;
* QLoRA: ``loaders/model.py`` builds ``BitsAndBytesConfig(nf4, double quant, compute = load dtype, quant_storage
  bfloat16)`` updated by ``bnb_config_kwargs``; it runs peft's ``prepare_model_for_kbit_training`` and then
  casts norms and embeddings back to the load dtype (``_convert_embedding_modules_dtype``, L455-476), so the
  non-quantized parameters stay 16-bit: ``prepare_for_kbit_training`` false;
* ``lora_target_linear``: ``loaders/adapter.py`` ``find_all_linear_names`` (every Linear but the output head:
  peft's ``all-linear``);
* checkpointing: ``core/builders/base.py`` ``_configure_gradient_checkpointing`` (``use_reentrant`` false when no
  kwargs are given); ``activation_offloading: true`` is TRL's ``OffloadActivations`` with CUDA streams
  (``core/trainers/mixins/activation_checkpointing.py``) and, without an adapter, every decoder layer is
  checkpointed too (``loaders/model.py`` ``_apply_activation_checkpointing``); ``gradient_checkpointing: offload``
  is rewritten to both (``utils/schemas/validation.py`` ``check_gradient_checkpointing_w_offload``);
* ``sample_packing``: the multipack sampler packs ``micro_batch_size x sequence_len`` tokens per step
  (``core/trainers/base.py`` ``_create_multipack_sampler``): the same tokens as ``micro_batch_size`` rows of
  ``sequence_len``;
* plugins: ``integrations/cut_cross_entropy`` (``cut_cross_entropy`` true by default) is ``--loss cce``;
  ``integrations/liger`` switches (``liger_rope``, ``liger_rms_norm``, ``liger_glu_activation``,
  ``liger_fused_linear_cross_entropy``, ``liger_cross_entropy``) are ``--use_liger_kernel`` with that config;
* ``rl``: ``core/builders/rl.py``: dpo/ipo (TRL DPOTrainer, ``max_length`` = ``sequence_len``, ``beta`` from
  ``trl.beta`` or ``rl_beta``), kto, grpo (``trl:`` section).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.core.optimizers import canonical_optimizer
from fitcheck.errors import ConfigError, FitcheckError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.axolotl_keys import LIGER_SWITCHES, MAPPED, NO_MEMORY, REFUSED
from fitcheck.readers.framework_yaml import Collected as _Out
from fitcheck.readers.framework_yaml import FrameworkRun, load_framework_yaml, resolve_named_file
from fitcheck.readers.sources import as_bool, as_float, as_int, as_mapping, as_str, as_str_list

AXOLOTL_COMMIT = "067b021c8b87a9e5e380b9173c704cf7340e30f5"
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
FITCHECK_PLUGIN = "fitcheck.integrations.axolotl_plugin.FitcheckPlugin"
_FLASH = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn", "kernels-community/flash-attn3",
          "kernels-community/vllm-flash-attn3")

def read_axolotl(path: str, *, cwd: str, overrides: Mapping[str, object] | None = None) -> FrameworkRun:
    """Read an axolotl config file as ``fitcheck estimate`` settings.

    Args:
        path: The YAML file (what ``axolotl train FILE`` takes).
        cwd: Working directory, the last place a named DeepSpeed file is looked for.
        overrides: Keys given on the framework's own command line (they replace the file's, as the framework's
            CLI does).

    Returns:
        The settings with where each was read, findings and the defaults applied.

    Raises:
        ConfigError: Bad values, and every key that changes memory and is not modelled (each named, with why).
    """
    raw = {**load_framework_yaml(path, what="axolotl config (--axolotl)"), **(overrides or {})}
    out = _Out(path)
    try:
        _read(raw, out, cwd)
    except FitcheckError as exc:
        out.problems.extend(exc.problems if isinstance(exc, ConfigError) else [str(exc)])
    for key in sorted(REFUSED):
        if key in raw and raw[key] not in (None, False, 0, "", [], {}):
            out.refuse(key, REFUSED[key])
    if out.problems:
        raise ConfigError.collect(sorted(set(out.problems), key=out.problems.index))
    unknown = sorted(
        k for k in raw if raw[k] is not None and k not in MAPPED and k not in NO_MEMORY and k not in REFUSED)
    if unknown:
        out.findings.append(Finding(
            "unknown-keys", Severity.WARNING,
            f"{path}: {len(unknown)} key(s) fitcheck does not know from axolotl (commit {AXOLOTL_COMMIT[:10]}) were "
            "passed over: " + ", ".join(unknown[:20]) + (" ..." if len(unknown) > 20 else ""),
            "check the spelling; a key that changes memory would need to be modelled",
        ))
    if overrides:
        out.notes.append(f"{path}: command-line overrides " + ", ".join(f"{k}={v!r}" for k, v in overrides.items()))
    return FrameworkRun(out.values, out.where, tuple(out.findings), tuple(out.notes))


def _get(raw: Mapping[str, object], key: str, default: object = None) -> Any:
    value = raw.get(key)
    return default if value is None else value


def _at(out: _Out, key: str) -> str:
    return f"{out.path}:{key}"


def _read(raw: Mapping[str, object], out: _Out, cwd: str) -> None:
    model = raw.get("base_model_config") or raw.get("base_model")
    if not model:
        raise ConfigError(f"{out.path}: base_model is required (the model axolotl trains)")
    out.set("model_name_or_path", as_str(model, at=_at(out, "base_model")),
            "base_model_config" if raw.get("base_model_config") else "base_model")
    _batch(raw, out)
    adapter = _adapter(raw, out)
    _precision(raw, out)
    _optimizer(raw, out)
    _checkpointing(raw, out, adapter)
    _attention(raw, out)
    _quantization(raw, out, adapter)
    _plugins(raw, out)
    _sharding(raw, out, cwd)
    _rl(raw, out)
    _lora_kernels(raw, out, adapter)
    if raw.get("sample_packing"):
        mbs, seq = out.values["per_device_train_batch_size"], out.values["max_seq_length"]
        out.notes.append(
            f"sample_packing: axolotl's multipack sampler fills {mbs} x {seq} tokens per micro-batch "
            "(core/trainers/base.py _create_multipack_sampler); estimated as that many full rows")
    if raw.get("torch_compile") not in (None, False, "auto"):
        out.set("torch_compile", as_bool(raw["torch_compile"], at=_at(out, "torch_compile")), "torch_compile")
    mqc = raw.get("model_quantization_config")
    if mqc is not None:
        kwargs = as_mapping(raw.get("model_quantization_config_kwargs") or {},
                            at=_at(out, "model_quantization_config_kwargs"))
        if mqc == "Mxfp4Config" and as_bool(kwargs.get("dequantize", False), at=_at(out, "dequantize")):
            out.notes.append("model_quantization_config Mxfp4Config with dequantize: true loads the weights "
                             "dequantized in the load dtype (transformers Mxfp4Config)")
        else:
            out.refuse("model_quantization_config", f"{mqc!r} without dequantize: true (a quantized base "
                       "other than bitsandbytes) is not modelled")


def _batch(raw: Mapping[str, object], out: _Out) -> None:
    mbs = as_int(_get(raw, "micro_batch_size", 1), at=_at(out, "micro_batch_size"), minimum=1)
    out.set("per_device_train_batch_size", mbs, "micro_batch_size")
    if raw.get("gradient_accumulation_steps") is not None:
        gas = as_int(raw["gradient_accumulation_steps"], at=_at(out, "gradient_accumulation_steps"), minimum=1)
        out.set("gradient_accumulation_steps", gas, "gradient_accumulation_steps")
    elif raw.get("batch_size") is not None:  # utils/config normalize_config: batch_size // micro_batch_size
        total = as_int(raw["batch_size"], at=_at(out, "batch_size"), minimum=1)
        out.set("gradient_accumulation_steps", max(1, total // mbs), "batch_size")
    else:
        out.set("gradient_accumulation_steps", 1, "gradient_accumulation_steps (axolotl default 1)")
    seq = as_int(_get(raw, "sequence_len", 512), at=_at(out, "sequence_len"), minimum=1)
    out.set("max_seq_length", seq, "sequence_len" if "sequence_len" in raw else "sequence_len (axolotl default 512)")


def _adapter(raw: Mapping[str, object], out: _Out) -> str | None:
    adapter = raw.get("adapter")
    if adapter in (None, ""):
        if raw.get("load_in_4bit") or raw.get("load_in_8bit"):
            raise ConfigError(f"{out.path}: load_in_4bit/load_in_8bit need adapter: lora or qlora (axolotl's "
                              "LoraConfig.validate_adapter refuses them for a full fine-tune)")
        return None
    if adapter not in ("lora", "qlora"):
        out.refuse("adapter", f"{adapter!r}: only lora and qlora adapters are modelled")
        return None
    out.set("use_peft", True, "adapter")
    if raw.get("lora_r") is None:  # loaders/adapter.py passes r=cfg.lora_r to peft's LoraConfig
        raise ConfigError(f"{_at(out, 'lora_r')}: adapter: {adapter} needs lora_r (the LoRA rank); add it")
    out.set("lora_r", as_int(raw["lora_r"], at=_at(out, "lora_r"), minimum=1), "lora_r")
    if raw.get("lora_alpha") is not None:
        out.set("lora_alpha", as_float(raw["lora_alpha"], at=_at(out, "lora_alpha")), "lora_alpha")
    out.set("lora_dropout", as_float(_get(raw, "lora_dropout", 0.0), at=_at(out, "lora_dropout")), "lora_dropout")
    if raw.get("lora_target_linear"):
        out.set("lora_target_modules", ("all-linear",), "lora_target_linear")
    elif raw.get("lora_target_modules"):
        out.set("lora_target_modules", as_str_list(raw["lora_target_modules"], at=_at(out, "lora_target_modules")),
                "lora_target_modules")
    for key, name in (("lora_target_parameters", "lora_target_parameters"),
                      ("lora_modules_to_save", "lora_modules_to_save")):
        if raw.get(key):
            out.set(name, as_str_list(raw[key], at=_at(out, key)), key)
    if raw.get("peft_layers_to_transform"):
        layers = raw["peft_layers_to_transform"]
        items = layers if isinstance(layers, list) else [layers]
        out.set("lora_layers_to_transform", tuple(as_int(x, at=_at(out, "peft_layers_to_transform")) for x in items),
                "peft_layers_to_transform")
    for key, name in (("peft_use_dora", "use_dora"), ("peft_use_rslora", "use_rslora")):
        if raw.get(key) is not None:
            out.set(name, as_bool(raw[key], at=_at(out, key)), key)
    return str(adapter)


def _precision(raw: Mapping[str, object], out: _Out) -> None:
    """``resolve_dtype`` (utils/config/__init__.py) and the Trainer's bf16/fp16 (core/builders/base.py)."""
    bf16_raw = raw.get("bf16")
    fp16 = as_bool(raw["fp16"], at=_at(out, "fp16")) if raw.get("fp16") is not None else False
    if bf16_raw == "full":
        out.refuse("bf16", "'full' (pure bf16 without autocast, bf16 optimizer states) is not translated; pass "
                   "bf16: true")
        return
    if bf16_raw == "auto":
        bf16 = not fp16
        if bf16:
            out.notes.append("bf16: auto read as true: axolotl turns it on where the GPU supports bf16 "
                             "(resolve_dtype); pass --bf16 false --fp16 true for a GPU without bf16")
    else:
        bf16 = as_bool(bf16_raw, at=_at(out, "bf16")) if bf16_raw is not None else False
    bfloat16 = bool(raw.get("bfloat16"))
    fp16 = fp16 and not bf16
    if bf16 or bfloat16:
        dtype = "bfloat16"
    elif raw.get("load_in_8bit") or fp16 or raw.get("float16"):
        dtype = "float16"
    else:
        dtype = "float32"
    out.set("dtype", dtype, "bf16" if (bf16 or bfloat16) else "fp16" if fp16 else "bf16 (absent: float32)")
    out.set("bf16", bf16 or bfloat16, "bf16")
    out.set("fp16", fp16, "fp16")


def _optimizer(raw: Mapping[str, object], out: _Out) -> None:
    name = as_str(_get(raw, "optimizer", "adamw_torch_fused"), at=_at(out, "optimizer"))
    try:
        canonical, note = canonical_optimizer(name)
    except FitcheckError as exc:
        raise ConfigError(f"{_at(out, 'optimizer')}: {exc}") from None
    if note is not None:
        out.findings.append(note)
    out.set("optim", canonical, "optimizer")
    if raw.get("optim_args"):
        args = raw["optim_args"]
        text = ",".join(f"{k}={v}" for k, v in args.items()) if isinstance(args, dict) else str(args)
        out.set("optim_args", text, "optim_args")
    if raw.get("optim_target_modules"):
        targets = raw["optim_target_modules"]
        at = _at(out, "optim_target_modules")
        value = ("all-linear",) if targets == "all_linear" else as_str_list(targets, at=at)
        out.set("optim_target_modules", value, "optim_target_modules")


def _checkpointing(raw: Mapping[str, object], out: _Out, adapter: str | None) -> None:
    gc = raw.get("gradient_checkpointing", False)
    ao = raw.get("activation_offloading", False)
    gc_offload = gc == "offload"
    if gc_offload:
        # utils/schemas/validation.py check_gradient_checkpointing_w_offload (axolotl@067b021, L1425-1442): the
        # deprecated ``offload`` becomes gradient_checkpointing true + activation_offloading true (TRL's
        # OffloadActivations with streams; the CPU_Offloaded_Gradient_Checkpointer wrapper of
        # monkeypatch/gradient_checkpointing/offload_cpu.py is patched in only for activation_offloading: legacy,
        # loaders/patch_manager.py _apply_gradient_checkpointing_patches L651-661). One home: the same spec as
        # ``--gradient_checkpointing --activation_offloading``.
        gc, ao = True, True
    elif gc == "offload_disk":
        out.refuse("gradient_checkpointing", "'offload_disk': axolotl turns it into activation_offloading: disk "
                   "(utils/schemas/validation.py check_gradient_checkpointing_w_offload): saved tensors written to "
                   "disk are not modelled; use offload or true")
        gc = True
    checkpointing = as_bool(gc if gc is not None else False, at=_at(out, "gradient_checkpointing"))
    if ao in ("legacy", "disk", "hidden_states"):
        why = {"legacy": "synchronous offloading without the CUDA-stream stash",
               "disk": "saved tensors written to disk",
               "hidden_states": "only the checkpointed hidden states offloaded"}[str(ao)]
        out.refuse("activation_offloading", f"{ao!r} ({why}) is not modelled; true (TRL's OffloadActivations "
                   "with streams) is")
        ao = False
    offload = as_bool(ao if ao is not None else False, at=_at(out, "activation_offloading"))
    if offload:
        out.set("activation_offloading", True, "gradient_checkpointing" if gc_offload else "activation_offloading")
        if gc_offload:
            out.notes.append("gradient_checkpointing: offload is axolotl's deprecated spelling of "
                             "gradient_checkpointing: true + activation_offloading: true (validation.py)")
        if adapter is None:  # loaders/model.py: every decoder layer checkpointed, the boundaries offloaded
            checkpointing = True
            out.notes.append("activation_offloading without an adapter: axolotl checkpoints every decoder layer "
                             "(ac_wrap_hf_model) and offloads the checkpoint inputs")
    out.set("gradient_checkpointing", checkpointing,
            "activation_offloading" if offload and adapter is None else "gradient_checkpointing")
    if checkpointing:
        kwargs = raw.get("gradient_checkpointing_kwargs")
        value = as_mapping(kwargs, at=_at(out, "gradient_checkpointing_kwargs")) if kwargs else {"use_reentrant": False}
        out.set("gradient_checkpointing_kwargs", value, "gradient_checkpointing_kwargs")


def _attention(raw: Mapping[str, object], out: _Out) -> None:
    impl = raw.get("attn_implementation")
    key = "attn_implementation"
    if impl is None:
        for legacy, name in (("flash_attention", "flash_attention_2"), ("sdp_attention", "sdpa"),
                             ("eager_attention", "eager"), ("xformers_attention", "xformers"),
                             ("flex_attention", "flex_attention"), ("sage_attention", "sage")):
            if raw.get(legacy):
                impl, key = name, legacy
                break
    if impl is None:
        return
    text = as_str(impl, at=_at(out, key))
    if text in _FLASH:
        if text != "flash_attention_2":
            out.notes.append(f"{key}: {text} counted as flash_attention_2 (same saved tensors: output and "
                             "log-sum-exp per row)")
        out.set("attn_implementation", "flash_attention_2", key)
    elif text in ("sdpa", "eager"):
        out.set("attn_implementation", text, key)
    else:
        out.refuse(key, f"{text!r}: only eager, sdpa and flash attention are modelled")


def _quantization(raw: Mapping[str, object], out: _Out, adapter: str | None) -> None:
    four = bool(raw.get("load_in_4bit"))
    eight = bool(raw.get("load_in_8bit"))
    if four and eight:
        raise ConfigError(f"{out.path}: load_in_4bit and load_in_8bit are both set; keep one")
    if four and adapter != "qlora":
        out.refuse("load_in_4bit", "with adapter: lora axolotl builds no BitsAndBytesConfig (loaders/model.py "
                   "builds one for adapter: qlora); use adapter: qlora")
        return
    if eight and adapter != "lora":
        out.refuse("load_in_8bit", "8-bit loading is built for adapter: lora only (loaders/model.py)")
        return
    if not (four or eight):
        return
    out.set("prepare_for_kbit_training", False, "load_in_4bit" if four else "load_in_8bit")
    out.notes.append("axolotl runs prepare_model_for_kbit_training, then casts norms and embeddings back to the "
                     "load dtype (loaders/model.py _convert_embedding_modules_dtype): counted as 16-bit")
    if eight:
        out.set("load_in_8bit", True, "load_in_8bit")
        return
    out.set("load_in_4bit", True, "load_in_4bit")
    bnb: dict[str, object] = {"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                              "bnb_4bit_quant_storage": "bfloat16", "bnb_4bit_compute_dtype": out.values["dtype"]}
    extra = as_mapping(raw.get("bnb_config_kwargs") or {}, at=_at(out, "bnb_config_kwargs"))
    for k, v in extra.items():
        if k not in bnb and k != "llm_int8_skip_modules":
            if k in ("llm_int8_threshold", "llm_int8_has_fp16_weight"):
                continue
            out.refuse(f"bnb_config_kwargs.{k}", "not a bitsandbytes setting fitcheck models")
        bnb[k] = v
    out.set("bnb_4bit_quant_type", as_str(bnb["bnb_4bit_quant_type"], at=_at(out, "bnb_config_kwargs")),
            "bnb_config_kwargs" if "bnb_4bit_quant_type" in extra else "load_in_4bit")
    out.set("use_bnb_nested_quant", as_bool(bnb["bnb_4bit_use_double_quant"], at=_at(out, "bnb_config_kwargs")),
            "bnb_config_kwargs" if "bnb_4bit_use_double_quant" in extra else "load_in_4bit")
    out.set("bnb_4bit_quant_storage", str(bnb["bnb_4bit_quant_storage"]).removeprefix("torch."),
            "bnb_config_kwargs" if "bnb_4bit_quant_storage" in extra else "load_in_4bit")
    out.set("bnb_4bit_compute_dtype", str(bnb["bnb_4bit_compute_dtype"]).removeprefix("torch."),
            "bnb_config_kwargs" if "bnb_4bit_compute_dtype" in extra else "load_in_4bit")
    if "llm_int8_skip_modules" in extra:
        out.set("llm_int8_skip_modules", as_str_list(extra["llm_int8_skip_modules"], at=_at(out, "bnb_config_kwargs")),
                "bnb_config_kwargs")


def _plugins(raw: Mapping[str, object], out: _Out) -> None:
    plugins = as_str_list(raw.get("plugins") or [], at=_at(out, "plugins"))
    for plugin in plugins:
        if plugin == CCE_PLUGIN:
            if raw.get("cut_cross_entropy") is False:
                continue
            out.set("loss", "cce", "plugins")
        elif plugin == LIGER_PLUGIN:
            config = {name: False for name in ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy",
                                               "cross_entropy")}
            for key, name in LIGER_SWITCHES.items():
                if raw.get(key) is not None:
                    config[name] = as_bool(raw[key], at=_at(out, key))
            for key in ("liger_layer_norm", "liger_rms_norm_gated", "liger_use_token_scaling"):
                if raw.get(key):
                    out.refuse(key, "this Liger switch is not modelled")
            if any(config.values()):
                out.set("use_liger_kernel", True, "plugins")
                out.set("liger_kernel_config", config, "plugins")
        elif plugin == FITCHECK_PLUGIN:
            continue
        else:
            out.refuse("plugins", f"{plugin}: what this plugin changes in the step is not modelled")


def _sharding(raw: Mapping[str, object], out: _Out, cwd: str) -> None:
    ds = raw.get("deepspeed")
    if ds:
        if isinstance(ds, dict):
            out.refuse("deepspeed", "an inline DeepSpeed config is not read; write it to a JSON file and name it")
        else:
            name = as_str(ds, at=_at(out, "deepspeed"))
            out.set("deepspeed", resolve_named_file(name, out.path, cwd, at=_at(out, "deepspeed")), "deepspeed")
    cfg = raw.get("fsdp_config")
    legacy = raw.get("fsdp")
    if cfg or legacy:
        merged = dict(as_mapping(cfg or {}, at=_at(out, "fsdp_config")))
        version = raw.get("fsdp_version") or merged.get("fsdp_version") or merged.get("version") or 1
        merged.pop("fsdp_version", None)
        merged["version"] = as_int(version, at=_at(out, "fsdp_version"))
        if merged["version"] == 2 and merged.get("activation_checkpointing") is not None:
            # axolotl applies FSDP2's activation checkpointing in its own fsdp2_prepare_model
            # (monkeypatch/accelerate/fsdp2.py, patch_accelerate_fsdp2: apply_activation_checkpointing with the
            # plugin's policy), not through accelerate's fsdp2_apply_ac; the reader's gradient_checkpointing
            # (always set by _checkpointing) decides checkpointing, as before
            merged.pop("activation_checkpointing")
            out.notes.append("fsdp_config.activation_checkpointing: applied by axolotl's own FSDP2 preparation "
                             "(monkeypatch/accelerate/fsdp2.py); checkpointing is read from gradient_checkpointing")
        if legacy:
            out.set("fsdp", " ".join(as_str_list(legacy, at=_at(out, "fsdp"))), "fsdp")
        out.set("fsdp_config", merged, "fsdp_config")


def _rl(raw: Mapping[str, object], out: _Out) -> None:
    rl = raw.get("rl")
    trl = as_mapping(raw.get("trl") or {}, at=_at(out, "trl"))
    if rl in (None, "", False):
        out.set("trainer", "trainer", "rl (absent: axolotl's Trainer)")
        return
    kinds = {"dpo": "dpo", "ipo": "dpo", "kto": "kto", "grpo": "grpo"}
    if rl not in kinds:
        out.refuse("rl", f"{rl!r}: only dpo, ipo, kto and grpo are modelled (orpo/simpo/gdpo/ebft are not)")
        return
    out.set("trainer", kinds[str(rl)], "rl")
    beta = trl.get("beta", raw.get("rl_beta"))
    if beta is not None:
        out.set("beta", as_float(beta, at=_at(out, "rl_beta")), "trl.beta" if "beta" in trl else "rl_beta")
    if rl == "ipo":
        out.set("loss_type", ("ipo",), "rl")
    elif raw.get("dpo_loss_type") and rl == "dpo":
        out.set("loss_type", as_str_list(raw["dpo_loss_type"], at=_at(out, "dpo_loss_type")), "dpo_loss_type")
    if rl in ("dpo", "ipo") and raw.get("max_prompt_len") is not None:
        out.set("max_prompt_length", as_int(raw["max_prompt_len"], at=_at(out, "max_prompt_len"), minimum=1),
                "max_prompt_len")
    if raw.get("precompute_ref_log_probs") is not None and rl != "grpo":
        at = _at(out, "precompute_ref_log_probs")
        out.set("precompute_ref_log_probs", as_bool(raw["precompute_ref_log_probs"], at=at), "precompute_ref_log_probs")
    if rl == "grpo":
        prompt = raw.get("max_prompt_len", trl.get("max_prompt_length"))
        if prompt is None:
            raise ConfigError(f"{out.path}: rl: grpo needs max_prompt_len (the length of every prompt) for the "
                              "estimate")
        out.set("max_prompt_length", as_int(prompt, at=_at(out, "max_prompt_len"), minimum=1), "max_prompt_len")
        for key in ("num_generations", "max_completion_length", "use_vllm", "vllm_mode",
                    "vllm_gpu_memory_utilization", "generation_batch_size", "steps_per_generation"):
            if trl.get(key) is not None:
                out.set(key, trl[key], f"trl.{key}")
        if trl.get("use_liger_loss"):
            out.refuse("trl.use_liger_loss", "TRL's Liger GRPO loss is not modelled")
    elif raw.get("sample_packing"):
        raise ConfigError(f"{_at(out, 'sample_packing')}: sample_packing does not work with rl "
                          "(axolotl RLValidationMixin.check_sample_packing_w_rl); set it to false")


def _lora_kernels(raw: Mapping[str, object], out: _Out, adapter: str | None) -> None:
    """axolotl auto-enables its fused LoRA autograd kernels for LoRA/QLoRA SFT (utils/schemas/config.py
    ``check_auto_enable_lora_kernels``): not for ``rl``, 8-bit LoRA or remote code, nor when a key is set."""
    keys = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel")
    if adapter is None:
        return
    explicit = [k for k in keys if raw.get(k) is not None]
    if explicit:
        on = [k for k in explicit if raw.get(k)]
    elif raw.get("rl") or (adapter == "lora" and raw.get("load_in_8bit")) or raw.get("trust_remote_code"):
        on = []
    else:
        on = list(keys)
    if not on:
        return
    how = "set" if explicit else "auto-enabled by axolotl for LoRA/QLoRA SFT"
    if not out.values.get("gradient_checkpointing"):
        out.refuse(on[0], f"({how}) axolotl's fused LoRA kernels (kernels/lora.py) save their own tensors for "
                   "backward, not modelled without gradient checkpointing; set lora_mlp_kernel, lora_qkv_kernel "
                   "and lora_o_kernel to false, or turn gradient_checkpointing on")
        return
    out.findings.append(Finding(
        "not-modelled", Severity.WARNING,
        f"{out.path}: {', '.join(on)} ({how}): axolotl's fused LoRA kernels are counted as peft's LoRA layers; "
        "with gradient checkpointing only the one recomputed layer's working set differs",
        "set lora_mlp_kernel/lora_qkv_kernel/lora_o_kernel: false for a run the estimate describes exactly",
    ))
