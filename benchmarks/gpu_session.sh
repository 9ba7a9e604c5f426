#!/usr/bin/env bash
# One lent-GPU session (the `device` tool), prepared to run as one command in the repo root:
#   bash benchmarks/gpu_session.sh [STAGE ...]        (default: new trainer rest)
# Stages, each bounded by its own time budget so a slow one cannot starve the next:
#   new      gpu_truth.py rows never measured before, the issue-19 ones first: steps of other padded lengths
#            (--seq_lengths), the allocator settings (expandable_segments, max_split_size_mb), LLM.int8 at 4k;
#   trainer  trainer_gpu.py: a real Trainer run phase by phase (prepare, step, evaluate, save), plain, LoRA and
#            DeepSpeed ZeRO-2/3 on one process;
#   rest     gpu_truth.py: the other rows no GPU has measured yet, until the budget;
#   tuner    tuner_fsdp_gpu.py (session 6, H100: done);  fsdp  fsdp_gpu.py (session 6, H100: done);
#   trl      trl_gpu.py: the real TRL trainers (SFT, DPO, GRPO with generation, KTO, reward) at Qwen2.5-0.5B's width
#            (session 18);
#   big      gpu_truth.py: an 8B QLoRA row (issue 19's loading report: quantise-on-load of a whole 8B model);
#   fsdplora fsdp1_lora_gpu.py: the fms FSDP1 LoRA / QLoRA settings on one GPU, with and without FSDP1, on the
#            installed stack and on the fms runs' stack (wheels in .whl_old/: transformers 4.48.1, peft 0.13.2,
#            accelerate 1.0.1, tokenizers 0.21.4, huggingface_hub 0.36.2), each step-2 peak named by a memory trace
#            (session 21); fsdplora4 (prepared by s21-frag): the 16-layer 70B row's every allocator event, loaded
#            as the fms run loads (fsdpload) and as the other rows (fsdp1_lora_trace.py replays both here), the
#            same run capped at 27 / 30 GiB after its load, Mistral-7B LoRA / 70B-4L QLoRA FSDP1 capped where
#            fitcheck's replay says they start / stop running, and Mistral LoRA FSDP1 loaded on the CPU.
#            fsdplora5 (session 23): the Mistral-7B LoRA FSDP1 row's every allocator event (its capped runs ran out
#            of memory where the harness's replay said they would run).
# Rows are measured only (--measure_only): `gpu_truth.py --rescore` / `trainer_gpu.py --rescore` add the estimates
# on any machine. The pinned transformers/peft/bitsandbytes/deepspeed wheels carried in .whl/ (the image has other
# versions; bitsandbytes and deepspeed not at all) are unpacked in front of the image's packages.
# Results land in $OUT (the device tool's folder) or /tmp/gpu_out, then go to benchmarks/data/.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DS_ACCELERATOR=cuda
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/site
STAGES=("${@:-new trainer rest}")
read -r -a STAGES <<<"${STAGES[*]}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for w in .whl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
mkdir -p /tmp/site_old
for w in .whl_old/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site_old; done
# installed, fitcheck.integrations is the integrations/ folder (pyproject package-dir); here a copy in place
[ -d fitcheck/integrations ] || cp -r integrations fitcheck/integrations
export PYTHONPATH=/tmp/site:$PWD
python3 - <<'EOF'
import importlib, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda")
for m in ("transformers", "accelerate", "peft", "bitsandbytes", "deepspeed", "fitcheck"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"), mod.__file__)
    except Exception as exc:
        print(m, "IMPORT FAILED", type(exc).__name__, str(exc)[:300])
EOF
NEW=("fused lengths" "QLoRA ckpt lengths" "fused expandable" "int8 LoRA")
REST=("qwen0.5b bf16 full fused" "gemma2-2b bf16 full eager" "mistral7b-8L" "gpt2 fp32 full adamw_torch"
      "llama1b bf16 full eager" "ckpt b1 s8192" "qwen1.5b bf16 full ckpt" "phi2 bf16 full ckpt"
      "gemma2-2b QLoRA" "mistral7b LoRA ckpt" "llama1b bf16 full sgd" "gpt2 fp32+autocast")
for stage in "${STAGES[@]}"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    new) timeout 200 python3 benchmarks/gpu_truth.py --measure_only --budget_s 165 --row_timeout_s 75 \
           --rows "${NEW[@]}" --out "$OUT/gpu_truth_new.json" ;;
    trainer) timeout 200 python3 benchmarks/trainer_gpu.py --budget_s 170 --timeout_s 75 --out "$OUT" ;;
    rest) timeout 190 python3 benchmarks/gpu_truth.py --measure_only --budget_s 160 --row_timeout_s 70 \
            --rows "${REST[@]}" --out "$OUT/gpu_truth_rest.json" ;;
    trl) timeout "${TRL_BUDGET_S:-330}" python3 benchmarks/trl_gpu.py --out "$OUT" --timeout_s 110 \
           --budget_s "$(( ${TRL_BUDGET_S:-330} - 40 ))" ;;
    big) timeout 230 python3 benchmarks/gpu_truth.py --measure_only --budget_s 225 --row_timeout_s 220 \
           --rows "qwen3-8b QLoRA ckpt b2 s2048" --out "$OUT/gpu_truth_big.json" ;;
    fsdplora) FSDP1_GPU_OLD_SITE=/tmp/site_old timeout "${FSDPLORA_BUDGET_S:-430}" python3 benchmarks/fsdp1_lora_gpu.py \
           --out "$OUT" --timeout_s 110 --budget_s "$(( ${FSDPLORA_BUDGET_S:-430} - 20 ))" \
           --cases "llama70b-4L QLoRA fsdp1 b2" "llama70b-4L QLoRA fsdp1 b2 old" "mistral LoRA fsdp1 b4 old" \
                   "mistral LoRA fsdp1 b4" "llama70b-4L QLoRA plain b2" "mistral LoRA plain b4" \
                   "mistral QLoRA fsdp1 b4" "mistral QLoRA plain b4" ;;
    fsdplora2) TORCH_SYMBOLIZE_MODE=dladdr FSDP1_GPU_OLD_SITE=/tmp/site_old timeout "${FSDPLORA_BUDGET_S:-300}" python3 benchmarks/fsdp1_lora_gpu.py \
           --out "$OUT" --timeout_s 100 --budget_s "$(( ${FSDPLORA_BUDGET_S:-300} - 20 ))" --cases \
           "mistral LoRA fsdp1 b4 old detail" "mistral LoRA plain b4 old" "mistral LoRA fsdp1v1 b4" \
           "llama70b-4L QLoRA fsdp1 b2 old detail" "llama70b-4L QLoRA fsdp1v1 b2" "llama70b-4L QLoRA plain b2 old" ;;
    fsdplora3) FSDP1_GPU_OLD_SITE=/tmp/site_old timeout 190 python3 benchmarks/fsdp1_lora_gpu.py \
           --out "$OUT" --timeout_s 180 --budget_s 185 --cases "llama70b-16L QLoRA fsdp1 b4 old" ;;
    fsdplora4) FSDP1_GPU_OLD_SITE=/tmp/site_old timeout 570 python3 benchmarks/fsdp1_lora_gpu.py \
           --out "$OUT" --timeout_s 150 --budget_s 550 --cases "llama70b-16L QLoRA fsdp1 b4 old fsdpload trace" \
           "mistral LoRA fsdp1v1 b4 cap24.5" "mistral LoRA fsdp1v1 b4 cap24.0" "llama70b-4L QLoRA fsdp1v1 b2 cap8.9" \
           "llama70b-16L QLoRA fsdp1 b4 old trace" \
           "llama70b-16L QLoRA fsdp1 b4 old cap27" "llama70b-16L QLoRA fsdp1 b4 old cap30" \
           "mistral LoRA fsdp1 b4 old cpuload" ;;
    fsdplora5) timeout 170 python3 benchmarks/fsdp1_lora_gpu.py --out "$OUT" --timeout_s 160 --budget_s 165 \
           --cases "mistral LoRA fsdp1v1 b4 trace" ;;
    tuner) timeout 170 python3 benchmarks/tuner_fsdp_gpu.py --out "$OUT" --timeout_s 80 ;;
    fsdp) timeout 150 python3 benchmarks/fsdp_gpu.py --out "$OUT" --timeout_s 70 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== done $(date +%T)"
