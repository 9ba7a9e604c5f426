"""How the model is trained: precision, optimizer, adapters, quantization, batch, activations, hardware, and the
:class:`TrainingSpec` that holds them all (with the sharding of :mod:`.sharding` and the trainer and library
stack of :mod:`.trainer`).

Part of :mod:`fitcheck.spec` (import from there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, get_args

from fitcheck.findings import Finding
from fitcheck.spec.adapters import PeftAdapterSpec
from fitcheck.spec.model import Dtype, ModelInventory
from fitcheck.spec.sharding import ShardingSpec
from fitcheck.spec.trainer import StackSpec, TrainerSpec


class MixedPrecision(str, Enum):
    """Autocast setting (TrainingArguments ``bf16``/``fp16``, accelerate ``mixed_precision``)."""

    NO = "no"
    BF16 = "bf16"
    FP16 = "fp16"

    @classmethod
    def from_flags(cls, bf16: object, fp16: object) -> MixedPrecision:
        """TrainingArguments ``bf16``/``fp16`` (truthy values) as one setting; bf16 wins when both are set."""
        return cls.BF16 if bf16 else cls.FP16 if fp16 else cls.NO


@dataclass(frozen=True)
class PrecisionSpec:
    """The dtype the model is loaded in and the autocast setting.

    Attributes:
        load_dtype: ``dtype``/``torch_dtype`` passed to ``from_pretrained`` (transformers 5 default
            ``"auto"`` = the config's dtype).
        mixed_precision: Autocast under the Trainer/accelerate.
        module_cast: Every floating parameter, peft's fp32 LoRA adapters included, is ``load_dtype``: DeepSpeed's
            fp16/bf16 module cast (deepspeed 0.19.8 ``runtime/engine.py`` ``_cast_module_mixed_precision``). Set
            only by ``core.kernels.deepspeed_module_view``, the view the activations are computed on.
    """

    load_dtype: Dtype = Dtype.FLOAT32
    mixed_precision: MixedPrecision = MixedPrecision.NO
    module_cast: bool = False


# transformers 5.23 training_args.py OptimizerNames, in declaration order.
CurrentOptimizerName = Literal[
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_torch_xla",
    "adamw_torch_npu_fused",
    "adafactor",
    "adamw_anyprecision",
    "adamw_torch_4bit",
    "adamw_torch_8bit",
    "ademamix",
    "sgd",
    "adagrad",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "ademamix_8bit",
    "lion_8bit",
    "lion_32bit",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
    "galore_adamw",
    "galore_adamw_8bit",
    "galore_adafactor",
    "galore_adamw_layerwise",
    "galore_adamw_8bit_layerwise",
    "galore_adafactor_layerwise",
    "lomo",
    "adalomo",
    "grokadamw",
    "schedule_free_radam",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "apollo_adamw",
    "apollo_adamw_layerwise",
    "stable_adamw",
]

# Names a transformers 4.x Trainer accepted that 5.x rejects, kept in a spec only for a stack that still has them
# (``fitcheck.core.optimizers.by_name.canonical_optimizer``): "adamw_hf" is transformers' own ``AdamW`` class,
# the Trainer's ``optim`` default up to 4.x (4.16.2 training_args.py: ``default="adamw_hf"``) and removed in
# 4.50 (transformers PR #36177).
LegacyOptimizerName = Literal["adamw_hf"]

# What a spec's optimizer may be named: a 5.23 name, or a legacy one on a stack that has it.
OptimizerName = Literal[CurrentOptimizerName, LegacyOptimizerName]


OPTIMIZER_NAMES: tuple[CurrentOptimizerName, ...] = get_args(CurrentOptimizerName)
LEGACY_OPTIMIZER_NAMES: tuple[LegacyOptimizerName, ...] = get_args(LegacyOptimizerName)


DEFAULT_OPTIMIZER: OptimizerName = "adamw_torch_fused"  # transformers training_args.py default_optim, torch >= 2.8


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer, by its ``TrainingArguments.optim`` name.

    Attributes:
        name: Current transformers name (retired names are mapped by the reader, with a finding), or a legacy
            name the stack's transformers still has (``LEGACY_OPTIMIZER_NAMES``).
        args: ``optim_args`` key/values that change memory (e.g. GaLore rank).
        target_modules: ``optim_target_modules`` for GaLore/APOLLO.
    """

    name: OptimizerName = DEFAULT_OPTIMIZER
    args: Mapping[str, str] = field(default_factory=dict)
    target_modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoraSpec:
    """A PEFT LoRA configuration.

    Attributes:
        r: Rank.
        alpha: lora_alpha (scaling only; no memory effect).
        dropout: lora_dropout (> 0 saves a dropout mask/copy of the adapter input).
        target_modules: Module short names, or ``("all-linear",)``; empty with ``target_regex`` set.
        target_regex: A regex over full module names (peft's string form of target_modules).
        modules_to_save: Modules made fully trainable copies (e.g. ``lm_head``, ``embed_tokens``).
        use_dora: DoRA (adds a magnitude vector per target and extra activations).
        use_rslora: rsLoRA (scaling only; no memory effect).
        target_parameters: Parameter names for peft's ParamWrapper (fused MoE experts).
        layers_to_transform: Only these layer indices get adapters.
        rank_pattern: Per-module rank overrides.
    """

    r: int = 8
    alpha: float = 8.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ()
    target_regex: str | None = None
    modules_to_save: tuple[str, ...] = ()
    use_dora: bool = False
    use_rslora: bool = False
    target_parameters: tuple[str, ...] = ()
    layers_to_transform: tuple[int, ...] | None = None
    rank_pattern: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.r <= 0:
            raise ValueError(f"lora r must be positive, got {self.r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class QuantSpec:
    """A bitsandbytes quantized base (BitsAndBytesConfig).

    Attributes:
        bits: 4 or 8.
        quant_type: ``"nf4"`` or ``"fp4"`` (4-bit only).
        double_quant: ``bnb_4bit_use_double_quant``.
        blocksize: Quantization block size (bitsandbytes default 64).
        quant_storage: ``bnb_4bit_quant_storage`` (uint8 default; bf16 for FSDP-QLoRA).
        compute_dtype: ``bnb_4bit_compute_dtype`` (None = float32 in transformers).
        skip_modules: ``llm_int8_skip_modules`` (kept unquantized).
        prepare_for_kbit_training: peft's ``prepare_model_for_kbit_training`` is applied (TRL does this for
            quantized models): casts every non-quantized 16-bit parameter to fp32.
        pre_quantized: The checkpoint itself is quantized (its config.json carries quantization_config).
        method: ``quant_method``: ``"bitsandbytes"``, or a pre-quantized scheme ``"gptq"``, ``"awq"``, ``"fp8"``
            (finegrained FP8), ``"compressed-tensors"`` (FP8 / int weights), ``"mxfp4"``
            (:mod:`fitcheck.core.states.prequant`, :mod:`fitcheck.core.states.mxfp4`).
        group_size: GPTQ/AWQ group size along the input features (-1 = one group per row).
        desc_act: GPTQ act-order (``g_idx`` is stored either way).
        zero_point: AWQ/GPTQ asymmetric zeros (stored either way in the GPTQ/AWQ checkpoint layouts).
        block_size: FP8 ``weight_block_size`` (out, in); None = one scale per tensor (per output channel for
            compressed-tensors ``strategy: channel``).
        dequantize: MXFP4 loaded with ``Mxfp4Config(dequantize=True)`` (bf16 experts; what training requires).
        int8_threshold: ``llm_int8_threshold`` (transformers 5.23 ``BitsAndBytesConfig`` default 6.0): an 8-bit
            base's outlier threshold; bitsandbytes' CUDA ``MatMul8bitLt`` copies the input columns holding an
            ``|x| >=`` it (``core/activations/int8_outliers.py``); 0 turns that path off.
    """

    bits: int = 4
    quant_type: str = "nf4"
    double_quant: bool = False
    blocksize: int = 64
    quant_storage: Dtype = Dtype.UINT8
    compute_dtype: Dtype | None = None
    skip_modules: tuple[str, ...] = ()
    prepare_for_kbit_training: bool = True
    pre_quantized: bool = False
    method: str = "bitsandbytes"
    group_size: int = 128
    desc_act: bool = False
    zero_point: bool = True
    block_size: tuple[int, int] | None = None
    dequantize: bool = False
    int8_threshold: float = 6.0

    def __post_init__(self) -> None:
        if self.method != "bitsandbytes":
            if self.bits not in (2, 3, 4, 8):
                raise ValueError(f"{self.method}: bits must be 2, 3, 4 or 8, got {self.bits}")
            return
        if self.bits not in (4, 8):
            raise ValueError(f"quantization bits must be 4 or 8, got {self.bits}")
        if self.quant_type not in ("nf4", "fp4"):
            raise ValueError(f"bnb_4bit_quant_type must be nf4 or fp4, got {self.quant_type!r}")
        if self.blocksize <= 0:
            raise ValueError("quantization blocksize must be positive")


@dataclass(frozen=True)
class FreezeSpec:
    """Training without PEFT where only some parameters are trainable (router-only, first-k layers, ...).

    Attributes:
        trainable: fnmatch patterns over parameter names (layer index as ``*``) that stay trainable.
        trainable_layers: If set, per-layer parameters are trainable only in these layer indices.
    """

    trainable: tuple[str, ...] = ()
    trainable_layers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BatchSpec:
    """Batch geometry.

    Attributes:
        micro_batch: ``per_device_train_batch_size``.
        seq_len: Length of every sequence in the micro-batch (padded or packed to it: the worst case).
        grad_accum: ``gradient_accumulation_steps``.
    """

    micro_batch: int = 1
    seq_len: int = 1024
    grad_accum: int = 1

    def __post_init__(self) -> None:
        for name in ("micro_batch", "seq_len", "grad_accum"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class AttnImpl(str, Enum):
    """``attn_implementation``."""

    EAGER = "eager"
    SDPA = "sdpa"
    FLASH_ATTENTION_2 = "flash_attention_2"


@dataclass(frozen=True)
class LigerSpec:
    """Liger-Kernel patches (TrainingArguments ``use_liger_kernel`` + ``liger_kernel_config``).

    Defaults are liger_kernel 0.8.5 ``apply_liger_kernel_to_llama`` (transformers/monkey_patch.py), which
    transformers' ``apply_liger_kernel`` calls with the config as keyword arguments.

    Attributes:
        rope: Liger rotary embedding.
        rms_norm: Liger RMSNorm (saves its input and an fp32 rstd per row).
        swiglu: Liger SwiGLU/GEGLU MLP (``swiglu`` or ``geglu`` key: saves gate and up outputs only).
        fused_linear_cross_entropy: LM head fused with the loss (no logits are materialised).
        cross_entropy: Liger's (unfused) cross-entropy on materialised logits.
    """

    rope: bool = True
    rms_norm: bool = True
    swiglu: bool = True
    fused_linear_cross_entropy: bool = True
    cross_entropy: bool = False


# ``--loss`` values: the implementation computing the LM loss (fitcheck/core/kernels/__init__.py documents each).
LossKind = Literal["torch", "liger-flce", "cce", "full-logits"]


LOSS_IMPLEMENTATIONS: tuple[LossKind, ...] = get_args(LossKind)


@dataclass(frozen=True)
class ActivationSpec:
    """What decides activation memory besides the batch.

    Attributes:
        checkpointing: Gradient (activation) checkpointing.
        checkpoint_every_n_layers: Checkpoint one layer in n (transformers 5 ``every_n_layers``).
        attn_implementation: Attention kernel.
        loss: ``"torch"`` (transformers' ForCausalLMLoss on full logits), ``"liger-flce"`` (Liger's fused
            linear cross-entropy), ``"cce"`` (Apple's Cut Cross-Entropy) or ``"full-logits"`` (a TRL DPO subclass
            computing log-probs from the full fp32 logits: LLaMA-Factory's CustomDPOTrainer); see
            ``LOSS_IMPLEMENTATIONS``.
        liger: Liger-Kernel patches, when ``use_liger_kernel`` is on.
        offload_activations: TRL ``activation_offloading`` (saved tensors moved to pinned host memory).
        use_reentrant: ``gradient_checkpointing_kwargs={"use_reentrant": True}``.
        torch_compile: TrainingArguments ``torch_compile`` (not modelled: a warning finding says so).
    """

    checkpointing: bool = False
    checkpoint_every_n_layers: int = 1
    attn_implementation: AttnImpl = AttnImpl.SDPA
    loss: LossKind = "torch"
    liger: LigerSpec | None = None
    offload_activations: bool = False
    use_reentrant: bool = False
    torch_compile: bool = False


class DeviceType(str, Enum):
    """Where the step runs."""

    CUDA = "cuda"
    CPU = "cpu"


@dataclass(frozen=True)
class HardwareSpec:
    """The GPU (or CPU for validation) and host.

    Attributes:
        gpu_name: Canonical GPU name from the table, or None when only a memory size was given.
        gpu_memory_bytes: Memory per device.
        device_type: ``cuda`` adds CUDA overheads; ``cpu`` counts live tensors only (validation).
        host_memory_bytes: RAM per node, when known.
        peak_tflops_bf16: Dense bf16 peak of the GPU (compute estimate), when known.
        expandable_segments: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` is set (the caching
            allocator grows segments instead of creating new ones: less reserved-vs-allocated gap).
        cuda_alloc_conf: The ``PYTORCH_CUDA_ALLOC_CONF`` value (``max_split_size_mb``, ``roundup_power2_divisions``,
            ``garbage_collection_threshold``, ``expandable_segments``), as read by the CLI or an integration; the
            core parses it (``fitcheck.core.caching``) and reads no environment.
    """

    gpu_name: str | None = None
    gpu_memory_bytes: int = 80 * 1024**3
    device_type: DeviceType = DeviceType.CUDA
    host_memory_bytes: int | None = None
    peak_tflops_bf16: float | None = None
    expandable_segments: bool = False
    cuda_alloc_conf: str = ""

    def __post_init__(self) -> None:
        if self.gpu_memory_bytes <= 0:
            raise ValueError("gpu memory must be positive")


@dataclass(frozen=True)
class TrainingSpec:
    """Everything the estimator needs about one training run.

    Attributes:
        model: The parameter inventory and shape.
        precision: Load dtype and autocast.
        optimizer: The optimizer.
        batch: Micro-batch, sequence length, accumulation.
        activations: Checkpointing, attention kernel, loss.
        sharding: Processes and sharding.
        hardware: GPU and host.
        lora: PEFT LoRA, if any.
        peft: A PEFT adapter other than LoRA (estimated from the built peft model only), if any.
        quant: bitsandbytes quantized base, if any.
        freeze: Partial training without PEFT, if any.
        trainer: The trainer (plain Trainer by default; TRL's SFT/DPO/GRPO/Reward: ``fitcheck.core.trainers``).
        provenance: Field path (e.g. ``"batch.micro_batch"``) -> where it was read ("ds.json:train_micro_...").
        findings: Findings the readers already made (conflicts, retired names, spellings read).
        stack: Library versions of the environment (installed or ``--stack``); empty = the modelled ones.
    """

    model: ModelInventory
    precision: PrecisionSpec = PrecisionSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    batch: BatchSpec = BatchSpec()
    activations: ActivationSpec = ActivationSpec()
    sharding: ShardingSpec = ShardingSpec()  # noqa: RUF009 (a frozen dataclass: one shared default is safe)
    hardware: HardwareSpec = HardwareSpec()
    lora: LoraSpec | None = None
    quant: QuantSpec | None = None
    freeze: FreezeSpec | None = None
    trainer: TrainerSpec = TrainerSpec()  # noqa: RUF009 (frozen, as sharding)
    provenance: Mapping[str, str] = field(default_factory=dict, compare=False)
    findings: tuple[Finding, ...] = ()
    stack: StackSpec = StackSpec()  # noqa: RUF009 (frozen, as sharding)
    peft: PeftAdapterSpec | None = None

    @property
    def data_parallel_size(self) -> int:
        """Data-parallel world size: processes // (tp * cp * sp) (transformers ``Trainer`` dp_world_size)."""
        par = self.sharding.parallelism
        if par is None:
            return self.sharding.num_processes
        return max(1, self.sharding.num_processes // par.non_data_parallel)
