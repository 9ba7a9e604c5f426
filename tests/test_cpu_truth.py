"""A subset of benchmarks/cpu_truth.py: real CPU steps vs the full estimate, within 2 %."""

from __future__ import annotations

import pytest
from benchmark_module import load_benchmark

pytest.importorskip("transformers")

cpu_truth = load_benchmark("cpu_truth")

SUBSET = ("llama bf16 LoRA ckpt", "qwen2 bf16 full sgd", "llama QLoRA nf4 dq bf16 ckpt",
          "llama QLoRA nf4 bf16 autocast", "llama bf16 freeze emb frozen")


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBSET)
def test_real_cpu_step_within_two_percent(name: str) -> None:
    row = next(r for r in cpu_truth.ROWS if r.name == name)
    real, est, real_phase, est_phase = cpu_truth.measure(row)
    assert abs(est - real) <= 0.02 * real, (name, real, est)
    assert real_phase == est_phase
