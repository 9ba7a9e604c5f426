"""Check fitcheck's compute model against the seeds' 6·P·D arithmetic and torchtitan's published tokens/s.

Published: torchtitan benchmarks/llama3_h100_202412_torchtitan.md (commit 9dec370, Dec 2024): Llama 3.1 8B,
FSDP, local batch 2, seq 8192, selective activation checkpointing, H100 SXM (500 W, HBM2e), TPS/GPU:
5,762 on 8 GPUs and 5,605 on 128 GPUs (eager), 6,667 / 6,514 with torch.compile; the same page states
"33% to 39% MFU" for these rows against the 989 TFLOPS SXM peak. fitcheck's MFU convention is the same
(PaLM appendix B, 6N + 12·L·H·Q·T), so at the stated MFU the predicted tokens/s should land on the table.

Run: ``PYTHONPATH=. python benchmarks/compute_check.py``.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from fitcheck.core import compute_estimate
from fitcheck.readers import load_inventory, spec_from_values
from fitcheck.spec import FsdpSpec, ShardingSpec, Strategy

ROWS = [  # (label, GPUs, published TPS/GPU, MFU the page states for the row)
    ("FSDP, 8 GPUs", 8, 5762, 0.33),
    ("FSDP, 128 GPUs", 128, 5605, 0.33),
    ("FSDP + compile, 8 GPUs", 8, 6667, 0.39),
    ("FSDP + compile, 128 GPUs", 128, 6514, 0.39),
]


def main() -> int:
    inv = load_inventory("meta-llama/Llama-3.1-8B", env={})
    base, _ = spec_from_values(
        {"per_device_train_batch_size": 2, "max_seq_length": 8192, "bf16": True, "dtype": "bfloat16",
         "gpu": "H100-80GB"},
        inventory=inv,
    )  # fmt: skip
    n = inv.total_params
    embed = inv.shape.vocab_size * inv.shape.hidden_size
    print("Seeds' arithmetic: C = 6·P·D (forward 2PD, backward 4PD)")
    short = replace(base, batch=replace(base.batch, seq_len=1, micro_batch=1))
    c = compute_estimate(short)
    print(f"  Llama-3.1-8B: P = {n:,} params, {n - embed:,} in matmuls (embedding lookup excluded)")
    print(f"  6·P_matmul = {6 * (n - embed):.4e} FLOP/token; fitcheck at seq 1: {c.flops_per_token:.4e}")
    print(f"  1e12 tokens -> {6 * (n - embed) * 1e12:.3e} FLOPs (6·P·D with all params: {6 * n * 1e12:.3e})")
    full = compute_estimate(base)
    extra = full.flops_per_token / c.flops_per_token - 1
    print(f"  at seq 8192 the attention term 12·L·H·Q·T adds {extra:.1%}")
    print()
    print("torchtitan Llama 3.1 8B, H100 SXM, seq 8192, local batch 2 (published TPS/GPU vs fitcheck)")
    cols = f"{'published':>9} {'MFU implied':>11} {'stated':>6} {'fitcheck@stated':>15} {'error':>7}"
    print(f"{'row':28} {cols}")
    worst = 0.0
    for label, gpus, tps, stated in ROWS:
        spec = replace(
            base,
            sharding=ShardingSpec(Strategy.FSDP, num_processes=gpus, num_machines=gpus // 8, fsdp=FsdpSpec()),
        )
        est = compute_estimate(spec, mfu=stated)
        implied = tps * est.model_flops_per_token / 989e12
        ours = est.tokens_per_second_per_gpu or 0.0
        err = ours / tps - 1
        worst = max(worst, abs(err))
        print(f"{label:28} {tps:9,d} {implied:11.1%} {stated:6.0%} {ours:15,.0f} {err:+7.1%}")
    print(f"worst |error| at the stated MFU: {worst:.1%} (MFU per row is stated as a 33-39% range)")
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
