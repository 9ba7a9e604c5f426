#!/usr/bin/env bash
# One lent-GPU session (the `device` tool), prepared to run as one command in the repo root:
#   bash benchmarks/gpu_session.sh [GPU_TRUTH_BUDGET_S [FSDP_CASE ...]]
# 1. the environment (GPU, driver, versions); the pinned transformers/peft/bitsandbytes wheels carried in .whl/
#    (the image has other versions; bitsandbytes not at all) are unpacked in front of the image's packages;
# 2. benchmarks/tuner_fsdp_gpu.py: tune_micro_batch on a real FSDP2 Trainer, then training vs an untuned run;
# 3. benchmarks/fsdp_gpu.py: a real FSDP Trainer, bf16- vs fp32-loaded (accelerate's upcast), prepare/step/save;
# 4. benchmarks/gpu_truth.py --quick: load and step, allocated/reserved/used vs the estimate (rows in order,
#    stopped by a time budget; rows in the committed data file are kept).
# Results land in $OUT (the device tool's folder) or /tmp/gpu_out, then go to benchmarks/data/.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/site
BUDGET=${1:-200}
shift || true
FSDP_CASES=("${@:-fsdp2 bf16-loaded}")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for w in .whl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/site; done
# installed, fitcheck.integrations is the integrations/ folder (pyproject package-dir); here a copy in place
[ -d fitcheck/integrations ] || cp -r integrations fitcheck/integrations
export PYTHONPATH=/tmp/site:$PWD
python3 - <<'EOF'
import importlib, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda")
for m in ("transformers", "accelerate", "peft", "bitsandbytes", "fitcheck"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"), mod.__file__)
    except Exception as exc:
        print(m, "IMPORT FAILED", type(exc).__name__, str(exc)[:300])
EOF
echo "=== tuner_fsdp_gpu $(date +%T)"
timeout 170 python3 benchmarks/tuner_fsdp_gpu.py --out "$OUT" --timeout_s 80
echo "=== fsdp_gpu $(date +%T)"
timeout 150 python3 benchmarks/fsdp_gpu.py --out "$OUT" --timeout_s 70 --cases "${FSDP_CASES[@]}"
echo "=== gpu_truth --quick (budget ${BUDGET}s) $(date +%T)"
# rows already measured in the committed data file are kept (--resume); the others run until the budget
timeout $((BUDGET + 40)) python3 benchmarks/gpu_truth.py --quick --budget_s "$BUDGET" --row_timeout_s 90 \
  --resume benchmarks/data/gpu_truth_nvidia_h100_80gb_hbm3.json --out "$OUT/"
echo "=== done $(date +%T)"
