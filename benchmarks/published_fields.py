"""What each field of a published row means as a fitcheck input: the model (:func:`read_model_ref`, the built-in
catalog names :data:`CATALOG`), the memory metric, the optimizer, the LoRA targets (other frameworks' module names,
:data:`TARGET_WORDS`), the quantization, the GPU, the distribution, activation checkpointing and the precision.
Each reader returns the value, or a string saying why the row cannot be expressed. :func:`published_rows.plan_row`
puts them together; split out of ``published_rows.py`` unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fitcheck.spec import (
    Dtype,
    FsdpSpec,
    HardwareSpec,
    MixedPrecision,
    PrecisionSpec,
    QuantSpec,
    ShardingSpec,
    Strategy,
)

GIB = 1024**3
HF_GROUPS = (
    "ms-swift-benchmark",
    "peft-MetaMathQA-benchmark",
    "transformers-docs-perf-train-gpu-one-2022",
    "peft-docs-accelerate-guides",
    "accelerate-fsdp2-benchmark",
    "llamafactory-wiki-via-unsloth",
)

# Row "model" (lower-cased, spaces/underscores to "-") -> built-in catalog id.
CATALOG = {
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "meta-llama/llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-7b-hf": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama2-70b": "meta-llama/Llama-2-70b-hf",
    "meta-llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "meta-llama-3-8b-instruct": "meta-llama/Meta-Llama-3-8B",
    "mistral-7b-v0.1": "mistralai/Mistral-7B-v0.1",
    "mixtral-8x7b-instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",  # the base model's geometry (same config.json)
    "llama-2-70b-hf": "meta-llama/Llama-2-70b-hf",
    "google-bert/bert-large-uncased": "google-bert/bert-large-uncased",
    "bigscience/bloomz-7b1": "bigscience/bloomz-7b1",
    "gpt2-xl": "openai-community/gpt2-xl",
}

# torchtune / litgpt / Qwen-v1 module names -> transformers Llama/Qwen2 names.
MLP = ("gate_proj", "up_proj", "down_proj")
TARGET_WORDS = {
    "q_proj": ("q_proj",),
    "k_proj": ("k_proj",),
    "v_proj": ("v_proj",),
    "output_proj": ("o_proj",),
    "o_proj": ("o_proj",),
    "query": ("q_proj",),
    "value": ("v_proj",),
    "mlp": MLP,
    "up_proj": ("up_proj",),
    "gate_proj": ("gate_proj",),
    "down_proj": ("down_proj",),
    "final output": ("lm_head",),
    "c_attn": ("q_proj", "k_proj", "v_proj"),
}


@dataclass(frozen=True)
class ModelRef:
    """How to get the row's parameter inventory: a catalog id, or a config.json built from the row's arch."""

    catalog_id: str | None = None
    config: Mapping[str, object] | None = None
    note: str = ""
    task: str = "causal-lm"  # the row's "task" (e.g. "seq-cls": the catalog model with its classifier head)
    num_labels: int = 2



def norm_name(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def read_model_ref(row: Mapping[str, Any]) -> ModelRef | str:
    name = norm_name(str(row["model"]))
    if name in CATALOG:
        return ModelRef(catalog_id=CATALOG[name], task=str(row.get("task") or "causal-lm"),
                        num_labels=int(row.get("num_labels") or 2))
    arch = row.get("arch") or {}
    if name.startswith("qwen-") and "-int4" not in name and arch.get("hidden"):
        # Qwen (v1) is remote code (QWenLMHeadModel); same parameter geometry as a Qwen2 config: RMSNorm,
        # biased fused qkv (= q/k/v with bias), SwiGLU whose config "intermediate_size" counts both halves
        # (22016 = 2 x 11008, row arch_source), untied embeddings.
        cfg = {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "hidden_size": arch["hidden"],
            "num_hidden_layers": arch["layers"],
            "num_attention_heads": arch["heads"],
            "num_key_value_heads": arch.get("kv_heads", arch["heads"]),
            "intermediate_size": arch["intermediate"] // 2,
            "vocab_size": arch["vocab"],
            "tie_word_embeddings": False,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "torch_dtype": "bfloat16",
        }
        return ModelRef(config=cfg, note="Qwen-v1 as Qwen2 geometry")
    if not arch.get("hidden"):
        return f"model {row['model']!r} is not in the catalog and the row gives no architecture"
    return f"model {row['model']!r} ({arch.get('params_B')}B) is not in the catalog"


def read_metric(row: Mapping[str, Any]) -> tuple[str, bool] | str:
    m = str(row["memory_metric"]).lower()
    if m.startswith("resident"):
        return ("resident", True)
    if m.startswith("reserved: 99th percentile"):
        return ("reserved-p99", True)
    if m.startswith("reserved (derived)"):
        return ("reserved", False)
    if m.startswith("presumed nvidia-smi"):  # a per-GPU monitor figure whose tool the source does not name
        return ("used", False)
    if "not stated" in m and "tool" in m:
        return "measurement tool not stated"
    if "active vs reserved not stated" in m or "alloc vs reserved not stated" in m:
        return ("reserved", False)
    if "reserved" in m:
        return ("reserved", True)
    if "allocated" in m or "active" in m:
        return ("allocated", True)
    if "nvidia-smi" in m or "used" in m:
        return ("used", True)
    return f"memory metric not understood: {row['memory_metric']!r}"


def read_optimizer(row: Mapping[str, Any]) -> str:
    # "(inferred: ...)" says how the optimizer was inferred, not which it is (TT32-0: "torch AdamW (inferred: 8-bit
    # AdamW only added later in table)" is torch AdamW)
    o = re.sub(r"\(inferred[^)]*\)", "", str(row["optimizer"]).lower())
    if "optimizer_in_bwd" in o or "optimizer in bwd" in o:
        return "!optimizer fused into backward (optimizer_in_bwd) is not modelled"
    if "unknown" in o or (o.startswith("not stated") and "default" not in o) or "not stated which" in o:
        return "!optimizer not stated"
    if "adafactor" in o:
        return "adafactor"
    if "stepped on cpu" in o:
        return "adamw_torch_fused"
    if "torchao 8-bit" in o:
        return "adamw_torch_8bit"
    if "torchao 4-bit" in o:
        return "adamw_torch_4bit"
    if "pagedadamw8bit" in o:
        return "paged_adamw_8bit"
    if "pagedadamw" in o:
        return "paged_adamw_32bit"
    if "8-bit adamw" in o:
        return "adamw_bnb_8bit"
    if "transformers.adamw" in o or "adamw_hf" in o:  # transformers' own AdamW (a per-parameter loop), not torch's
        return "adamw_hf"
    if "fused" in o:
        return "adamw_torch_fused"
    if "adamw" in o:
        return "adamw_torch"
    return f"!optimizer not understood: {row['optimizer']!r}"


def read_targets(lora: Mapping[str, Any]) -> tuple[str, ...] | str:
    raw = lora.get("targets")
    if raw is None:
        return "LoRA targets not stated"
    if isinstance(raw, list):
        return tuple(str(t) for t in raw)
    text = str(raw).lower().replace("not stated (llama-factory default then:", "")
    if "all linear" in text or text.startswith("all"):
        return ("all-linear",)
    if "(" in text and "lora_query" not in text and "c_attn" not in text:
        text = re.sub(r"\([^)]*\)", "", text)  # "MLP (w1,w2,w3)"
    text = re.sub(r"\(lora_query[^)]*\)", "", text)
    out: list[str] = []
    for word, names in TARGET_WORDS.items():
        if re.search(rf"(?<![a-z_]){re.escape(word)}(?![a-z_])", text):
            out.extend(n for n in names if n not in out)
    return tuple(out) if out else f"LoRA targets not understood: {raw!r}"


def read_quant(row: Mapping[str, Any]) -> QuantSpec | str | None:
    q = row.get("quantization")
    if q is None:
        return None
    text = str(q).lower()
    if "gptq" in text:
        return "GPTQ pre-quantized base is not modelled"
    torchtune = "torchao" in text or "nf4tensor" in text or text.startswith("nf4")
    # torchao NF4Tensor: 64-element blocks, block scales quantized again per 256 (double quantization).
    # "bnb NF4 (no double quant)" (litgpt qlora.yaml ``quantize: bnb.nf4``, not ``bnb.nf4-dq``) names double
    # quantization only to exclude it
    double = ("double" in text and "no double" not in text) or torchtune
    # TRL/PEFT pipelines run prepare_model_for_kbit_training; a row whose source shows it does not says so
    # (``kbit_prep`` false, with ``kbit_prep_source``: ms-swift at cfcb672 never calls it)
    prep = bool(row["kbit_prep"]) if "kbit_prep" in row else row["source_group"] in HF_GROUPS
    # FSDP-QLoRA stores the 4-bit blocks in bf16 (transformers' bnb_4bit_quant_storage), as the row says
    storage = Dtype.BFLOAT16 if "quant_storage bf16" in text else Dtype.UINT8
    return QuantSpec(
        bits=4,
        quant_type="nf4",
        double_quant=double,
        compute_dtype=Dtype.BFLOAT16,
        prepare_for_kbit_training=prep,
        quant_storage=storage,
    )


def read_gpu(row: Mapping[str, Any]) -> HardwareSpec:
    from fitcheck.catalog import lookup_gpu

    text = str(row["gpu"]).lower()
    if "96gb" in text:
        return HardwareSpec(gpu_name="H100-96GB", gpu_memory_bytes=96 * GIB)
    if "a6000" in text:
        return HardwareSpec(gpu_name="RTX-A6000-48GB", gpu_memory_bytes=48 * GIB)
    if "titan rtx" in text:  # NVIDIA TITAN RTX: 24 GB GDDR6 (24576 MiB)
        return HardwareSpec(gpu_name="TITAN-RTX-24GB", gpu_memory_bytes=24 * GIB)
    keys = (
        ("40gb", "A100-40GB"),
        ("4090", "RTX4090-24GB"),
        ("a10g", "A10G-24GB"),
        ("l40s", "L40S-48GB"),
        ("h200", "H200-141GB"),
        ("h100", "H100-80GB"),
        ("v100-sxm2-16gb", "V100-16GB"),
    )
    # default: "A100 (80GB ...)", "A100", "not stated (A100-class presumed)"
    name = next((n for k, n in keys if k in text), "A100-80GB")
    info = lookup_gpu(name)
    return HardwareSpec(
        gpu_name=info.name, gpu_memory_bytes=info.memory_bytes, peak_tflops_bf16=info.peak_tflops_bf16
    )


def read_sharding(row: Mapping[str, Any]) -> ShardingSpec | str:
    from published_deepspeed import is_deepspeed_row, read_deepspeed_sharding

    n = int(row["num_gpus"] or 1)
    dist = str(row["distributed"]).lower()
    off = str(row["cpu_offload"]).lower()
    for pattern, why in (
        (r"\btp\b", "tensor parallel"),
        (r"\bcp\b", "context parallel"),
        (r"model parallel", "device_map model parallel"),
        (r"compile", "torch.compile"),
        (r"float8", "float8 linears"),
    ):
        if re.search(pattern, dist):
            return f"{why} is not modelled"
    if is_deepspeed_row(row):  # one GPU too (ZeRO-Offload); checked here, read again with the model's hidden_size
        return read_deepspeed_sharding(row)
    if n == 1:
        return ShardingSpec()
    if "fsdp" in dist:
        # torchtune recipes moved to FSDP2 in the second half of 2024; litgpt's Fabric FSDPStrategy is FSDP1.
        late_torchtune = str(row["source_group"]) in ("torchtune-README-2024-09", "torchtune-README-2024-11")
        version = 2 if "fsdp2" in dist or late_torchtune else 1
        # litgpt: FSDPStrategy(auto_wrap_policy={Block}) (finetune/lora.py and finetune/full.py at the rows'
        # commits) with Fabric's use_orig_params=True: the LoRA layers sit in the Block's flat parameter with the
        # frozen weights (fitcheck.core.states.fsdp_mixed_units).
        # FSDP1 wrapped by the framework itself (torchtune's early recipes, Lightning's FSDPStrategy) passes no
        # backward_prefetch: torch 2.13 FullyShardedDataParallel's default BACKWARD_PRE; the Hugging Face stack's
        # runs go through accelerate (its default, and the Trainer's: NO_PREFETCH; accelerate 1.0.1 never reads the
        # fms runs' fsdp_backward_prefetch_policy key)
        prefetch = "BACKWARD_PRE" if version == 1 and str(row.get("stack") or "other") != "hf" else "NO_PREFETCH"
        return ShardingSpec(
            strategy=Strategy.FSDP,
            num_processes=n,
            fsdp=FsdpSpec(version=version, offload_params="fsdp cpu offload" in off,
                          frozen_shares_units=version == 1 and "auto-wrap block" in dist, backward_prefetch=prefetch),
        )
    if dist.startswith("ddp"):
        return ShardingSpec(strategy=Strategy.DDP, num_processes=n)
    return f"distributed setting not understood: {row['distributed']!r}"


def read_checkpointing(row: Mapping[str, Any]) -> bool | str:
    gc = row.get("gradient_checkpointing")
    if gc is None:
        return "gradient checkpointing not stated"
    if isinstance(gc, bool):
        return gc
    if str(gc).lower().startswith("full"):
        return True
    return f"activation checkpointing {gc!r} is not modelled"


def read_precision(row: Mapping[str, Any]) -> PrecisionSpec:
    p = str(row["precision"]).lower()
    # DeepSpeed's bf16/fp16 (TrainingArguments bf16/fp16 or accelerate mixed_precision, filling the DeepSpeed
    # config): the loaded dtype with the engine's 16-bit mode, as the CLI reads it (fitcheck core module_cast.py)
    for word, mixed in (("deepspeed bf16", MixedPrecision.BF16), ("deepspeed fp16", MixedPrecision.FP16)):
        if word in p:
            return PrecisionSpec(Dtype.FLOAT32 if p.startswith("fp32") else Dtype.BFLOAT16, mixed)
    if p.startswith("fp32"):  # fp32 weights, with or without the Trainer's fp16 autocast (native amp)
        return PrecisionSpec(Dtype.FLOAT32, MixedPrecision.FP16 if "fp16 autocast" in p else MixedPrecision.NO)
    if "fsdp2 mixed precision" in p:
        return PrecisionSpec(Dtype.FLOAT32, MixedPrecision.BF16)
    if "trainer bf16" in p:
        return PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16)
    return PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.NO)  # pure bf16 (torchtune, litgpt, PEFT harness)
