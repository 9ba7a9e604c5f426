"""Published GPU memory measurements as fitcheck inputs: each row becomes a :class:`Plan` or a :class:`Skip`.

A row of ``published_measurements.json`` describes its run in words (model, optimizer, LoRA targets, precision,
distribution, memory metric); :func:`plan_row` turns it into everything a :class:`fitcheck.spec.TrainingSpec`
needs but the parameter inventory (:func:`inventory_for`), or says why it cannot be expressed. A row whose own
numbers or source show it cannot be compared (its stated setting cannot have produced its figure, the shape of its
peak is not stated, its peak is set outside the training run) carries the reason as ``not_comparable`` in the data
file, with the source lines it rests on. The comparison itself is ``published.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    Dtype,
    FsdpSpec,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    ModelInventory,
    OptimizerSpec,
    PeftAdapterSpec,
    PrecisionSpec,
    QuantSpec,
    ShardingSpec,
    StackSpec,
    Strategy,
    TrainingSpec,
)

DEFAULT_DATA = Path(__file__).resolve().parent / "calibration" / "published_measurements.json"
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
_CATALOG = {
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
    "google-bert/bert-large-uncased": "google-bert/bert-large-uncased",
}

# torchtune / litgpt / Qwen-v1 module names -> transformers Llama/Qwen2 names.
_MLP = ("gate_proj", "up_proj", "down_proj")
_TARGET_WORDS = {
    "q_proj": ("q_proj",),
    "k_proj": ("k_proj",),
    "v_proj": ("v_proj",),
    "output_proj": ("o_proj",),
    "o_proj": ("o_proj",),
    "query": ("q_proj",),
    "value": ("v_proj",),
    "mlp": _MLP,
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


@dataclass(frozen=True)
class Plan:
    """A row expressed as fitcheck inputs (everything but the inventory) plus what to compare."""

    row_id: str
    group: str
    model: ModelRef
    build: Callable[[ModelInventory], TrainingSpec]
    metric: str  # "allocated" | "reserved" | "used" | "resident" | "reserved-p99"
    metric_sure: bool
    measured_bytes: int | None
    outcome: str
    notes: tuple[str, ...] = ()
    stack: str = "other"  # the row's "stack": "hf" (transformers' model code + peft/TRL/Trainer) or "other"
    stated_trainable: int | None = None  # the source's own trainable-parameter count, when it gives one


@dataclass(frozen=True)
class Skip:
    """A row that cannot be expressed, with the reason."""

    row_id: str
    group: str
    reason: str
    stack: str = "other"


def load_rows(path: Path = DEFAULT_DATA) -> list[dict[str, Any]]:
    """The published rows, as a list of dicts.

    A row with ``extra_metrics`` (a source that reports several figures for one run, e.g. peft's MetaMathQA
    results: the whole-run reserved maximum, the 99th percentile of the per-step reserved, the allocated bytes
    after the step) becomes one row per figure; the extra rows' ids are ``<id>@<suffix>``.
    """
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of rows")
    out: list[dict[str, Any]] = []
    for row in rows:
        out.append(row)
        for extra in row.get("extra_metrics") or ():
            out.append({**row, **{k: v for k, v in extra.items() if k != "suffix"},
                        "id": f"{row['id']}@{extra['suffix']}", "extra_metrics": None})
    return out


def _norm(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def _model_ref(row: Mapping[str, Any]) -> ModelRef | str:
    name = _norm(str(row["model"]))
    if name in _CATALOG:
        return ModelRef(catalog_id=_CATALOG[name], task=str(row.get("task") or "causal-lm"),
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


def _metric(row: Mapping[str, Any]) -> tuple[str, bool] | str:
    m = str(row["memory_metric"]).lower()
    if m.startswith("resident"):
        return ("resident", True)
    if m.startswith("reserved: 99th percentile"):
        return ("reserved-p99", True)
    if m.startswith("reserved (derived)"):
        return ("reserved", False)
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


def _optimizer(row: Mapping[str, Any]) -> str:
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


def _targets(lora: Mapping[str, Any]) -> tuple[str, ...] | str:
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
    for word, names in _TARGET_WORDS.items():
        if re.search(rf"(?<![a-z_]){re.escape(word)}(?![a-z_])", text):
            out.extend(n for n in names if n not in out)
    return tuple(out) if out else f"LoRA targets not understood: {raw!r}"


def _quant(row: Mapping[str, Any]) -> QuantSpec | str | None:
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
    return QuantSpec(
        bits=4,
        quant_type="nf4",
        double_quant=double,
        compute_dtype=Dtype.BFLOAT16,
        prepare_for_kbit_training=prep,
    )


def _gpu(row: Mapping[str, Any]) -> HardwareSpec:
    from fitcheck.catalog import lookup_gpu

    text = str(row["gpu"]).lower()
    if "96gb" in text:
        return HardwareSpec(gpu_name="H100-96GB", gpu_memory_bytes=96 * GIB)
    if "a6000" in text:
        return HardwareSpec(gpu_name="RTX-A6000-48GB", gpu_memory_bytes=48 * GIB)
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


def _sharding(row: Mapping[str, Any]) -> ShardingSpec | str:
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
    if n == 1:
        return ShardingSpec()
    if "fsdp" in dist:
        # torchtune recipes moved to FSDP2 in the second half of 2024; litgpt's Fabric FSDPStrategy is FSDP1.
        late_torchtune = str(row["source_group"]) in ("torchtune-README-2024-09", "torchtune-README-2024-11")
        version = 2 if "fsdp2" in dist or late_torchtune else 1
        # litgpt: FSDPStrategy(auto_wrap_policy={Block}) (finetune/lora.py and finetune/full.py at the rows'
        # commits) with Fabric's use_orig_params=True: the LoRA layers sit in the Block's flat parameter with the
        # frozen weights (fitcheck.core.states.fsdp_mixed_units).
        return ShardingSpec(
            strategy=Strategy.FSDP,
            num_processes=n,
            fsdp=FsdpSpec(version=version, offload_params="fsdp cpu offload" in off,
                          frozen_shares_units=version == 1 and "auto-wrap block" in dist),
        )
    return f"distributed setting not understood: {row['distributed']!r}"


def _checkpointing(row: Mapping[str, Any]) -> bool | str:
    gc = row.get("gradient_checkpointing")
    if gc is None:
        return "gradient checkpointing not stated"
    if isinstance(gc, bool):
        return gc
    if str(gc).lower().startswith("full"):
        return True
    return f"activation checkpointing {gc!r} is not modelled"


def _precision(row: Mapping[str, Any]) -> PrecisionSpec:
    p = str(row["precision"]).lower()
    if p.startswith("fp32"):  # fp32 weights, with or without the Trainer's fp16 autocast (native amp)
        return PrecisionSpec(Dtype.FLOAT32, MixedPrecision.FP16 if "fp16 autocast" in p else MixedPrecision.NO)
    if "fsdp2 mixed precision" in p:
        return PrecisionSpec(Dtype.FLOAT32, MixedPrecision.BF16)
    if "trainer bf16" in p:
        return PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16)
    return PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.NO)  # pure bf16 (torchtune, litgpt, PEFT harness)


def plan_row(row: Mapping[str, Any]) -> Plan | Skip:
    """Express one published row as fitcheck inputs, or say why it cannot be.

    Args:
        row: One entry of published_measurements.json.

    Returns:
        A :class:`Plan` (everything but the parameter inventory) or a :class:`Skip` with the reason.
    """
    rid, group, stack = str(row["id"]), str(row["source_group"]), str(row.get("stack") or "other")

    def skip(reason: str) -> Skip:
        return Skip(rid, group, reason, stack)

    if row.get("no_result"):
        return skip("no result file at the source's commit (the experiment is defined but was not run)")
    if row.get("not_comparable"):
        return skip(str(row["not_comparable"]))  # the row's own numbers or source show why (data file)
    if row.get("compile"):
        return skip("torch.compile is not modelled")

    notes: list[str] = []
    text = " ".join(str(row.get(k) or "") for k in ("location", "cpu_offload", "distributed")).lower()
    inferred = " ".join(str(x) for x in row.get("inferred") or ()).lower()
    if "activation offloading" in text:
        return skip("activation offloading to CPU is not modelled")
    if "compile flag: true" in inferred or "+ compile" in text:
        return skip("torch.compile is not modelled")
    if row.get("micro_batch_size") is None or row.get("seq_len") is None:
        return skip("micro-batch or sequence length not stated")
    method = str(row["method"]).lower()
    metric = _metric(row)
    if isinstance(metric, str):
        return skip(metric)
    measured = row.get("memory_gib")
    if row.get("outcome") == "fits" and measured is None:
        return skip(f"reported {row.get('memory_reported')!r} has an ambiguous unit (memory_gib is null)")
    optim = _optimizer(row)
    if optim.startswith("!"):
        return skip(optim[1:])
    ckpt = _checkpointing(row)
    if isinstance(ckpt, str):
        return skip(ckpt)
    sharding = _sharding(row)
    if isinstance(sharding, str):
        return skip(sharding)
    quant = _quant(row)
    if isinstance(quant, str):
        return skip(quant)
    model = _model_ref(row)
    if isinstance(model, str):
        return skip(model)
    lora: LoraSpec | None = None
    adapter: PeftAdapterSpec | None = None
    if row.get("peft_config"):
        read = _lora_by_fitcheck_reader(row["peft_config"])
        if isinstance(read, str):
            return skip(read)
        if isinstance(read, LoraSpec):
            lora = read
        else:  # another PEFT method: estimated from the real peft model on the default path only
            adapter = read
    elif row.get("lora"):
        lr = row["lora"]
        targets = _targets(lr)
        if isinstance(targets, str):
            return skip(targets)
        lora = LoraSpec(
            r=int(lr["rank"]),
            alpha=float(lr.get("alpha") or lr["rank"]),
            dropout=float(lr.get("dropout") or 0.0),
            target_modules=targets,
            use_dora="dora" in method or bool(lr.get("use_dora")),
        )
        if "c_attn" in str(lr.get("targets")):
            notes.append("c_attn LoRA as q/k/v")
        if "query" in str(lr.get("targets")).lower():
            notes.append("litgpt fused qkv LoRA as q/v")
    attn_text = str(row["attention_impl"]).lower()
    attn = (
        AttnImpl.EAGER
        if "eager" in attn_text
        else (AttnImpl.FLASH_ATTENTION_2 if "flash-attention" in attn_text else AttnImpl.SDPA)
    )
    chunked = "chunked" in inferred and "standard ce" not in inferred
    # "standard"/"chunked" are not LossKind values: since issue 18 the LOSSES table refuses them (before, they fell
    # through to Cut Cross-Entropy's bytes). Both are estimated as torch cross-entropy; torchtune's chunked CE
    # upcasts one chunk of logits at a time, so for those rows the estimate is an upper bound.
    acts = ActivationSpec(checkpointing=ckpt, attn_implementation=attn, loss="torch")
    if chunked:
        notes.append("chunked CE as torch CE (upper bound)")
    kind = str(row.get("seq_len_kind") or "").lower()
    if "unpacked" in kind or not any(w in kind for w in ("packed", "fixed", "forced")):
        notes.append("seq is a max")  # dynamic padding: the run's longest batch may be shorter
    if model.note:
        notes.append(model.note)
    if "lorafa" in str(row["optimizer"]).lower():
        notes.append("LoRA-FA freezes lora_A: fitcheck counts its gradients and moments")
    hardware = _gpu(row)
    batch = BatchSpec(
        micro_batch=int(row["micro_batch_size"]),
        seq_len=int(row["seq_len"]),
        grad_accum=int(row.get("grad_accum") or 1),
    )
    precision = _precision(row)
    # the library versions the run used, where the row gives them (``versions``: package -> version, with its source)
    versions = row.get("versions") or {}
    libs = StackSpec(tuple(sorted((str(k), str(v)) for k, v in versions.items())), "row") if versions else StackSpec()

    def build(inventory: ModelInventory) -> TrainingSpec:
        return TrainingSpec(
            model=inventory,
            precision=precision,
            optimizer=OptimizerSpec(name=optim),
            batch=batch,
            activations=acts,
            sharding=sharding,
            hardware=hardware,
            lora=lora,
            quant=quant,
            stack=libs,
            peft=adapter,
        )

    return Plan(
        rid,
        group,
        model,
        build,
        metric[0],
        metric[1],
        None if measured is None else int(float(measured) * GIB),
        str(row.get("outcome")),
        tuple(notes),
        stack,
        None if row.get("trainable_params") is None else int(row["trainable_params"]),
    )


def _lora_by_fitcheck_reader(peft_config: Mapping[str, Any]) -> LoraSpec | PeftAdapterSpec | str:
    """The row's ``adapter_config.json`` read by fitcheck's own reader, as ``fitcheck estimate --adapter_config``
    reads it; the reader's refusal (a PEFT method not modelled) is the skip reason."""
    import tempfile

    from fitcheck.errors import FitcheckError
    from fitcheck.readers import read_adapter_config

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adapter_config.json"
        path.write_text(json.dumps(peft_config))
        try:
            read = read_adapter_config(str(path))
            if isinstance(read, PeftAdapterSpec):  # the temporary file's name would outlive it in messages
                read = PeftAdapterSpec(read.peft_type, read.config_json, "adapter_config.json")
            return read
        except FitcheckError as exc:
            return "fitcheck's PEFT reader refuses it: " + str(exc).replace(str(path), "adapter_config.json")


def inventory_for(ref: ModelRef) -> ModelInventory:
    """The row's parameter inventory: from the built-in catalog, or from the config built from its ``arch``."""
    from fitcheck.readers import classifier_inventory, inventory_from_config, load_inventory
    from fitcheck.torch_adapters import meta_inventory

    if ref.catalog_id is not None:
        inv = load_inventory(ref.catalog_id, env={}, meta_fallback=meta_inventory)
        return inv if ref.task == "causal-lm" else classifier_inventory(inv, ref.task, ref.num_labels)
    assert ref.config is not None
    return inventory_from_config(ref.config, "published-row", "row arch (calibration data)")
