"""fitcheck's micro-batch tuner vs HF's auto_find_batch_size on simulated GPUs: real Trainers, then big models.

Part 1, real ``transformers.Trainer`` runs (tiny Llama, CPU; benchmarks/tuner_budget.py): full fine-tuning,
accumulation, LoRA, checkpointing and TRL's SFTTrainer. Each runs under a simulated GPU, a dispatch mode that
raises ``torch.OutOfMemoryError`` past N live bytes. The true maximum comes from a scan: a real 2-step training
run at every micro-batch that keeps the global batch (micro × accumulation = the user's), its live-byte peak
recorded; the budget lies half-way between two sizes' peaks. ``tune_micro_batch(trainer)`` (estimate at that
budget, trial steps that cannot move the weights) then ``trainer.train()``, against ``auto_find_batch_size=True``
from the same starting arguments on the same budget. Columns: attempts (training starts for HF, trial steps
for the tuner), OOMs, optimizer steps taken overall (max_steps = 2), whether the global batch was kept, and
whether the training that counts started from the initial weights.

Part 2, for 10 configurations of different model families and settings, a simulated GPU runs a "training step" at a
micro-batch m and raises ``torch.OutOfMemoryError`` when the memory the step needs exceeds the GPU's memory.
The memory a step "really" needs is fitcheck's own estimate of the device memory used, multiplied by
(1 + error): the error, fixed per row (between -5% and +5%, the size of the run-to-run spread in published
tables, shared/calibration/README.md), stands for what the estimate gets wrong on a real GPU. The tuner
starts from fitcheck's prediction (``max_micro_batch`` on the unperturbed estimate); HF's
``accelerate.utils.find_executable_batch_size`` (what ``auto_find_batch_size`` calls) starts from a
per_device_train_batch_size of 64 and shrinks by x0.9 per OOM.

Run: ``PYTHONPATH=. python benchmarks/tuner_vs_hf.py`` (``--part 1`` or ``--part 2`` for one part).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import find_executable_batch_size
from fitcheck.integrations import search_largest

from fitcheck.advice import max_micro_batch, with_micro_batch
from fitcheck.core import estimate
from fitcheck.spec import TrainingSpec

HF_START = 64


@dataclass(frozen=True)
class Row:
    name: str
    model: str
    values: dict[str, object]
    error: float  # the estimate's error against the simulated GPU: true = estimate x (1 + error)


COMMON = {"bf16": True, "dtype": "bfloat16"}
ROWS = [
    Row("Llama-3.1-8B full FT, ckpt, seq 2048", "meta-llama/Llama-3.1-8B",
        {**COMMON, "gradient_checkpointing": True, "max_seq_length": 2048, "gpu": "H100-80GB"}, +0.02),
    Row("Llama-3.2-1B full FT, seq 1024", "meta-llama/Llama-3.2-1B",
        {**COMMON, "max_seq_length": 1024, "gpu": "A100-80GB"}, -0.03),
    Row("Mistral-7B LoRA r16, seq 2048", "mistralai/Mistral-7B-v0.1",
        {**COMMON, "use_peft": True, "lora_target_modules": "all-linear", "max_seq_length": 2048,
         "gpu": "A100-80GB"}, +0.04),
    Row("Qwen2.5-7B QLoRA nf4, ckpt, seq 4096", "Qwen/Qwen2.5-7B",
        {**COMMON, "use_peft": True, "load_in_4bit": True, "use_bnb_nested_quant": True,
         "gradient_checkpointing": True, "max_seq_length": 4096, "gpu": "RTX4090-24GB"}, -0.01),
    Row("Gemma-2-2B full FT, eager, seq 1024", "google/gemma-2-2b",
        {**COMMON, "attn_implementation": "eager", "max_seq_length": 1024, "gpu": "A100-40GB"}, +0.05),
    Row("Phi-2 LoRA, seq 2048", "microsoft/phi-2",
        {**COMMON, "use_peft": True, "max_seq_length": 2048, "gpu": "L40S-48GB"}, -0.05),
    Row("GPT-2 large full FT fp32, ckpt, seq 512", "openai-community/gpt2-large",
        {"dtype": "float32", "gradient_checkpointing": True, "max_seq_length": 512,
         "gpu": "A10G-24GB"}, +0.03),
    Row("Falcon-7B QLoRA, seq 2048", "tiiuae/falcon-7b",
        {**COMMON, "use_peft": True, "load_in_4bit": True, "max_seq_length": 2048, "gpu": "A100-40GB"}, 0.0),
    Row("Llama-3.1-8B ZeRO-3 x8, seq 4096", "meta-llama/Llama-3.1-8B",
        {**COMMON, "num_processes": 8, "zero_stage": 3, "max_seq_length": 4096, "gpu": "A100-80GB"}, +0.01),
    Row("Qwen2.5-0.5B full FT 8-bit Adam, ckpt, seq 512", "Qwen/Qwen2.5-0.5B",
        {**COMMON, "optim": "adamw_bnb_8bit", "gradient_checkpointing": True, "max_seq_length": 512,
         "gpu": "RTX4090-24GB"}, -0.02),
]  # fmt: skip


def build_spec(row: Row) -> TrainingSpec:
    """The spec ``fitcheck estimate`` builds from these flags (the CLI's own reader path)."""
    from fitcheck.cli import spec_from_values

    values = {"model_name_or_path": row.model, "per_device_train_batch_size": 1, **row.values}
    return spec_from_values(values, env={})[0]


def simulated_step(spec: TrainingSpec, error: float) -> tuple[Callable[[int], None], list[int]]:
    calls: list[int] = []
    budget = spec.hardware.gpu_memory_bytes
    cache: dict[int, float] = {}

    def need(m: int) -> float:
        if m not in cache:
            cache[m] = estimate(with_micro_batch(spec, m)).device_used_bytes * (1.0 + error)
        return cache[m]

    def step(m: int) -> None:
        calls.append(m)
        if need(m) > budget:
            # the shape of the real message: accelerate's should_reduce_batch_size matches " out of memory."
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate (simulated, micro-batch {m})")

    return step, calls


def true_max(spec: TrainingSpec, error: float, limit: int = 4096) -> int:
    step, _ = simulated_step(spec, error)
    best = 0
    for m in range(1, limit + 1):
        try:
            step(m)
        except torch.OutOfMemoryError:
            return best
        best = m
    return best


def hf(spec: TrainingSpec, error: float) -> tuple[int, int]:
    step, calls = simulated_step(spec, error)

    @find_executable_batch_size(starting_batch_size=HF_START)
    def run(batch_size: int) -> int:
        step(batch_size)
        return batch_size

    try:
        return run(), len(calls)
    except RuntimeError:  # "No executable batch size found, reached zero."
        return 0, len(calls)


def big_models() -> int:
    t0 = time.perf_counter()
    header = (
        f"{'config':42} {'err':>5} {'true':>5} | {'pred':>5} {'ours':>5} {'trials':>6} | "
        f"{'HF(64)':>6} {'trials':>6}"
    )
    print(header)
    print("-" * len(header))
    good = 0
    for row in ROWS:
        spec = build_spec(row)
        truth = true_max(spec, row.error)
        predicted = max_micro_batch(spec)
        step, _ = simulated_step(spec, row.error)
        ours = search_largest(step, predicted, clear_cache=lambda: None)
        hf_result, hf_trials = hf(spec, row.error)
        ok = ours.size == truth and ours.trials <= 2
        good += ok
        print(
            f"{row.name:42} {row.error:+5.0%} {truth:5d} | {predicted:5d} {ours.size:5d} "
            f"{ours.trials:6d} | {hf_result:6d} {hf_trials:6d}" + ("" if ok else "   <- > 2 trials or off")
        )
    print("-" * len(header))
    print(f"true maximum (±0) in <= 2 trials: {good} of {len(ROWS)}  ({time.perf_counter() - t0:.1f} s)")
    return 0 if good >= 8 else 1


def main(argv: list[str]) -> int:
    part = argv[argv.index("--part") + 1] if "--part" in argv else "all"
    rc = 0
    if part in ("1", "all"):
        from tuner_real import real_trainers

        rc |= real_trainers()
    if part in ("2", "all"):
        print()
        rc |= big_models()
    return rc


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
