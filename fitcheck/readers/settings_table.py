"""The one table of run settings: every name fitcheck reads, its spellings, its type and its flag.

Every way a run reaches fitcheck (``fitcheck estimate`` flags, a TrainingArguments/TRL file or object, a
training script's own argv, the flat values of :func:`fitcheck.readers.spec_from_values`) is derived from
:data:`SETTINGS`:

* the CLI flags (:func:`cli_rows`): rows with a ``help`` text, in table order, with ``--dash-spellings`` and
  the aliases marked ``cli``;
* the TrainingArguments/TRL names (:data:`SPELLINGS`): rows marked ``trainer_arg`` with their aliases of reach
  ``FILES`` or ``CLI`` (what ``fitcheck.readers.trainer_args`` reads from files, objects and argv);
* the flat-values names (:func:`canonical_key`): every alias, including the loose ones users paste from peft
  / BitsAndBytesConfig / tokenizer configs (``r``, ``target_modules``, ``model_max_length``).

Conversion is defined here once per :class:`Kind` (:func:`convert`); a row with a ``choice`` is then read as
one of a fixed set of names (dtype, attention kernel, device, loss) when the typed settings are built.
Defaults live on :class:`fitcheck.readers.run_settings.RunSettings`, one per field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from fitcheck.core.trainers import REFUSED
from fitcheck.errors import ConfigError
from fitcheck.readers.sources import as_bool, as_float, as_int, as_mapping, as_str, as_str_list
from fitcheck.spec import AttnImpl, DeviceType, Dtype, TrainerKind
from fitcheck.units import parse_bytes


class Kind(Enum):
    """How a raw value (flag text, JSON/YAML value, attribute) is read."""

    POSINT = "posint"  # an integer >= 1
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    NAMES = "list"  # a list of names (a comma/space separated string is split)
    INDICES = "indices"  # a list of integer indices (layer numbers)
    MAPPING = "dict"
    BYTES = "bytes"  # a memory size: an integer or "80GiB"
    RAW = "raw"  # kept as given: a file name or an inline section that another reader reads


class Reach(Enum):
    """Where an alias is accepted (each level includes the ones above it)."""

    VALUES = 1  # flat values only (spec_from_values): loose names pasted from peft/bnb/tokenizer configs
    FILES = 2  # also TrainingArguments/TRL files, objects and a script's argv
    CLI = 3  # also offered as a ``fitcheck estimate`` flag spelling


class Use(Enum):
    """Who consumes a setting."""

    RUN = "run"  # a field of RunSettings (turned into the spec by run_args)
    SOURCE = "source"  # read by the merge step into sharding/precision (files, DeepSpeed/FSDP flags)
    CLI = "cli"  # read by the CLI itself (files it opens, device-map checks)


@dataclass(frozen=True)
class Alias:
    """Another spelling of a setting.

    Attributes:
        name: The spelling.
        note: Which generation/library uses it (said in the "spelling-read" finding).
        reach: Where it is accepted.
    """

    name: str
    note: str = ""
    reach: Reach = Reach.FILES


@dataclass(frozen=True)
class Choice:
    """A string setting read as one of fixed names.

    Attributes:
        parse: Lower-cased, stripped text -> value (raises ValueError/KeyError when not one of them).
        allowed: The names, for the message.
    """

    parse: Callable[[str], object]
    allowed: str


@dataclass(frozen=True)
class Setting:
    """One row of the table.

    Attributes:
        kind: How a raw value is read.
        help: ``fitcheck estimate`` help text (``{default}`` is filled from RunSettings); None = no flag.
        aliases: Other spellings, the most preferred first.
        trainer_arg: A TrainingArguments / TRL ModelConfig / SFTConfig field (read from files and objects).
        note: Which generation uses the canonical spelling (with aliases: said when it is read).
        newer_first: The alias is the newer name and wins when one source holds both (transformers 5).
        choice: Read as one of fixed names after ``kind``.
        use: Who consumes it.
        cli_choices: The values argparse accepts for the flag (none: any).
    """

    kind: Kind
    help: str | None = None
    aliases: tuple[Alias, ...] = ()
    trainer_arg: bool = False
    note: str = ""
    newer_first: bool = False
    choice: Choice | None = None
    use: Use = Use.RUN
    cli_choices: tuple[str, ...] = ()

    def notes(self, canonical: str) -> dict[str, str]:
        """Spelling -> note, for the spellings that carry one."""
        out = {a.name: a.note for a in self.aliases if a.note}
        if self.note:
            out[canonical] = self.note
        return out


def _load_dtype(text: str) -> Dtype | None:
    if text == "auto":
        return None
    return _dtype(text)


def _dtype(text: str) -> Dtype:
    dtype = Dtype.from_name(text)
    if dtype is None or dtype is Dtype.INT8:  # int8 is no load, storage or compute dtype here
        raise KeyError(text)
    return dtype


_TA, _V, _C = True, Reach.VALUES, Reach.CLI
R, P, INT, F, B, S, N, X, M, Y = (
    Kind.RAW, Kind.POSINT, Kind.INT, Kind.FLOAT, Kind.BOOL, Kind.STR, Kind.NAMES, Kind.INDICES, Kind.MAPPING,
    Kind.BYTES,
)
_GC_NOTE = "transformers 4.x name (deprecated alias in 5.x, removed in v6)"

# Canonical name -> how to read it. TrainingArguments fields are transformers 5.23 training_args.py; TRL fields
# trl/trainer/model_config.py (ModelConfig) and sft_config.py (SFTConfig): the ones that change memory or that
# DeepSpeed "auto" resolution needs (transformers/integrations/deepspeed.py trainer_config_process). Rows with
# a help text are `fitcheck estimate` flags, in the order --help lists them.
SETTINGS: dict[str, Setting] = {
    # model
    "model_name_or_path": Setting(S, "Hub id (built-in catalog or local HF cache), a directory with config.json, "
                                  "or a config.json path", trainer_arg=_TA),
    "dtype": Setting(
        S, "dtype the model is loaded in: auto (config.json's, transformers 5 default), bfloat16, float16, "
        "float32; alias --torch_dtype",
        (Alias("torch_dtype", "transformers 4.x / older TRL name", _C),), _TA,
        note="transformers 5.x / current TRL name", newer_first=True,
        choice=Choice(_load_dtype, "auto, bfloat16, float16, float32"),
    ),
    "attn_implementation": Setting(S, "eager, sdpa (default) or flash_attention_2", trainer_arg=_TA,
                                   choice=Choice(AttnImpl, "eager, sdpa, flash_attention_2")),
    "task": Setting(S, "causal-lm, seq-cls, token-cls or image-text-to-text (default: from config.json "
                    "architectures)", use=Use.CLI),  # read by readers/task_heads.py with the inventory
    "num_labels": Setting(S, "classifier width for --task seq-cls/token-cls (default: the config's id2label, "
                          "else 2)", use=Use.CLI),
    "image_tokens": Setting(S, "vision patches per sample for image-text-to-text (before the merger; default 0)",
                            use=Use.CLI),
    # batch
    "per_device_train_batch_size": Setting(
        P, "micro-batch per GPU (default {default}, as TrainingArguments)",
        (Alias("per_gpu_train_batch_size", "deprecated transformers 4.x name"),), _TA,
    ),
    "gradient_accumulation_steps": Setting(P, "gradient accumulation steps (default {default})", trainer_arg=_TA),
    "max_seq_length": Setting(
        P, "length of EVERY sequence in the micro-batch (padded/packed to it; default {default}); alias --max_length",
        (
            Alias("max_length", "TRL SFTConfig name (current)", _C),
            Alias("seq_length", reach=_V),
            Alias("model_max_length", reach=_V),
        ),
        _TA, note="older TRL SFTConfig name", newer_first=True,
    ),
    # precision / optimizer
    "bf16": Setting(B, "bf16 mixed precision (autocast)", trainer_arg=_TA),
    "fp16": Setting(B, "fp16 mixed precision (autocast)", trainer_arg=_TA),
    "optim": Setting(S, "TrainingArguments.optim name (default {default})", trainer_arg=_TA),
    "optim_args": Setting(S, "optimizer arguments as key=value,key=value (e.g. rank=128 for GaLore)",
                          trainer_arg=_TA),
    "optim_target_modules": Setting(N, "modules GaLore/APOLLO project", trainer_arg=_TA),
    # activations
    "gradient_checkpointing": Setting(
        B, "activation (gradient) checkpointing; alias --activation_checkpointing",
        (Alias("activation_checkpointing", "transformers 5.x name", _C),), _TA, note=_GC_NOTE, newer_first=True,
    ),
    "checkpoint_every_n_layers": Setting(P, "checkpoint one decoder layer in n (transformers 5 every_n_layers)"),
    "loss": Setting(
        S, "LM loss implementation: torch (default; transformers' cross-entropy on full b x s x V logits, alias "
        "standard), liger-flce (Liger fused linear cross-entropy: no logits, a chunk buffer), cce (Apple's Cut "
        "Cross-Entropy, cce_patch: no logits)"
    ),  # read by readers/kernel_settings.py (aliases, refusals)
    "gradient_checkpointing_kwargs": Setting(
        M, "JSON, e.g. '{\"use_reentrant\": false}' (every_n_layers read too)",
        (Alias("activation_checkpointing_kwargs", "transformers 5.x name"),), _TA,
        note="transformers 4.x name (deprecated alias in 5.x)", newer_first=True,
    ),
    "use_liger_kernel": Setting(
        B, "Liger-Kernel (TrainingArguments): RMSNorm, SwiGLU/GEGLU, RoPE and fused linear cross-entropy",
        trainer_arg=_TA,
    ),
    "liger_kernel_config": Setting(
        R, "JSON of Liger switches: rope, rms_norm, swiglu (geglu), fused_linear_cross_entropy, cross_entropy",
        trainer_arg=_TA,
    ),
    "activation_offloading": Setting(B, "TRL SFTConfig activation offloading: saved tensors to pinned host memory",
                                     trainer_arg=_TA),
    "torch_compile": Setting(B, "TrainingArguments torch_compile (not modelled: the estimate is eager mode)",
                             trainer_arg=_TA),
    # peft
    "use_peft": Setting(B, "train LoRA adapters (TRL)", trainer_arg=_TA),
    "lora_r": Setting(P, "LoRA rank (TRL default {default})", (Alias("r", reach=_V),), _TA),
    "lora_alpha": Setting(F, "LoRA alpha (TRL default {default:g})", trainer_arg=_TA),
    "lora_dropout": Setting(F, "LoRA dropout (TRL default {default})", trainer_arg=_TA),
    "lora_target_modules": Setting(
        N, "module names, or all-linear (default: peft's table for the model type)",
        (Alias("target_modules", reach=_V),), _TA,
    ),
    "lora_modules_to_save": Setting(
        N, "modules trained in full next to the adapters (e.g. lm_head embed_tokens)",
        (Alias("modules_to_save", reach=_V),), _TA,
    ),
    "lora_target_parameters": Setting(N, "parameter names for peft's ParamWrapper (fused MoE experts)",
                                      trainer_arg=_TA),
    "lora_layers_to_transform": Setting(X, "only these layer indices get adapters"),
    "use_dora": Setting(B, "DoRA", trainer_arg=_TA),
    "use_rslora": Setting(B, "rsLoRA", trainer_arg=_TA),
    "adapter_config": Setting(S, "a PEFT adapter_config.json (LoRA settings read from it)", use=Use.CLI),
    # quantization
    "load_in_4bit": Setting(B, "bitsandbytes 4-bit base (QLoRA)", trainer_arg=_TA),
    "load_in_8bit": Setting(B, "bitsandbytes LLM.int8 base", trainer_arg=_TA),
    "bnb_4bit_quant_type": Setting(S, "nf4 or fp4", trainer_arg=_TA),
    "use_bnb_nested_quant": Setting(B, "double quantization (bnb_4bit_use_double_quant)",
                                    (Alias("bnb_4bit_use_double_quant", reach=_V),), _TA),
    "bnb_4bit_quant_storage": Setting(
        S, "packing dtype of 4-bit weights (uint8 default; bfloat16 for FSDP-QLoRA)", trainer_arg=_TA,
        choice=Choice(_dtype, "uint8, bfloat16, float16, float32"),
    ),
    "bnb_4bit_compute_dtype": Setting(S, "compute dtype of 4-bit layers (default: --dtype)",
                                      choice=Choice(_dtype, "bfloat16, float16, float32")),
    "llm_int8_skip_modules": Setting(N, "modules kept unquantized"),
    "bnb_4bit_blocksize": Setting(P),
    # branch i12place: peft prepare_model_for_kbit_training as a flag (default: the trainer's; readers/trl_settings.py)
    "prepare_for_kbit_training": Setting(
        B, "peft prepare_model_for_kbit_training on the quantized base: non-quantized 16-bit parameters (norms, "
        "embeddings, LM head) cast to fp32 (default true for --trainer trainer, as peft's QLoRA recipes; false for "
        "TRL trainers, which never call it in TRL 1.16); alias --prepare_kbit_training",
        (Alias("prepare_kbit_training", reach=_C),),
    ),
    # partial training
    "trainable_parameters": Setting(
        N, "train only parameters matching these patterns (e.g. '*.mlp.gate.*'); layer index written as *"
    ),
    "trainable_layers": Setting(X, "train only these layer indices"),
    # distributed
    "num_processes": Setting(P, "total processes (GPUs) over all machines, as accelerate counts them"),
    "num_machines": Setting(P, "number of machines (nodes)"),
    "training_args": Setting(S, "a TrainingArguments JSON or YAML file", use=Use.CLI),
    # framework configs (readers/axolotl.py, readers/llamafactory.py): read as these flags; flags given too win
    "axolotl": Setting(S, "an axolotl config YAML (what `axolotl train FILE` takes), read as these flags; "
                       "flags given too win", use=Use.CLI),
    "llamafactory": Setting(S, "a LLaMA-Factory training YAML (what `llamafactory-cli train FILE` takes), read as "
                            "these flags; flags given too win", use=Use.CLI),
    "deepspeed": Setting(R, "a DeepSpeed JSON ('auto' values resolved as transformers does)", trainer_arg=_TA,
                         use=Use.SOURCE),
    "config_file": Setting(S, "an accelerate config YAML (default: accelerate's default location if it exists)",
                           use=Use.CLI),
    "fsdp": Setting(R, "TrainingArguments fsdp string, e.g. 'full_shard auto_wrap offload'", trainer_arg=_TA,
                    use=Use.SOURCE),
    "fsdp_config": Setting(R, "an FSDP config file (JSON/YAML)", trainer_arg=_TA, use=Use.SOURCE),
    "zero_stage": Setting(INT, "DeepSpeed ZeRO stage 0-3", use=Use.SOURCE),
    "offload_optimizer": Setting(S, "DeepSpeed offload_optimizer device: none, cpu, nvme", use=Use.SOURCE),
    "offload_param": Setting(S, "DeepSpeed offload_param device (ZeRO-3): none, cpu, nvme", use=Use.SOURCE),
    # parallelism (accelerate ParallelismConfig; their product must equal --num_processes), read by
    # readers/parallelism.py; accelerate launch spells them --parallelism_config_<name>
    **{
        name: Setting(S, text, (Alias(f"parallelism_config_{name}", reach=_C),), use=Use.SOURCE)
        for name, text in (
            ("dp_replicate_size", "HSDP replicas (accelerate ParallelismConfig dp_replicate_size)"),
            ("dp_shard_size", "FSDP2 shard group size (dp_shard_size)"),
            ("tp_size", "tensor parallel size: transformers tp_plan, FSDP2 (tp_size)"),
            ("cp_size", "context parallel size: torch ring attention over the sequence, FSDP2 (cp_size)"),
            ("sp_size", "sequence parallel size: DeepSpeed Ulysses/ALST (sp_size)"),
            ("sp_backend", "sequence parallel backend (accelerate accepts only deepspeed)"),
            ("cp_comm_strategy", "context parallel rotation: allgather (default) or alltoall"),
        )
    },
    "mixed_precision": Setting(S, use=Use.SOURCE),  # accelerate's name (fitcheck launch, live objects)
    "sync_each_batch": Setting(B, use=Use.SOURCE),  # accelerate GradientAccumulationPlugin
    "accelerator_config": Setting(R, trainer_arg=_TA, use=Use.SOURCE),
    "parallelism_config": Setting(R, trainer_arg=_TA, use=Use.SOURCE),
    # hardware
    "gpu": Setting(
        S, "GPU name, e.g. H100-80GB, B200, RTX5090, or as nvidia-smi --query-gpu=name prints it (default {default})"
    ),
    "gpu_memory": Setting(Y, "memory per GPU instead of --gpu, e.g. 80GiB or 24GB"),
    "device_type": Setting(S, "cuda (default) or cpu (live tensors only: for validation against CPU runs)",
                           choice=Choice(DeviceType, "cuda, cpu")),
    "host_memory": Setting(Y, "RAM per node, to check CPU offload, e.g. 512GiB"),
    "expandable_segments": Setting(B, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is set"),
    "cuda_alloc_conf": Setting(S, "the PYTORCH_CUDA_ALLOC_CONF value the run uses, e.g. "
                               "'expandable_segments:True,max_split_size_mb:128' (default: the environment's)",
                               aliases=(Alias("pytorch_cuda_alloc_conf", "the environment variable's name"),)),
    "seq_lengths": Setting(S, "padded lengths of successive batches (padded to the longest), replayed through "
                           "the caching allocator for what they leave reserved: 512,1024,768,2048 (that order) or "
                           "MIN:MAX[:STEPS] (STEPS lengths, default 4, shortest first); at most 16; needs torch",
                           use=Use.CLI),  # read by readers/seq_lengths.py in the CLI
    "stack": Setting(R, "library versions to estimate for, e.g. transformers=4.46,peft=0.13 (default: the installed "
                     "ones)"),  # read by readers/versions.py
    # checks
    "device_map": Setting(S, "check a device_map (auto, balanced, sequential) for trainable parameters on "
                          "cpu/disk", use=Use.CLI),
    "max_memory": Setting(S, "max_memory for the device_map check, e.g. 0=24GiB,cpu=200GiB", use=Use.CLI),
    # --trainer and TRL 1.16's config fields (RunSettings fields; readers/trl_settings.py layers TRL's defaults for
    # absent ones and builds the TrainerSpec from them)
    "trainer": Setting(S, "trainer (default trainer)",
                       # orpo/cpo: accepted only to be refused with the reason (core/trainers/registry.py REFUSED)
                       cli_choices=(*(k.value for k in TrainerKind), *REFUSED)),
    "packing": Setting(B, "TRL config packing", trainer_arg=_TA),
    "padding_free": Setting(B, "TRL config padding_free", trainer_arg=_TA),
    "precompute_ref_log_probs": Setting(B, "TRL config precompute_ref_log_probs"),
    "use_vllm": Setting(B, "TRL config use_vllm"),
    **{
        name: Setting(kind, f"TRL config {name}")
        for name, kind in (
            ("max_prompt_length", INT),
            ("max_completion_length", INT),
            ("rpo_alpha", F),
            ("num_generations", INT),
            ("beta", F),
            ("generation_batch_size", INT),
            ("steps_per_generation", INT),
            ("vllm_mode", S),
            ("vllm_gpu_memory_utilization", F),
        )
    },
    "per_device_eval_batch_size": Setting(
        P, "TRL config per_device_eval_batch_size", (Alias("per_gpu_eval_batch_size"),), trainer_arg=_TA
    ),
    "eval_accumulation_steps": Setting(P, "TRL config eval_accumulation_steps", trainer_arg=_TA),
    "prediction_loss_only": Setting(B, "TRL config prediction_loss_only"),
    "save_only_model": Setting(
        B, "TrainingArguments save_only_model: checkpoints without the optimizer (under FSDP no optimizer state "
           "dict is gathered to the host)", trainer_arg=_TA),
    "loss_type": Setting(N, "DPO loss_type (KTO: kto or apo_zero_unpaired)"),
    # TrainingArguments / TRL fields read (type-checked, spellings reported) that no formula needs yet
    "bf16_full_eval": Setting(B, trainer_arg=_TA),
    "fp16_full_eval": Setting(B, trainer_arg=_TA),
    "learning_rate": Setting(F, trainer_arg=_TA),
    "weight_decay": Setting(F, trainer_arg=_TA),
    "adam_beta1": Setting(F, trainer_arg=_TA),
    "adam_beta2": Setting(F, trainer_arg=_TA),
    "adam_epsilon": Setting(F, trainer_arg=_TA),
    "max_grad_norm": Setting(F, trainer_arg=_TA),
    "eval_strategy": Setting(
        S, aliases=(Alias("evaluation_strategy", "transformers < 4.46 name"),), trainer_arg=_TA,
        note="transformers >= 4.41 name",
    ),
    "auto_find_batch_size": Setting(B, trainer_arg=_TA),
    "torch_empty_cache_steps": Setting(P, trainer_arg=_TA),
    "ddp_bucket_cap_mb": Setting(P, trainer_arg=_TA),
    "ddp_find_unused_parameters": Setting(B, trainer_arg=_TA),
    "use_cpu": Setting(B, aliases=(Alias("no_cuda", "transformers < 4.34 name of use_cpu"),), trainer_arg=_TA),
    "label_smoothing_factor": Setting(F, trainer_arg=_TA),
    "trust_remote_code": Setting(B, trainer_arg=_TA),
}


def _spellings(least: Reach, trainer_args_only: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, row in SETTINGS.items():
        if trainer_args_only and not row.trainer_arg:
            continue
        out[name] = name
        for alias in row.aliases:
            if alias.reach.value >= least.value:
                out[alias.name] = name
    return out


# TrainingArguments/TRL spelling -> canonical name (files, live objects, a script's argv).
SPELLINGS: dict[str, str] = _spellings(Reach.FILES, trainer_args_only=True)
# Any accepted spelling -> canonical name (flat values).
_ANY_SPELLING: dict[str, str] = _spellings(Reach.VALUES, trainer_args_only=False)


def canonical_key(key: str) -> str:
    """Map an alias (``torch_dtype``, ``activation_checkpointing``, ``max_length``) to its canonical name."""
    k = key.replace("-", "_").lstrip("_")
    return _ANY_SPELLING.get(k, k)


def cli_spellings(name: str) -> list[str]:
    """The ``fitcheck estimate`` spellings of a flag: ``--name``, ``--name-with-dashes``, CLI aliases."""
    out = [f"--{name}"]
    if "_" in name:
        out.append(f"--{name.replace('_', '-')}")
    out += [f"--{a.name}" for a in SETTINGS[name].aliases if a.reach is Reach.CLI]
    return out


def cli_rows() -> list[tuple[str, Setting]]:
    """The rows that are ``fitcheck estimate`` flags, in --help order."""
    return [(name, row) for name, row in SETTINGS.items() if row.help is not None]


def convert(kind: Kind, value: object, at: str) -> object:
    """Read one raw value as its kind.

    Args:
        kind: The row's kind.
        value: The raw value (flag text, JSON/YAML value, attribute; an Enum is read by its value).
        at: Where it was read, for the message.

    Raises:
        ConfigError: The value does not have that kind.
    """
    if kind is Kind.POSINT:
        return as_int(value, at=at, minimum=1)
    if kind is Kind.INT:
        return as_int(value, at=at)
    if kind is Kind.FLOAT:
        return as_float(value, at=at)
    if kind is Kind.BOOL:
        return as_bool(value, at=at)
    if kind is Kind.STR:
        return as_str(value.value if isinstance(value, Enum) else value, at=at)
    if kind is Kind.NAMES:
        return as_str_list(value, at=at)
    if kind is Kind.INDICES:
        return _indices(value, at)
    if kind is Kind.MAPPING:
        return as_mapping(value, at=at)
    if kind is Kind.BYTES:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return parse_bytes(value if isinstance(value, (int, float)) else str(value), what=at)
    return value


def _indices(value: object, at: str) -> tuple[int, ...]:
    items: list[object]
    if isinstance(value, str):
        items = list(value.replace(",", " ").split())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    try:
        return tuple(int(str(x)) for x in items)
    except ValueError:
        raise ConfigError(f"{at}: expected layer indices (integers), got {value!r}") from None


def choose(name: str, value: object, at: str) -> object:
    """Read a value as its row's fixed names (after :func:`convert`); other rows pass through.

    Raises:
        ConfigError: The value is not one of the names.
    """
    choice = SETTINGS[name].choice
    if choice is None:
        return value
    try:
        return choice.parse(str(value).strip().lower())
    except (ValueError, KeyError):
        raise ConfigError(f"{at}: {value!r} is not one of {choice.allowed}") from None


def trainer_arg_notes() -> Mapping[str, dict[str, str]]:
    """Canonical TrainingArguments/TRL name -> spelling notes (for the "spelling-read" finding)."""
    return {name: row.notes(name) for name, row in SETTINGS.items() if row.trainer_arg}

