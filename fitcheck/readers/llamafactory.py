"""A LLaMA-Factory training YAML read as ``fitcheck estimate`` settings, with LLaMA-Factory's defaults.

llamafactory 0.9.5 does not install with fitcheck's pinned stack (it requires transformers<=5.6.0, peft<=0.18.1,
accelerate<=1.11.0, trl<=0.24.0), so its source is read at commit ``ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30``
(github.com/hiyouga/LLaMA-Factory). A LLaMA-Factory YAML is one ``HfArgumentParser`` over ModelArguments,
DataArguments, FinetuningArguments and ``Seq2SeqTrainingArguments``: the TrainingArguments keys are read as a
``--training_args`` file is (``readers/trainer_args.py``), the LLaMA-Factory keys here:

* ``hparams/finetuning_args.py``: ``stage`` sft, ``finetuning_type`` lora, ``lora_rank`` 8, ``lora_alpha`` =
  2 x rank when unset, ``lora_dropout`` 0.0, ``lora_target`` all (``find_all_linear_modules``: every Linear but
  the output head, peft's ``all-linear``), ``freeze_trainable_layers`` 2 (the last two; negative: the first n),
  ``pref_beta`` 0.1;
* ``hparams/model_args.py``: ``quantization_method`` bnb, ``quantization_type`` nf4, ``double_quantization``
  true, ``flash_attn`` auto, ``disable_gradient_checkpointing`` false, ``use_reentrant_gc`` true;
  ``hparams/data_args.py``: ``cutoff_len`` 2048; ``packing`` defaults to ``stage == "pt"``
  (``hparams/parser.py``); ``neat_packing`` implies packing;
* ``hparams/parser.py``: the compute dtype is bf16 with ``bf16``/``pure_bf16``, fp16 with ``fp16``, else the
  checkpoint's (``model/patcher.py`` ``infer_optim_dtype``); the model loads in it;
* ``model/model_utils/quantization.py``: ``BitsAndBytesConfig(compute dtype, double quant, quant type,
  quant_storage = compute dtype)``; LLaMA-Factory never calls ``prepare_model_for_kbit_training``;
* ``model/adapter.py`` ``init_adapter``: trainable parameters are cast to fp32 unless ``pure_bf16``, BAdam, or
  ZeRO-3 without quantization;
* ``model/model_utils/checkpointing.py``: checkpointing is on unless ``disable_gradient_checkpointing``;
* ``model/loader.py``: Liger with ``fused_linear_cross_entropy`` for stages pt and sft;
* ``stage: dpo|kto``: ``train/{dpo,kto}/workflow.py`` and ``trainer.py``: TRL's DPOTrainer / KTOTrainer
  subclassed with log-probs from the full fp32 logits (``--trainer dpo|kto --loss full-logits``,
  ``fitcheck.core.trainers.full_logits``); every row up to ``cutoff_len`` (``data/processor/pairwise.py``,
  ``feedback.py``); dropout disabled in the model (``disable_dropout_in_model`` in both trainers' ``__init__``);
  under LoRA the reference is the base with the adapters disabled (``trainer_utils.py`` ``create_ref_model``
  returns None for lora).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.errors import ConfigError, FitcheckError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.framework_yaml import Collected as _Out
from fitcheck.readers.framework_yaml import FrameworkRun, load_framework_yaml, resolve_named_file
from fitcheck.readers.settings_table import SPELLINGS
from fitcheck.readers.sources import as_bool, as_float, as_int, as_mapping, as_str, as_str_list, load_mapping_file
from fitcheck.readers.trainer_args import read_training_args_mapping

LLAMAFACTORY_COMMIT = "ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30"
FREEZE_KEY = "llamafactory_freeze_layers"  # a FrameworkRun value resolved with the model's layer count

_STAGE_REFUSED = {
    "rm": "LLaMA-Factory's PairwiseTrainer runs a value-head model (AutoModelForCausalLMWithValueHead) over "
    "chosen + rejected, not a sequence-classification reward model",
    "ppo": "PPO (policy, reference, reward and value models with generation) is not modelled",
}
REFUSED: dict[str, str] = {
    "use_unsloth": "unsloth's patched model is not modelled",
    "use_unsloth_gc": "unsloth's gradient checkpointing offloads the checkpointed inputs to CPU; not modelled",
    "upcast_layernorm": "fp32 layernorm weights among 16-bit ones are not modelled",
    "upcast_lmhead_output": "the LM head output cast to fp32 (an fp32 copy of the logits) is not modelled",
    "use_galore": "LLaMA-Factory's GaLore set-up is not translated; pass --optim galore_adamw and "
    "--optim_target_modules",
    "use_apollo": "APOLLO is not modelled",
    "use_badam": "BAdam (block-wise updates) is not modelled",
    "use_adam_mini": "Adam-mini is not modelled",
    "use_muon": "Muon is not modelled",
    "use_llama_pro": "LLaMA Pro block expansion is not modelled",
    "mixture_of_depths": "mixture-of-depths is not modelled",
    "shift_attn": "LongLoRA shift short attention is not modelled",
    "use_kt": "KTransformers CPU experts are not modelled",
    "use_dft_loss": "the DFT loss (probabilities from the full logits) is not modelled",
    "use_asft_loss": "the ASFT loss is not modelled",
    "freeze_extra_modules": "extra trainable modules in freeze tuning are not translated",
}
_NO_MEMORY = frozenset([
    "do_train", "do_eval", "do_predict", "dataset", "eval_dataset", "dataset_dir", "media_dir", "template",
    "max_samples", "overwrite_cache", "preprocessing_num_workers", "dataloader_num_workers", "output_dir",
    "logging_steps", "save_steps", "plot_loss", "overwrite_output_dir", "save_only_model", "report_to",
    "learning_rate", "num_train_epochs", "max_steps", "lr_scheduler_type", "warmup_ratio", "warmup_steps",
    "ddp_timeout", "resume_from_checkpoint", "trust_remote_code", "val_size", "eval_strategy", "eval_steps",
    "per_device_eval_batch_size", "tokenized_path", "enable_thinking", "mask_history", "train_on_prompt",
    "streaming", "buffer_size", "mix_strategy", "interleave_probs", "ignore_pad_token_for_loss", "tool_format",
    "default_system", "image_max_pixels", "image_min_pixels", "video_max_pixels", "video_min_pixels", "video_fps",
    "video_maxlen", "infer_backend", "infer_dtype", "max_new_tokens", "print_param_status",
    "include_num_input_tokens_seen", "adapter_name_or_path", "loraplus_lr_ratio", "loraplus_lr_embedding",
    "pissa_init", "pissa_iter", "pissa_convert", "create_new_adapter", "logging_dir", "run_name", "seed",
    "weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "save_strategy",
    "save_total_limit", "load_best_model_at_end", "metric_for_best_model", "ray_run_name", "ray_storage_path",
    "ray_num_workers", "resources_per_worker", "placement_strategy", "hub_model_id", "push_to_hub", "cache_dir",
    "model_revision", "rope_scaling", "predict_with_generate", "compute_accuracy", "disable_shuffling",
    "export_dir", "pref_ftx", "pref_bco_weight", "kto_chosen_weight", "kto_rejected_weight", "simpo_gamma",
    "ref_model", "ref_model_adapters", "ref_model_quantization_bit", "reward_model", "reward_model_adapters",
    "reward_model_type", "ld_alpha", "freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model",
    "quantization_device_map", "new_special_tokens", "resize_vocab", "split_special_tokens", "add_tokens",
    "add_special_tokens", "low_cpu_mem_usage", "use_fast_tokenizer", "moe_aux_loss_coef", "enable_thinking",
    "dataset_shards",
])
_MAPPED = frozenset([
    "model_name_or_path", "stage", "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target",
    "additional_target", "use_dora", "use_rslora", "freeze_trainable_layers", "freeze_trainable_modules",
    "quantization_bit", "quantization_method", "quantization_type", "double_quantization", "cutoff_len", "packing",
    "neat_packing", "enable_liger_kernel", "flash_attn", "disable_gradient_checkpointing", "use_reentrant_gc",
    "pure_bf16", "pref_beta", "pref_loss", "deepspeed", "bf16", "fp16",
])


def read_llamafactory(path: str, *, cwd: str, overrides: Mapping[str, object] | None = None) -> FrameworkRun:
    """Read a LLaMA-Factory training YAML (``llamafactory-cli train FILE``) as ``fitcheck estimate`` settings.

    Freeze tuning leaves :data:`FREEZE_KEY` (the signed ``freeze_trainable_layers``) in the values: the layer
    indices need the model's layer count (:func:`resolve_freeze`).

    Args:
        path: The YAML file.
        cwd: Working directory, the last place a named DeepSpeed file is looked for.
        overrides: Keys given on the framework's own command line (they replace the file's, as the framework's
            CLI does).

    Returns:
        The settings with where each was read, findings and the defaults applied.

    Raises:
        ConfigError: Bad values, and every key that changes memory and is not modelled.
    """
    raw = {**load_framework_yaml(path, what="LLaMA-Factory config (--llamafactory)"), **(overrides or {})}
    out = _Out(path)
    try:
        _read(raw, out, cwd)
    except FitcheckError as exc:
        out.problems.extend(exc.problems if isinstance(exc, ConfigError) else [str(exc)])
    for key in sorted(REFUSED):
        if raw.get(key) not in (None, False, 0, ""):
            out.refuse(key, REFUSED[key])
    if out.problems:
        raise ConfigError.collect(sorted(set(out.problems), key=out.problems.index))
    unknown = sorted(
        k for k in raw if raw[k] is not None and k not in _MAPPED and k not in _NO_MEMORY and k not in REFUSED
                     and k not in SPELLINGS)
    if unknown:
        out.findings.append(Finding(
            "unknown-keys", Severity.WARNING,
            f"{path}: {len(unknown)} key(s) fitcheck does not know from LLaMA-Factory (commit "
            f"{LLAMAFACTORY_COMMIT[:10]}) nor TrainingArguments were passed over: " + ", ".join(unknown[:20])
            + (" ..." if len(unknown) > 20 else ""),
            "check the spelling; a key that changes memory would need to be modelled",
        ))
    if overrides:
        out.notes.append(f"{path}: command-line overrides " + ", ".join(f"{k}={v!r}" for k, v in overrides.items()))
    return FrameworkRun(out.values, out.where, tuple(out.findings), tuple(out.notes))


def resolve_freeze(values: Mapping[str, object], num_layers: int) -> dict[str, object]:
    """The values with :data:`FREEZE_KEY` replaced by ``trainable_layers`` (``model/adapter.py``
    ``_setup_freeze_tuning``: the last n layers, or the first -n)."""
    out = {k: v for k, v in values.items() if k != FREEZE_KEY}
    if FREEZE_KEY in values:
        n = int(str(values[FREEZE_KEY]))
        layers = range(max(0, num_layers - n), num_layers) if n > 0 else range(min(num_layers, -n))
        out["trainable_layers"] = tuple(layers)
    return out


def _at(out: _Out, key: str) -> str:
    return f"{out.path}:{key}"


def _get(raw: Mapping[str, object], key: str, default: object) -> Any:
    value = raw.get(key)
    return default if value is None else value


def _read(raw: Mapping[str, object], out: _Out, cwd: str) -> None:
    if not raw.get("model_name_or_path"):
        raise ConfigError(f"{out.path}: model_name_or_path is required")
    stage = as_str(_get(raw, "stage", "sft"), at=_at(out, "stage"))
    if stage in _STAGE_REFUSED:
        out.refuse("stage", f"{stage}: {_STAGE_REFUSED[stage]}")
        return
    if stage not in ("sft", "pt", "dpo", "kto"):
        raise ConfigError(f"{_at(out, 'stage')}: {stage!r} is not one of pt, sft, rm, ppo, dpo, kto")
    ta_keys = {k: v for k, v in raw.items() if k in SPELLINGS and k not in _MAPPED}
    ta = read_training_args_mapping(ta_keys, source=out.path)
    out.findings.extend(f for f in ta.findings if f.code != "keys-passed-over")
    for name, value in ta.values.items():
        out.set(name, value, ta.provenance[name][1])
    out.set("model_name_or_path", as_str(raw["model_name_or_path"], at=_at(out, "model_name_or_path")),
            "model_name_or_path")
    out.set("trainer", "trainer", "stage")
    if stage in ("dpo", "kto"):
        _preference(raw, out, stage)
    out.set("max_seq_length", as_int(_get(raw, "cutoff_len", 2048), at=_at(out, "cutoff_len"), minimum=1),
            "cutoff_len")
    pure_bf16 = as_bool(_get(raw, "pure_bf16", False), at=_at(out, "pure_bf16"))
    bf16 = as_bool(_get(raw, "bf16", False), at=_at(out, "bf16")) or pure_bf16
    fp16 = as_bool(_get(raw, "fp16", False), at=_at(out, "fp16")) and not bf16
    dtype = "bfloat16" if bf16 else "float16" if fp16 else "auto"
    out.set("bf16", as_bool(_get(raw, "bf16", False), at=_at(out, "bf16")), "bf16")
    out.set("fp16", fp16, "fp16")
    zero3 = _deepspeed(raw, out, cwd)
    quant = _quantization(raw, out, dtype)
    cast = not pure_bf16 and not (quant is None and zero3)
    _finetuning(raw, out, dtype, cast)
    if stage in ("dpo", "kto") and out.values.get("lora_dropout"):  # Custom{DPO,KTO}Trainer.__init__
        out.set("lora_dropout", 0.0, "stage (its trainer runs disable_dropout_in_model)")
    _checkpointing(raw, out)
    _attention(raw, out)
    if raw.get("enable_liger_kernel"):
        out.set("use_liger_kernel", True, "enable_liger_kernel")
    if raw.get("packing") or raw.get("neat_packing") or (raw.get("packing") is None and stage == "pt"):
        out.notes.append(f"packing: every row holds cutoff_len = {out.values['max_seq_length']} tokens "
                         "(data/processor packing)")


def _preference(raw: Mapping[str, object], out: _Out, stage: str) -> None:
    """``stage: dpo|kto`` (LLaMA-Factory@ff6d4d1 train/dpo/, train/kto/): TRL's DPOTrainer / KTOTrainer kind with
    the full-logits log-probs (``--loss full-logits``)."""
    loss = as_str(_get(raw, "pref_loss", "sigmoid"), at=_at(out, "pref_loss"))
    if stage == "dpo" and loss in ("orpo", "simpo"):  # hparams/finetuning_args.py L593: no reference model
        out.refuse("pref_loss", f"{loss}: no reference forward (use_ref_model false), a step not modelled; "
                   "sigmoid, hinge, ipo and kto_pair are")
    if raw.get("ref_model"):
        out.refuse("ref_model", "a reference model loaded from another checkpoint (trainer_utils.py "
                   "create_ref_model) is not modelled")
    if as_str(_get(raw, "finetuning_type", "lora"), at=_at(out, "finetuning_type")) != "lora":
        out.refuse("finetuning_type", f"stage {stage} with full/freeze tuning: the reference copy is loaded untrained "
                   "in the compute dtype next to an fp32-cast policy (trainer_utils.py create_ref_model), not "
                   "modelled; lora is")
    if raw.get("enable_liger_kernel"):
        out.refuse("enable_liger_kernel", f"with stage {stage} (Liger's kernels around LLaMA-Factory's "
                   "full-logits loss) is not modelled")
    out.set("trainer", stage, "stage")
    out.set("loss", "full-logits", "stage")
    rows = ("chosen + rejected (train/dpo/trainer.py concatenated_forward)" if stage == "dpo"
            else "the completions and the KL rows (train/kto/trainer.py concatenated_forward)")
    out.notes.append(f"stage: {stage} is TRL's {stage.upper()}Trainer with LLaMA-Factory's log-probs from the full "
                     f"fp32 logits of {rows}, each row up to cutoff_len")


def _deepspeed(raw: Mapping[str, object], out: _Out, cwd: str) -> bool:
    """Resolve the DeepSpeed file; True when it is ZeRO-3."""
    name = raw.get("deepspeed")
    if not name:
        return False
    if isinstance(name, dict):
        out.refuse("deepspeed", "an inline DeepSpeed config is not read; write it to a JSON file and name it")
        return False
    found = resolve_named_file(as_str(name, at=_at(out, "deepspeed")), out.path, cwd, at=_at(out, "deepspeed"))
    out.set("deepspeed", found, "deepspeed")
    zero = load_mapping_file(found, what=f"DeepSpeed config ({_at(out, 'deepspeed')})").get("zero_optimization")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    return stage == 3


def _quantization(raw: Mapping[str, object], out: _Out, dtype: str) -> int | None:
    bits = raw.get("quantization_bit")
    if bits is None:
        return None
    bits = as_int(bits, at=_at(out, "quantization_bit"))
    method = str(_get(raw, "quantization_method", "bnb")).lower()
    if method != "bnb":
        out.refuse("quantization_method", f"{method}: only bitsandbytes (bnb) quantization is modelled")
        return bits
    if bits not in (4, 8):
        raise ConfigError(f"{_at(out, 'quantization_bit')}: bitsandbytes takes 4 or 8, got {bits}")
    out.set("prepare_for_kbit_training", False, "quantization_bit")
    out.notes.append("LLaMA-Factory never calls prepare_model_for_kbit_training: norms, embeddings and LM head "
                     "stay in the compute dtype")
    if bits == 8:
        out.set("load_in_8bit", True, "quantization_bit")
        return bits
    out.set("load_in_4bit", True, "quantization_bit")
    out.set("bnb_4bit_quant_type", as_str(_get(raw, "quantization_type", "nf4"), at=_at(out, "quantization_type")),
            "quantization_type")
    out.set("use_bnb_nested_quant", as_bool(_get(raw, "double_quantization", True), at=_at(out, "double_quantization")),
            "double_quantization")
    if dtype != "auto":
        out.set("bnb_4bit_quant_storage", dtype, "quantization_bit (quant_storage = compute dtype)")
        out.set("bnb_4bit_compute_dtype", dtype, "quantization_bit (compute dtype)")
    return bits


def _finetuning(raw: Mapping[str, object], out: _Out, dtype: str, cast: bool) -> None:
    kind = as_str(_get(raw, "finetuning_type", "lora"), at=_at(out, "finetuning_type"))
    if raw.get("quantization_bit") is not None and kind != "lora":
        raise ConfigError(f"{_at(out, 'quantization_bit')}: LLaMA-Factory quantizes only for finetuning_type: lora")
    if kind == "full":
        if cast and dtype != "float32":
            out.set("dtype", "float32", "finetuning_type")
            out.notes.append("full tuning: LLaMA-Factory casts every trainable parameter to fp32 (model/adapter.py "
                             "_setup_full_tuning; not under pure_bf16 or ZeRO-3), trained under 16-bit autocast")
        else:
            out.set("dtype", dtype, "bf16")
        return
    out.set("dtype", dtype, "bf16")
    if kind == "freeze":
        if cast:
            out.refuse("finetuning_type", "freeze: LLaMA-Factory casts the trainable layers to fp32 and keeps the "
                       "frozen ones 16-bit (model/adapter.py _setup_freeze_tuning), a mix one load dtype does not "
                       "describe; set pure_bf16: true to keep them 16-bit")
            return
        modules = as_str(_get(raw, "freeze_trainable_modules", "all"), at=_at(out, "freeze_trainable_modules"))
        if modules != "all":
            out.refuse("freeze_trainable_modules", f"{modules!r}: only 'all' is translated")
            return
        n = as_int(_get(raw, "freeze_trainable_layers", 2), at=_at(out, "freeze_trainable_layers"))
        out.set(FREEZE_KEY, n, "freeze_trainable_layers")
        return
    if kind != "lora":
        out.refuse("finetuning_type", f"{kind}: only lora, freeze and full are modelled")
        return
    out.set("use_peft", True, "finetuning_type")
    rank = as_int(_get(raw, "lora_rank", 8), at=_at(out, "lora_rank"), minimum=1)
    out.set("lora_r", rank, "lora_rank")
    alpha = raw.get("lora_alpha")
    out.set("lora_alpha", as_float(alpha, at=_at(out, "lora_alpha")) if alpha is not None else float(2 * rank),
            "lora_alpha" if alpha is not None else "lora_rank (lora_alpha = 2 x rank)")
    out.set("lora_dropout", as_float(_get(raw, "lora_dropout", 0.0), at=_at(out, "lora_dropout")), "lora_dropout")
    target = as_str_list(_get(raw, "lora_target", "all"), at=_at(out, "lora_target"))
    out.set("lora_target_modules", ("all-linear",) if target == ("all",) else target, "lora_target")
    if raw.get("additional_target"):
        out.set("lora_modules_to_save", as_str_list(raw["additional_target"], at=_at(out, "additional_target")),
                "additional_target")
    for key in ("use_dora", "use_rslora"):
        if raw.get(key) is not None:
            out.set(key, as_bool(raw[key], at=_at(out, key)), key)


def _checkpointing(raw: Mapping[str, object], out: _Out) -> None:
    at = _at(out, "disable_gradient_checkpointing")
    disabled = as_bool(_get(raw, "disable_gradient_checkpointing", False), at=at)
    on = not disabled or bool(out.values.get("gradient_checkpointing"))
    out.set("gradient_checkpointing", on, "disable_gradient_checkpointing")
    if on and "gradient_checkpointing_kwargs" not in out.values:
        reentrant = as_bool(_get(raw, "use_reentrant_gc", True), at=_at(out, "use_reentrant_gc"))
        fsdp = out.values.get("fsdp_config")
        if isinstance(fsdp, Mapping) and str(as_mapping(fsdp, at="fsdp_config").get("version", "1")) == "2":
            reentrant = False  # model_utils/checkpointing.py: FSDP2 turns use_reentrant_gc off
        out.set("gradient_checkpointing_kwargs", {"use_reentrant": reentrant}, "use_reentrant_gc")


def _attention(raw: Mapping[str, object], out: _Out) -> None:
    mode = str(_get(raw, "flash_attn", "auto")).lower()
    names = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2", "fa3": "flash_attention_2"}
    if mode == "auto":
        return  # transformers' default (sdpa)
    if mode not in names:
        raise ConfigError(f"{_at(out, 'flash_attn')}: {mode!r} is not one of auto, disabled, sdpa, fa2, fa3")
    if mode == "fa3":
        out.notes.append("flash_attn: fa3 counted as flash_attention_2 (same saved tensors)")
    out.set("attn_implementation", names[mode], "flash_attn")
