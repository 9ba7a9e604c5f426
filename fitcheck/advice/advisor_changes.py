"""The changes the advisor tries ("levers"): each a spec transform, its flags and its words (pure).

A lever is one change a user can make, expressed three ways that must agree: a transform of the frozen spec
(``dataclasses.replace``), the ``fitcheck estimate`` flags that describe it, and what to change in the
user's own terms (TrainingArguments field, DeepSpeed key, accelerate config key). ``fitcheck.advice.advisor``
applies them, alone and in pairs, and ranks the results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from fitcheck.advice.load_dtype import load_bf16, wants_bf16_lever
from fitcheck.report import Category, Location, Report
from fitcheck.spec import (
    AttnImpl,
    DeepSpeedSpec,
    Dtype,
    LoraSpec,
    OffloadDevice,
    OptimizerName,
    QuantSpec,
    Strategy,
    TrainingSpec,
)


class Tier(str, Enum):
    """What a suggestion costs besides time (the ranking's first key after the verdict)."""

    SAME_TRAINING = "same training"
    OPTIMIZER_NUMERICS = "optimizer numerics"
    METHOD = "training method"
    HARDWARE = "hardware"
    DATA = "data"


TIER_ORDER = {t: i for i, t in enumerate(Tier)}

# Optimizers with two 32-bit (or parameter-dtype) Adam states that bitsandbytes' 8-bit AdamW replaces
# (transformers/training_args.py OptimizerNames).
_ADAM_FULL_STATE = {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw_torch_xla"}
# DGX/HGX nodes hold 8 GPUs; a suggestion of more than 8 processes spreads them over nodes of 8.
GPUS_PER_NODE = 8
# The LoRA that TRL's ModelConfig defaults give (r=16, alpha=32, dropout=0.05) on every linear layer.
_LORA_R, _LORA_ALPHA, _LORA_DROPOUT = 16, 32, 0.05


@dataclass(frozen=True)
class Lever:
    key: str
    title: str
    tier: Tier
    apply: Callable[[TrainingSpec], TrainingSpec]
    argv: tuple[str, ...]
    changes: tuple[str, ...]
    group: str  # levers of one group set the same fields: never combined
    notes: tuple[str, ...] = ()
    pairable: bool = True


def with_deepspeed(spec: TrainingSpec, **changes: Any) -> TrainingSpec:
    """The spec under DeepSpeed with ``changes`` to its settings.

    A run not yet under DeepSpeed gets the config accelerate builds from ``--zero_stage`` alone (batch keys
    "auto", resolved by the same reader the CLI uses, ``fitcheck.readers.deepspeed.resolve_deepspeed``), so
    that the suggestion's flags reproduce its estimate.
    """
    ds = spec.sharding.deepspeed
    if ds is None:
        ds = _fresh_deepspeed(spec)
    return replace(
        spec, sharding=replace(spec.sharding, strategy=Strategy.DEEPSPEED, deepspeed=replace(ds, **changes))
    )


def _fresh_deepspeed(spec: TrainingSpec) -> DeepSpeedSpec:
    from fitcheck.readers import accelerate_deepspeed_config, resolve_deepspeed

    raw = accelerate_deepspeed_config()  # what accelerate builds from --zero_stage alone
    run: dict[str, object] = {
        "per_device_train_batch_size": spec.batch.micro_batch,
        "gradient_accumulation_steps": spec.batch.grad_accum,
    }
    read = resolve_deepspeed(
        raw,
        source="command line",
        run=run,
        run_provenance={},
        world_size=spec.data_parallel_size,
        hidden_size=spec.model.shape.hidden_size,
    )
    return read.spec


def _logits_at_peak(report: Report) -> int:
    return sum(
        c.at(report.peak_phase)
        for c in report.components
        if c.category is Category.LOGITS and c.location is Location.DEVICE
    )


def _lora_spec(spec: TrainingSpec) -> LoraSpec:
    # peft's ParamWrapper (fused MoE experts under all-linear) refuses lora_dropout != 0 (design note 04).
    dropout = 0.0 if spec.model.shape.num_experts else _LORA_DROPOUT
    return LoraSpec(r=_LORA_R, alpha=float(_LORA_ALPHA), dropout=dropout, target_modules=("all-linear",))


def _lora_argv(lora: LoraSpec) -> tuple[str, ...]:
    return (
        "--use_peft",
        "--lora_r",
        str(lora.r),
        "--lora_alpha",
        f"{lora.alpha:g}",
        "--lora_dropout",
        f"{lora.dropout:g}",
        "--lora_target_modules",
        "all-linear",
    )


Transform = Callable[[TrainingSpec], TrainingSpec]


def _checkpointing(every: int) -> Transform:
    def apply(s: TrainingSpec) -> TrainingSpec:
        acts = replace(s.activations, checkpointing=True, checkpoint_every_n_layers=every)
        return replace(s, activations=acts)

    return apply


def _sdpa(s: TrainingSpec) -> TrainingSpec:
    return replace(s, activations=replace(s.activations, attn_implementation=AttnImpl.SDPA))


def _chunked_loss(s: TrainingSpec) -> TrainingSpec:
    from fitcheck.spec import LigerSpec

    return replace(s, activations=replace(s.activations, liger=LigerSpec()))


def _optimizer(name: OptimizerName) -> Transform:
    def apply(s: TrainingSpec) -> TrainingSpec:
        return replace(s, optimizer=replace(s.optimizer, name=name))

    return apply


def _deepspeed(**changes: Any) -> Transform:
    def apply(s: TrainingSpec) -> TrainingSpec:
        return with_deepspeed(s, **changes)

    return apply


def _peft(lora: LoraSpec, quant: QuantSpec | None) -> Transform:
    def apply(s: TrainingSpec) -> TrainingSpec:
        return replace(s, lora=lora, quant=quant)

    return apply


CKPT_WORDS = "TrainingArguments gradient_checkpointing=True (transformers 5: activation_checkpointing=True)"
_DS_WORDS = "accelerate config: distributed_type: DEEPSPEED, deepspeed_config.zero_stage: {stage}"


def _memory_levers(spec: TrainingSpec, report: Report) -> list[Lever]:
    """Levers that keep the training the same (checkpointing, kernels, loss, optimizer states)."""
    out: list[Lever] = []
    acts = spec.activations
    if not acts.checkpointing or acts.checkpoint_every_n_layers > 1:
        extra = ("--checkpoint_every_n_layers", "1") if acts.checkpoint_every_n_layers != 1 else ()
        out.append(
            Lever(
                "checkpointing",
                "gradient checkpointing",
                Tier.SAME_TRAINING,
                _checkpointing(1),
                ("--gradient_checkpointing", *extra),
                (CKPT_WORDS,),
                "checkpointing",
            )
        )
    if not acts.checkpointing and spec.model.shape.num_layers >= 4:
        words = CKPT_WORDS + " with activation_checkpointing_kwargs={'every_n_layers': 2}"
        out.append(
            Lever(
                "checkpointing_every_2",
                "gradient checkpointing on every 2nd layer",
                Tier.SAME_TRAINING,
                _checkpointing(2),
                ("--gradient_checkpointing", "--checkpoint_every_n_layers", "2"),
                (words,),
                "checkpointing",
            )
        )
    if acts.attn_implementation is AttnImpl.EAGER:
        out.append(
            Lever(
                "sdpa",
                "sdpa attention instead of eager",
                Tier.SAME_TRAINING,
                _sdpa,
                ("--attn_implementation", "sdpa"),
                ("from_pretrained(..., attn_implementation='sdpa') (or 'flash_attention_2')",),
                "attention",
                notes=("the FLOPs model counts no speed-up; sdpa is usually faster than eager",),
            )
        )
    liger_ok = spec.model.shape.traits.liger_patched and acts.liger is None and acts.loss == "torch"
    if liger_ok and spec.model.shape.causal_lm and _logits_at_peak(report) > 0:
        out.append(
            Lever(
                "chunked_loss",
                "Liger kernels (fused linear cross-entropy, RMSNorm, SwiGLU)",
                Tier.SAME_TRAINING,
                _chunked_loss,
                ("--use_liger_kernel", "true"),
                (
                    "TrainingArguments use_liger_kernel=True (pip install liger-kernel; needs a GPU: Triton)",
                ),
                "loss",
            )
        )
    if wants_bf16_lever(spec):  # fp32 only because no dtype was passed (advice/load_dtype.py)
        out.append(
            Lever(
                "load_bf16",
                "load the weights in bf16",
                Tier.SAME_TRAINING if spec.model.shape.config_dtype is not None else Tier.OPTIMIZER_NUMERICS,
                load_bf16,
                ("--dtype", "bfloat16"),
                ("from_pretrained(..., dtype=torch.bfloat16) (TRL: --dtype bfloat16; transformers 4.x: torch_dtype)",),
                "load_dtype",
                notes=("the checkpoint's own dtype is not in config.json: bf16 is what most current checkpoints hold",),
            )
        )
    if spec.optimizer.name in _ADAM_FULL_STATE:
        eight_bit: tuple[tuple[OptimizerName, str], ...] = (
            ("adamw_bnb_8bit", "8-bit AdamW"),
            ("paged_adamw_8bit", "paged 8-bit AdamW"),
        )
        for name, words in eight_bit:
            out.append(
                Lever(
                    name,
                    f"bitsandbytes {words}",
                    Tier.OPTIMIZER_NUMERICS,
                    _optimizer(name),
                    ("--optim", name),
                    (f"TrainingArguments optim='{name}' (needs bitsandbytes)",),
                    "optimizer",
                )
            )
    return out


def _sharding_levers(spec: TrainingSpec) -> list[Lever]:
    """ZeRO stage up (several GPUs) and DeepSpeed CPU offload (any number of GPUs)."""
    out: list[Lever] = []
    sh = spec.sharding
    stage = spec.sharding.zero_stage or 0
    if spec.data_parallel_size > 1 and sh.strategy in (Strategy.DDP, Strategy.DEEPSPEED):
        for new in range(max(1, stage + 1), 4):
            words = f"DeepSpeed zero_optimization.stage={new} ({_DS_WORDS.format(stage=new)})"
            out.append(
                Lever(
                    f"zero{new}",
                    f"DeepSpeed ZeRO-{new}",
                    Tier.SAME_TRAINING,
                    _deepspeed(stage=new),
                    ("--zero_stage", str(new)),
                    (words,),
                    "sharding",
                )
            )
    if sh.strategy is Strategy.FSDP:
        return out
    ds = sh.deepspeed
    if ds is None or ds.offload_optimizer is OffloadDevice.NONE:
        st = max(stage, 2)
        words = (
            f"DeepSpeed zero_optimization.stage={st}, zero_optimization.offload_optimizer.device='cpu' "
            "(accelerate config: offload_optimizer_device: cpu)"
        )
        out.append(
            Lever(
                "offload_optimizer",
                f"ZeRO-{st} with optimizer offload to CPU",
                Tier.SAME_TRAINING,
                _deepspeed(stage=st, offload_optimizer=OffloadDevice.CPU),
                ("--zero_stage", str(st), "--offload_optimizer", "cpu"),
                (words,),
                "sharding",
            )
        )
    if ds is None or ds.offload_param is OffloadDevice.NONE:
        words = (
            "DeepSpeed zero_optimization.stage=3, offload_optimizer.device='cpu', offload_param.device='cpu' "
            "(accelerate config: offload_optimizer_device: cpu, offload_param_device: cpu)"
        )
        out.append(
            Lever(
                "offload_param",
                "ZeRO-3 with optimizer and parameter offload to CPU",
                Tier.SAME_TRAINING,
                _deepspeed(stage=3, offload_optimizer=OffloadDevice.CPU, offload_param=OffloadDevice.CPU),
                ("--zero_stage", "3", "--offload_optimizer", "cpu", "--offload_param", "cpu"),
                (words,),
                "sharding",
            )
        )
    return out


def _method_levers(spec: TrainingSpec) -> list[Lever]:
    """LoRA and QLoRA instead of full fine-tuning."""
    out: list[Lever] = []
    if spec.freeze is not None or spec.quant is not None:
        return out
    lora = spec.lora or _lora_spec(spec)
    lora_words = (
        f"peft LoraConfig(r={lora.r}, lora_alpha={lora.alpha:g}, lora_dropout={lora.dropout:g}, "
        "target_modules='all-linear') (TRL: --use_peft ...)"
    )
    if spec.lora is None:
        out.append(
            Lever(
                "lora",
                f"LoRA r={lora.r} on all linear layers instead of full fine-tuning",
                Tier.METHOD,
                _peft(lora, None),
                _lora_argv(lora),
                (lora_words,),
                "method",
                notes=("trains adapters, not the full model: results differ from full fine-tuning",),
            )
        )
    load = spec.precision.load_dtype
    # Under FSDP the 4-bit weights must be stored in a float dtype: FSDP1 refuses to flatten uint8 ("Cannot
    # flatten integer dtype tensors", torch 2.13 distributed/fsdp/_flat_param.py, and a flat parameter's tensors
    # must share one dtype: the load dtype); FSDP2 would leave uint8 weights unsharded (accelerate 1.15
    # fsdp2_prepare_model). The FSDP-QLoRA recipe (bitsandbytes 0.50.2 docs/source/fsdp_qlora.md) stores them
    # in the model's dtype.
    fsdp = spec.sharding.strategy is Strategy.FSDP and spec.data_parallel_size > 1
    storage = load if fsdp and (load.is_half or load is Dtype.FLOAT32) else Dtype.UINT8
    quant = QuantSpec(
        bits=4, quant_type="nf4", double_quant=True, compute_dtype=load, quant_storage=storage
    )
    argv = (
        *(() if spec.lora is not None else _lora_argv(lora)),
        "--load_in_4bit",
        "--bnb_4bit_quant_type",
        "nf4",
        "--use_bnb_nested_quant",
        *(("--bnb_4bit_quant_storage", storage.value) if fsdp else ()),
    )
    storage_word = f", bnb_4bit_quant_storage=torch.{storage.value}" if fsdp else ""
    words = [
        "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True"
        f"{storage_word})"
    ]
    if spec.lora is None:
        words.append(lora_words)
    out.append(
        Lever(
            "qlora",
            "QLoRA: 4-bit nf4 base + LoRA",
            Tier.METHOD,
            _peft(lora, quant),
            argv,
            tuple(words),
            "method",
            notes=(
                "4-bit dequantisation slows each step; not in the FLOPs model",
                "trains adapters on a quantized base: results differ from full fine-tuning",
            ),
        )
    )
    return out


def levers(spec: TrainingSpec, report: Report) -> list[Lever]:
    return [*_memory_levers(spec, report), *_sharding_levers(spec), *_method_levers(spec)]
