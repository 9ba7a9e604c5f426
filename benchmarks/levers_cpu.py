"""Real CPU steps: reentrant vs non-reentrant activation checkpointing (``gradient_checkpointing_kwargs``).

torch/utils/checkpoint.py: ``CheckpointFunction`` (reentrant) saves the layer inputs with ``save_for_backward``;
the non-reentrant default saves them through ``_NoopSaveInputs``. This prints the live-tensor bytes of each phase
of the second of two REAL training steps of a tiny Llama (``fitcheck.torch_adapters.tracer.trace_step(...,
fake=False)``) with each setting, and the fitcheck estimate (which counts both the same).

Run: ``PYTHONPATH=. python benchmarks/levers_cpu.py``
"""

from __future__ import annotations

import sys
from dataclasses import replace

from benchmarks.cpu_truth import ALL_LINEAR, LLAMA, Row, spec_for


def main() -> int:
    """Print the per-phase table; exit 1 when the end-of-forward bytes differ between the two settings."""
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import trace_step

    worst = 0.0
    print(f"{'config':26} {'phase':18} {'non-reentrant MiB':>18} {'reentrant MiB':>14} {'diff MiB':>9}")
    for name, lora in (("llama bf16 full ckpt", None), ("llama bf16 LoRA ckpt", ALL_LINEAR)):
        runs = [trace_step(LLAMA, seq_len=256, micro_batch=2, checkpointing=True, lora=lora, fake=False,
                           use_reentrant=reentrant) for reentrant in (False, True)]
        for phase, a in runs[0].phases.items():
            b = runs[1].phases[phase]
            print(f"{name:26} {phase.value:18} {a.total / 2**20:18.3f} {b.total / 2**20:14.3f} "
                  f"{(b.total - a.total) / 2**20:+9.3f}")
        spec = spec_for(Row(name, LLAMA, ckpt=True, lora=lora))
        est = [estimate(replace(spec, activations=replace(spec.activations, use_reentrant=r))).peak_allocated_bytes
               for r in (False, True)]
        real = [r.peak for r in runs]
        print(f"{name:26} {'peak (real / est)':18} {real[0] / 2**20:9.3f}/{est[0] / 2**20:8.3f} "
              f"{real[1] / 2**20:6.3f}/{est[1] / 2**20:7.3f}")
        worst = max(worst, *(abs(e - r) / r * 100 for e, r in zip(est, real, strict=True)))
    print(f"worst |estimate - real peak| {worst:.2f}%")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
