"""One typed, frozen value per run setting, each with where it was read.

:class:`RunSettings` is what the readers hand to :mod:`fitcheck.readers.run_args` (and what
:class:`fitcheck.readers.merge.MergedRun` carries): one field per ``Use.RUN`` row of
:data:`fitcheck.readers.settings_table.SETTINGS`, holding its default until a source gives it. The default of
each setting is written here, once. ``provenance`` says where each given value was read (``"--bf16"``,
``"args.json:bf16"``, ``"ds.json:train_micro_batch_size_per_gpu"``); a name absent from it took the default.

Defaults: TrainingArguments (transformers 5.23 ``training_args.py``: micro-batch 8, accumulation 1, bf16/fp16
off), TRL ``ModelConfig`` (LoRA r=16, alpha=32, dropout=0.05) and ``SFTConfig.max_length`` 1024, bitsandbytes
(``bnb_4bit_blocksize`` 64, storage uint8), accelerate (one process on one machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from types import MappingProxyType

from fitcheck.errors import ConfigError
from fitcheck.readers.settings_table import (
    SETTINGS,
    Kind,
    Use,
    canonical_key,
    choose,
    cli_rows,
    cli_spellings,
    convert,
)
from fitcheck.spec import ActivationSpec, AttnImpl, DeviceType, Dtype, HardwareSpec, QuantSpec, TrainerKind

DEFAULT_GPU = "H100-80GB"


@dataclass(frozen=True)
class RunSettings:
    """Every run setting fitcheck reads, typed, with its default (see the module docstring).

    ``None`` means "not given, and the default depends on something else" (the model's dtype, peft's target
    table, the GPU table); ``provenance`` tells a given value from a default.
    """

    # model
    model_name_or_path: str | None = None
    dtype: Dtype | None = None  # None: "auto", the config's dtype (transformers 5 from_pretrained default)
    attn_implementation: AttnImpl = ActivationSpec.attn_implementation
    trust_remote_code: bool = False
    # batch
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_seq_length: int = 1024
    per_device_eval_batch_size: int | None = None
    eval_accumulation_steps: int | None = None
    # precision / optimizer
    bf16: bool = False
    fp16: bool = False
    bf16_full_eval: bool = False
    fp16_full_eval: bool = False
    optim: str | None = None  # None: spec.DEFAULT_OPTIMIZER (transformers default_optim on torch >= 2.8)
    optim_args: str | None = None
    optim_target_modules: tuple[str, ...] = ()
    learning_rate: float | None = None
    weight_decay: float | None = None
    adam_beta1: float | None = None
    adam_beta2: float | None = None
    adam_epsilon: float | None = None
    max_grad_norm: float | None = None
    # activations
    gradient_checkpointing: bool = False
    gradient_checkpointing_kwargs: Mapping[str, object] | None = None
    checkpoint_every_n_layers: int = ActivationSpec.checkpoint_every_n_layers
    loss: str | None = None  # None: transformers' cross-entropy ("torch"); read by readers/kernel_settings.py
    use_liger_kernel: bool = False
    liger_kernel_config: object = None  # a mapping or its JSON text (readers/kernel_settings.py reads it)
    activation_offloading: bool = False
    torch_compile: bool = False
    # peft
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_target_modules: tuple[str, ...] | None = None  # None (or empty): peft's table for the model type
    lora_modules_to_save: tuple[str, ...] = ()
    lora_target_parameters: tuple[str, ...] = ()
    lora_layers_to_transform: tuple[int, ...] | None = None
    use_dora: bool = False
    use_rslora: bool = False
    # quantization
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_4bit_quant_type: str = QuantSpec.quant_type  # nf4, TRL ModelConfig's default too
    use_bnb_nested_quant: bool = False
    bnb_4bit_quant_storage: Dtype = QuantSpec.quant_storage
    bnb_4bit_compute_dtype: Dtype | None = None  # None: the load dtype (TRL get_quantization_config)
    llm_int8_skip_modules: tuple[str, ...] = ()
    bnb_4bit_blocksize: int = QuantSpec.blocksize
    prepare_for_kbit_training: bool = QuantSpec.prepare_for_kbit_training
    # partial training
    trainable_parameters: tuple[str, ...] | None = None
    trainable_layers: tuple[int, ...] | None = None
    # distributed
    num_processes: int = 1
    num_machines: int = 1
    # hardware
    gpu: str | None = None  # None: DEFAULT_GPU unless gpu_memory is given
    gpu_memory: int | None = None  # bytes
    device_type: DeviceType = HardwareSpec.device_type
    host_memory: int | None = None  # bytes
    expandable_segments: bool = False
    cuda_alloc_conf: str = ""
    stack: object = None  # "transformers=4.46,peft=0.13" (or a mapping); None: the installed versions
    # TrainingArguments / TRL fields read (typed, spellings reported) that no formula needs yet
    eval_strategy: str | None = None
    auto_find_batch_size: bool = False
    torch_empty_cache_steps: int | None = None
    ddp_bucket_cap_mb: int | None = None
    ddp_find_unused_parameters: bool | None = None
    use_cpu: bool = False
    label_smoothing_factor: float | None = None
    # --trainer and TRL 1.16's config fields; None: the trainer's TRL config default, layered by
    # readers/trl_settings.py trl_default_layer (core/trainers/registry.py ``defaults`` column)
    trainer: str = TrainerKind.TRAINER.value  # a TrainerKind value, or orpo/cpo (refused with the reason)
    packing: bool = False
    padding_free: bool = False
    precompute_ref_log_probs: bool = False
    use_vllm: bool = False
    max_prompt_length: int | None = None
    max_completion_length: int | None = None
    rpo_alpha: float | None = None
    num_generations: int | None = None
    beta: float | None = None
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    vllm_mode: str | None = None
    vllm_gpu_memory_utilization: float | None = None
    prediction_loss_only: bool = True  # absent: Trainer.evaluate without compute_metrics (loss only)
    save_only_model: bool = False  # TrainingArguments' default: checkpoints save the optimizer too
    loss_type: tuple[str, ...] | None = None  # None: DPOConfig's ("sigmoid",), KTOConfig's ("kto",)
    # where each value was read (also "deepspeed.<key>" and other merge notes); the names a source gave
    provenance: Mapping[str, str] = field(default_factory=dict, compare=False)
    given_names: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        """No mutable dict leaves the readers: provenance and mapping-valued settings become read-only views."""
        object.__setattr__(self, "provenance", MappingProxyType(dict(self.provenance)))
        for name in _MAPPING_FIELDS:
            value = getattr(self, name)
            if isinstance(value, Mapping) and not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    def given(self, name: str) -> bool:
        """True when a source gave the setting (False: it holds its default)."""
        return name in self.given_names

    def where(self, name: str) -> str:
        """Where the setting was read, for messages (``--name`` when it was not read anywhere)."""
        return self.provenance.get(name, f"--{name}")

    @property
    def values(self) -> Mapping[str, object]:
        """The given settings by canonical name (a read-only view; defaults are not listed)."""
        return MappingProxyType({n: getattr(self, n) for n in self.given_names})

    @classmethod
    def from_values(cls, values: Mapping[str, object], provenance: Mapping[str, str] | None = None) -> RunSettings:
        """Read flat values (canonical names or any alias; ``None`` = not given) into typed settings.

        Every value is read by its row of the settings table (one conversion per kind, then the row's fixed
        names); names the table does not list as run settings are passed over.

        Args:
            values: Name -> raw or already-typed value.
            provenance: Name -> where it was read (for messages and reports).

        Returns:
            The settings.

        Raises:
            ConfigError: Every value that cannot be read, collected; each names where it was read.
        """
        prov = dict(provenance or {})
        typed: dict[str, object] = {}
        problems: list[str] = []
        for key, raw in values.items():
            name = canonical_key(key)
            if raw is None or name not in _RUN_NAMES:
                continue
            at = prov.get(name, f"--{name}")
            try:
                typed[name] = choose(name, convert(SETTINGS[name].kind, raw, at), at)
            except ConfigError as exc:
                problems.extend(exc.problems)
        if problems:
            raise ConfigError.collect(problems)
        return cls(**typed, provenance=prov, given_names=frozenset(typed))  # type: ignore[arg-type]


_RUN_NAMES: frozenset[str] = frozenset(n for n, row in SETTINGS.items() if row.use is Use.RUN)
# settings whose value may be a mapping (read-only views once typed)
_MAPPING_FIELDS = ("gradient_checkpointing_kwargs", "liger_kernel_config", "stack")
_FIELDS = frozenset(f.name for f in fields(RunSettings)) - {"provenance", "given_names"}
if _FIELDS != _RUN_NAMES:  # the table and the settings must list the same names
    raise AssertionError(
        f"settings table and RunSettings differ: {sorted(_FIELDS ^ _RUN_NAMES)}"
    )  # pragma: no cover
DEFAULTS = RunSettings()


@dataclass(frozen=True)
class CliFlag:
    """One ``fitcheck estimate`` flag, derived from its row of the settings table.

    Attributes:
        name: The canonical name (the argparse ``dest``).
        spellings: ``--name``, ``--name-with-dashes`` and the aliases offered on the command line.
        kind: ``"bool"`` (an optional true/false), ``"list"`` (one or more values) or ``"value"`` (one).
        help: The help text, default filled in.
        choices: The values argparse accepts (none: any).
    """

    name: str
    spellings: tuple[str, ...]
    kind: str
    help: str
    choices: tuple[str, ...] = ()


def cli_flags() -> list[CliFlag]:
    """The ``fitcheck estimate`` flags, in --help order."""
    return list(_cli_flags())


@cache
def _cli_flags() -> tuple[CliFlag, ...]:
    """:func:`cli_flags`, derived once per process from the constant settings table (the CLI asks three times:
    the ``estimate`` and ``plot`` parsers and the explicit values)."""
    out = []
    for name, row in cli_rows():
        kind = "bool" if row.kind is Kind.BOOL else "list" if row.kind in (Kind.NAMES, Kind.INDICES) else "value"
        out.append(CliFlag(name, tuple(cli_spellings(name)), kind, flag_help(name) or "", row.cli_choices))
    return tuple(out)


def flag_help(name: str) -> str | None:
    """The ``fitcheck estimate`` help text of a flag, with its default filled in."""
    text = SETTINGS[name].help
    if text is None or "{default" not in text:
        return text
    default = getattr(DEFAULTS, name, None)
    if name == "optim":
        from fitcheck.spec import DEFAULT_OPTIMIZER

        default = DEFAULT_OPTIMIZER
    elif name == "gpu":
        default = DEFAULT_GPU
    return text.format(default=default)
