"""The peft MetaMathQA rows of ``published_measurements.json``, rebuilt from a git checkout of huggingface/peft.

One row per ``method_comparison/MetaMathQA/results/*.json`` (the whole-run reserved maximum, with the per-step
99th percentile and the post-step allocated bytes as ``extra_metrics``) and one per experiment without a result.
Prints the rows as JSON; the calibration file holds them between the other sources' rows.

Run: ``python benchmarks/calibration/import_peft_mmqa.py PEFT_GIT_DIR [COMMIT] > rows.json``.
"""

import json
import subprocess
import sys

REPO = sys.argv[1]
COMMIT = subprocess.check_output(
    ["git", "-C", REPO, "rev-parse", sys.argv[2] if len(sys.argv) > 2 else "HEAD"], text=True
).strip()
BASE = "method_comparison/MetaMathQA"
GIB = 1024**3

def show(path):
    return subprocess.check_output(["git", "-C", REPO, "show", f"{COMMIT}:{path}"], text=True)

files = [f for f in subprocess.check_output(["git", "-C", REPO, "ls-tree", "--name-only", COMMIT, f"{BASE}/results/"],
                                             text=True).split() if f.endswith(".json")]
exps = sorted({"/".join(f.split("/")[3:5]) for f in subprocess.check_output(
    ["git", "-C", REPO, "ls-tree", "-r", "--name-only", COMMIT, f"{BASE}/experiments/"], text=True).split()})
ARCH = {"params_B": 3.2127, "hidden": 3072, "layers": 28, "heads": 24, "kv_heads": 8, "vocab": 128256,
        "intermediate": 8192, "tied_embeddings": True,
        "arch_source": "meta-llama/Llama-3.2-3B config.json (fitcheck catalog); total params 3,212,749,824 stated by "
                       "the full-FT result json (train_info.num_total_params)"}
NOTE_MAX = ("Compared with fitcheck's peak_reserved at 4 x 768. The harness pads each batch to its longest sample "
            "(tokenizer.pad) and data.py keeps only samples of <= 1300 characters (+ ~37 of template), which reach 768 "
            "tokens only below 1.75 characters per token: the run's longest batch is probably well below 768 tokens "
            "(the source does not state it; mean 210 tokens per sample), so the estimate at 768 overstates the "
            "step's activations. fitcheck at 4 x 512 gives 16.18 GiB (LoRA r32 q,v) and 31.26 GiB "
            "(full FT), 10-22 % below the measured figures, so the agreement at 768 is not evidence that the step is "
            "right. The same `outputs` (see the @states row) keep the previous batch's logits and K/V cache alive "
            "through the next step's forward and loss, 4 x L x 371200 B (1.06 GiB at L = 768), which fitcheck does "
            "not model (the Trainer drops them). The maximum also covers from_pretrained (modelled) and the "
            "generation evals at batch 50 "
            "(run.py evaluate: a KV cache of up to 50 x 800 tokens x 112 KiB = 4.3 GiB next to the training pool's "
            "cached blocks; not modelled for this custom loop).")
NOTE_P99 = ("Not a peak: the 99th percentile of 5000 post-step samples drops the 50 highest, and with "
            "empty_cache every 10 steps those are the ~5 cache windows with the longest batches. It is a lower bound "
            "of the training steps' peak reserved; the row without @p99 is the run's maximum. The estimate is for a "
            "4 x 768 batch, so this figure sits 12-18 % below it for every LoRA row (full FT: its optimizer step, "
            "which does not depend on length, is most of the peak).")
NOTE_STATES = ("run.py keeps the loop's `outputs` referenced until the next forward returns: its bf16 logits "
               "(4 x L x 128256 x 2 B) and, since Llama-3.2-3B's config has use_cache=true and the run has no "
               "gradient checkpointing, a DynamicCache whose K/V copies (transformers 5.x DynamicLayer.update: "
               "torch.cat) cover all 28 layers (4 x L x 114688 B): 4 x L x 371200 B. fitcheck's model states do "
               "not include them. measured - estimate is 0.32-0.33 GiB for every run whose trainable count "
               "fitcheck reproduces (full FT and LoRA alike), i.e. a mean padded length of ~235 tokens against "
               "210 real tokens per sample: the states themselves agree.")
NOTE_READER = ("The LoRA-FA optimizer (peft optimizers/lorafa.py) sets lora_A.requires_grad=False; fitcheck, given "
               "this adapter config and AdamW, counts lora_A's fp32 gradients and AdamW moments: 5,505,024 "
               "parameters x 12 B = 66 MB too many.")
rows = []
seen = set()
for f in sorted(files):
    d = json.loads(show(f))
    ri, ti = d["run_info"], d["train_info"]
    tc, pc = ri["train_config"], ri["peft_config"]
    name = ri["experiment_name"]
    seen.add(name)
    stem = f.split("/")[-1][:-5].replace("--llama-3.2-3B", "")
    allocs = [m["mem allocated avg"] for m in ti["metrics"] if "mem allocated avg" in m]
    pk = d["meta_info"]["package_info"]
    opt = tc["optimizer_type"]
    if opt == "AdamW":
        optimizer = f"torch.optim.AdamW (default foreach), kwargs {tc['optimizer_kwargs']}"
    elif opt == "lora-fa":
        optimizer = (f"peft create_lorafa_optimizer (peft/optimizers/lorafa.py: AdamW moments for lora_B only, "
                     f"lora_A set requires_grad=False), kwargs {tc['optimizer_kwargs']}")
    else:
        optimizer = f"unknown optimizer_type {opt!r}"
    if pc is None:
        method = "full FT"
    elif pc.get("peft_type") == "LORA":
        method = "DoRA" if pc.get("use_dora") else "LoRA"
        for key, label in (("init_lora_weights", "init"), ("use_bdlora", "BD-LoRA"), ("use_rslora", "rsLoRA")):
            v = pc.get(key)
            if v not in (None, False, True):
                method += f" ({label} {v if key != 'use_bdlora' else 'nblocks=' + str(v.get('nblocks'))})"
            elif v is True and key == "use_rslora":
                method += " (rsLoRA)"
        if opt == "lora-fa":
            method += " + LoRA-FA optimizer"
    else:
        method = str(pc.get("peft_type"))
    amp = "autocast (use_amp=True)" if tc["use_amp"] else "no autocast (use_amp=False)"
    upcast = tc["autocast_adapter_dtype"]
    adapt = ("adapter weights upcast to fp32 (get_peft_model autocast_adapter_dtype=True)" if upcast
             else "adapter weights in the base dtype (autocast_adapter_dtype=False)")
    harness = f"{BASE}/run.py, utils.py, data.py"
    mean_tokens = sum(m.get("train total tokens", 0) for m in ti["metrics"]) / (tc["max_steps"] * tc["batch_size"])
    unmodelled_variant = opt == "lora-fa"
    row = {
        "id": f"MMQA-{stem}",
        "source_group": "peft-MetaMathQA-benchmark",
        "stack": "hf",
        "stack_why": "custom torch loop over transformers' LlamaForCausalLM + peft (no Trainer)",
        "source": f"huggingface/peft {f} @{COMMIT} (harness: {harness} at the same commit)",
        "location": "train_info.accelerator_memory_max",
        "model": tc["model_id"],
        "arch": ARCH,
        "method": method,
        "peft_config": pc,
        "precision": f"{tc['dtype']} weights (from_pretrained dtype={tc['dtype']}), pure: {amp}; {adapt}",
        "quantization": None if tc["dtype"] in ("bfloat16", "float16", "float32") else tc["dtype"],
        "optimizer": optimizer,
        "micro_batch_size": tc["batch_size"],
        "grad_accum": 1,
        "seq_len": tc["max_seq_length"],
        "seq_len_kind": ("MetaMathQA samples filtered to <= 1300 characters (data.py CHAR_LIMIT) and truncated to "
                         f"max_seq_length {tc['max_seq_length']} tokens; BucketIterator batches sorted by length "
                         "within "
                         "buckets of 20 batches, padded to the longest in the batch (tokenizer.pad): the longest batch "
                         "is not stated"),
        "gradient_checkpointing": bool(tc["use_gc"]),
        "attention_impl": f"transformers default (attn_implementation={tc['attn_implementation']}: sdpa)",
        "compile": tc["compile"],
        "lora": None,
        "num_gpus": 1,
        "distributed": "none",
        "cpu_offload": False,
        "gpu": d["meta_info"]["system_info"]["accelerator"],
        "memory_reported": (f"accelerator_memory_max={ti['accelerator_memory_max']} B; "
                            f"accelerator_memory_reserved_99th={ti['accelerator_memory_reserved_99th']} B; "
                            f"accelerator_memory_reserved_avg={ti['accelerator_memory_reserved_avg']} B; "
                            f"'mem allocated avg' per 250-step window {min(allocs):.0f}..{max(allocs):.0f} B"),
        "memory_gib": round(ti["accelerator_memory_max"] / GIB, 4),
        "memory_metric": ("max_memory_reserved over the whole run (load, wiki-loss forward at batch 4, 5000 steps, "
                          "generation eval every 250 steps at batch 50, test eval, save) minus the reserved at init "
                          "(utils.py init_accelerator / log_results)"),
        "extra_metrics": [
            {"suffix": "p99", "location": "train_info.accelerator_memory_reserved_99th",
             "memory_gib": round(ti["accelerator_memory_reserved_99th"] / GIB, 4),
             "memory_metric": ("reserved: 99th percentile of memory_reserved() - init, sampled right after each "
                               "optimizer step (run.py; torch.cuda.empty_cache() every 10 steps, after the sample): "
                               "the "
                               "training steps only"),
             "notes": NOTE_P99},
            {"suffix": "states",
             "location": "train_info.metrics[*]['mem allocated avg'] (largest 250-step window mean)",
             "memory_gib": round(max(allocs) / GIB, 4),
             "memory_metric": ("resident: memory_allocated() - init right after the optimizer step, mean of 250 "
                               "steps (run.py): weights, gradients (zero_grad runs at the next step), optimizer "
                               "states, and the loop's last `outputs` (its logits) still referenced"),
             "notes": NOTE_STATES},
        ],
        "outcome": "fits" if ti["status"] == "success" else ti["status"],
        "stated": ["full train_config", "peft_config", "GPU", "torch/transformers/peft versions", "memory bytes",
                   "trainable and total parameter counts"],
        "inferred": [],
        "confidence": "high",
        "trainable_params": ti["num_trainable_params"],
        "total_params": ti["num_total_params"],
        "notes": (f"torch {pk['torch-version']}, transformers {pk['transformers-version']}, "
                  f"peft {pk['peft-version']}@{pk['peft-commit-hash']}, run {ri['created_at']}. Mean tokens per "
                  f"sample {mean_tokens:.0f} (train total tokens / samples). " + NOTE_MAX
                  + (" " + NOTE_READER if unmodelled_variant else "")),
    }
    rows.append(row)
for e in exps:
    if e in seen:
        continue
    rows.append({
        "id": f"MMQA-{e.replace('/llama-3.2-3B', '')}", "source_group": "peft-MetaMathQA-benchmark", "stack": "hf",
        "source": f"huggingface/peft {BASE}/experiments/{e} @{COMMIT}", "location": "no results/ file at this commit",
        "model": "meta-llama/Llama-3.2-3B", "method": e.split("/")[0], "no_result": True,
        "memory_metric": "none", "memory_gib": None, "outcome": "no result", "notes": "experiment defined, never run"})
json.dump(rows, sys.stdout, indent=2)
print()
