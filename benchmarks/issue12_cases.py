"""Issue 12's done-means cases: each estimate with its components, next to a trace or a published figure.

* RoBERTa-base sequence classifier (3 labels): estimate vs a fake-tensor trace of
  ``RobertaForSequenceClassification`` (``--trace``), CPU live bytes, and what the old vocab-sized head cost.
* Qwen2.5-VL-7B LoRA all-linear: trainable parameters vs peft on ``AutoModelForImageTextToText`` (meta).
* Qwen2.5-7B GPTQ-Int4 / AWQ LoRA: quantized bytes (checkpoint layouts); ms-swift's published qwen-7b-chat-int4
  GPTQ QLoRA (SWIFT-2, 19.21 GiB max reserved, remote-code Qwen-v1 on an older stack) next to the same shape
  written as a Qwen2 config (fused c_attn approximated by q/k/v adapters).
* gpt-oss-20b LoRA: MXFP4 at-rest bytes vs the published checkpoint size; the step with dequantized experts.
* Llama-3-70B QLoRA on 2 x 24 GB with ``device_map="auto"``: per-GPU weights and peaks.

Run: ``PYTHONPATH=. python benchmarks/issue12_cases.py`` (~2 min on 2 CPU cores; meta devices only).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

from fitcheck.cli import cli_main as cli

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/catalog")
GIB = 2**30


def run(*args: str) -> dict[str, Any]:
    """``fitcheck estimate ... --json`` in-process."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        cli(["estimate", *args, "--json"])
    out: dict[str, Any] = json.loads(buf.getvalue())
    return out


def top(out: dict[str, Any], n: int = 5) -> str:
    comps = sorted(out["components"].items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v / GIB:.2f}" for k, v in comps)


def roberta() -> list[str]:
    model = str(ROOT / "tests/fixtures/task/roberta-base-seqcls")
    base = ["--model_name_or_path", model, "--dtype", "float32", "--per_device_train_batch_size", "16",
            "--max_seq_length", "256", "--optim", "adamw_torch", "--device_type", "cpu"]
    est, traced = run(*base), run(*base, "--trace")
    err = (est["peak_allocated_bytes"] - traced["peak_allocated_bytes"]) / traced["peak_allocated_bytes"]
    return [f"RoBERTa-base seq-cls (3 labels) full FT fp32, 16x256, CPU | {top(est)} | "
            f"peak {est['peak_allocated_bytes'] / GIB:.3f} GiB vs trace {traced['peak_allocated_bytes'] / GIB:.3f}"
            f" ({err:+.2%}); total params {est['total_params']:,}"]


def qwen_vl() -> list[str]:
    from peft import LoraConfig, get_peft_model

    from fitcheck.torch_adapters import build_meta_model

    cfg = SHARED / "Qwen/Qwen2.5-VL-7B-Instruct/config.json"
    out = run("--model_name_or_path", str(cfg), "--use_peft", "--lora_target_modules", "all-linear",
              "--gradient_checkpointing", "--per_device_train_batch_size", "1", "--max_seq_length", "2048",
              "--image_tokens", "4096", "--gpu", "A100-80GB")
    model = build_meta_model(json.loads(cfg.read_text()), "image-text-to-text")
    pm = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
    vision = sum(p.numel() for n, p in pm.named_parameters() if p.requires_grad and "visual" in n)
    return [f"Qwen2.5-VL-7B LoRA all-linear r16, 1x2048 + 4096 patches, GC | {top(out)} | "
            f"peak {out['peak_allocated_bytes'] / GIB:.2f} GiB; trainable {out['trainable_params']:,} vs peft "
            f"{trainable:,} (vision+merger {vision:,})"]


def prequant() -> list[str]:
    rows = []
    for name in ("qwen2.5-7b-gptq-int4", "qwen2.5-7b-awq"):
        out = run("--model_name_or_path", str(ROOT / "tests/fixtures/prequant" / name), "--use_peft",
                  "--lora_target_modules", "all-linear", "--gradient_checkpointing",
                  "--per_device_train_batch_size", "1", "--max_seq_length", "2048", "--gpu", "RTX4090-24GB")
        c = out["components"]
        at_rest = c["weights.quantized"] + c["quantization.metadata"] + c["weights.frozen"]
        label = "GPTQ-Int4" if "gptq" in name else "AWQ"
        rows.append(f"Qwen2.5-7B {label} LoRA all-linear, 1x2048, GC | {top(out)} | peak "
                    f"{out['peak_allocated_bytes'] / GIB:.2f} GiB; weights at rest {at_rest / GIB:.2f} GiB")
    # SWIFT-2: qwen-7b-chat-int4 (GPTQ, auto_gptq 0.5.1), LoRA r8 on c_attn, bs1 x 2048, GC, flash-attn 2, bf16
    qwen_v1 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 4096,
               "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
               "num_hidden_layers": 32, "vocab_size": 151936, "tie_word_embeddings": False,
               "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
               "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}}
    tmp = Path("/tmp/fitcheck-swift2")
    tmp.mkdir(exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(qwen_v1))
    out = run("--model_name_or_path", str(tmp), "--use_peft", "--lora_r", "8", "--lora_alpha", "32",
              "--lora_dropout", "0.05", "--lora_target_modules", "q_proj", "k_proj", "v_proj",
              "--gradient_checkpointing", "--per_device_train_batch_size", "1", "--max_seq_length", "2048",
              "--bf16", "--attn_implementation", "flash_attention_2", "--optim", "adamw_torch", "--gpu", "A100-80GB")
    err = (out["peak_reserved_bytes"] / GIB - 19.21) / 19.21
    rows.append(f"SWIFT-2 shape (Qwen-7B GPTQ-Int4 LoRA r8 qkv, 1x2048) | {top(out)} | reserved "
                f"{out['peak_reserved_bytes'] / GIB:.2f} GiB vs published 19.21 GiB ({err:+.1%})")
    return rows


def gpt_oss() -> list[str]:
    from fitcheck.core.states import mxfp4_packed_bytes
    from fitcheck.spec import Kind
    from fitcheck.torch_adapters import meta_inventory

    cfg = SHARED / "openai/gpt-oss-20b/config.json"
    inv = meta_inventory(json.loads(cfg.read_text()), "openai/gpt-oss-20b", "catalog")
    packed = sum(sum(mxfp4_packed_bytes(p.numel_each)) * p.repeat for p in inv.params if p.kind is Kind.FUSED_EXPERTS)
    rest = 2 * sum(p.numel for p in inv.params if p.kind is not Kind.FUSED_EXPERTS)
    out = run("--model_name_or_path", str(cfg), "--dtype", "bfloat16", "--bf16", "--use_peft",
              "--lora_target_modules", "all-linear", "--gradient_checkpointing", "--per_device_train_batch_size",
              "1", "--max_seq_length", "2048", "--gpu", "H100-80GB")
    return [f"gpt-oss-20b LoRA all-linear (MXFP4 checkpoint, trained dequantized bf16), 1x2048, GC | {top(out)} | "
            f"peak {out['peak_allocated_bytes'] / GIB:.2f} GiB; MXFP4 at rest {packed + rest:,} B vs published "
            f"index total_size 13,761,264,768 B"]


def llama70b() -> list[str]:
    rows = []
    # the plain Trainer with peft's prepare_model_for_kbit_training (fp32 norms/embeddings/head, fp32 adapters) vs
    # TRL 1.16 SFTTrainer defaults (no k-bit preparation, bf16 adapters); 22 GiB reserved per card, or the whole
    # 24 GB card (22.35 GiB)
    for label, extra in (("Trainer + kbit prep", ()), ("TRL SFT defaults", ("--trainer", "sft"))):
        for budget in ("22GiB", "24GB"):
            out = run("--model_name_or_path", "meta-llama/Meta-Llama-3-70B", "--load_in_4bit", "--bnb_4bit_quant_type",
                      "nf4", "--bnb_4bit_compute_dtype", "bfloat16", "--use_bnb_nested_quant", "--dtype", "bfloat16",
                      "--bf16", "--use_peft", "--lora_target_modules", "all-linear", "--lora_r", "16",
                      "--gradient_checkpointing", "--per_device_train_batch_size", "1", "--max_seq_length", "512",
                      "--gpu", "RTX4090-24GB", "--device_map", "auto",
                      "--max_memory", f"0={budget},1={budget},cpu=200GiB", *extra)
            for g in out["device_map_gpus"]:
                rows.append(f"Llama-3-70B QLoRA 2x24GB auto, 1x512, {label}, max_memory {budget} | GPU {g['device']} "
                            f"layers {g['layers']}{' + head' if g['holds_head'] else ''} | weights "
                            f"{g['weights_bytes'] / GIB:.2f} GiB, peak {g['peak_allocated_bytes'] / GIB:.2f} GiB, used "
                            f"{g['device_used_bytes'] / GIB:.2f} of {g['budget_bytes'] / GIB:.2f} GiB "
                            f"({g['peak_phase']}), fits={g['fits']}")
            rows.append(f"  headline (busiest GPU): {top(out)}; verdict fits={out['fits']}")
    return rows


def main() -> int:
    print("case | largest components (GiB) | check")
    for part in (roberta, qwen_vl, prequant, gpt_oss, llama70b):
        for line in part():
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
