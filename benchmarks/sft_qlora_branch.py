"""TRL SFT QLoRA on CUDA: the formula's first recomputed layer vs TRL's step traced with its bf16 adapters.

Two tables (issue 19; ``fitcheck/core/activations/qlora16.py`` ``sixteen_bit_branch``):

* narrow: a Qwen2.5 config at (h, I) widths, 2 layers, vocabulary 1024, 2 x 256 and 1 x 256 tokens, traced on fake
  tensors as the CUDA run (``tracer_trl``: TRL's bf16 cast of the adapters and its fused head; ``cuda_kernels``),
  against the formula of the same CUDA spec: (formula - trace) during backward, bytes per token, with and without
  TRL's cast (without it: peft's fp32 adapters; since ``cuda_emulation.py`` item 5 their branch runs on the bf16
  input as on a GPU, before it in fp32; the table below is TRL's cast);
* full: Qwen2.5-0.5B QLoRA r16, 4 x 1024, checkpointing, H100-80GB, ``--trainer sft``: the formula's peak
  allocated vs the SFT run's whole-run replay (``allocator_whole_run.whole_run_events``, three steps).

Measured (this branch, 2026-11-27; main before it: full +10.7 % / +15.5 %, narrow +4804..+11348 B/token):

| shape (h, I), targets | tokens | formula - trace, B/token |
|---|---|---|
| 256, 688, all-linear | 256 / 512 | +1086 / +578 |
| 256, 1376, all-linear | 256 / 512 | +1344 / +836 |
| 512, 1376, all-linear | 256 / 512 | +1908 / +1124 |
| 256, 688, q/v | 256 / 512 | +220 / +112 |
| 256, 1376, q/v | 256 / 512 | +220 / +112 |
| 512, 1376, q/v | 256 / 512 | +412 / +208 |

| Qwen2.5-0.5B SFT QLoRA 4 x 1024 | formula before | formula after | replay | after / replay |
|---|---|---|---|---|
| q, v (peft's default) | 1,152,178,816 | 1,043,126,912 | 1,040,956,296 | +0.21 % |
| all-linear | 1,318,379,072 | 1,158,995,520 | 1,141,391,176 | +1.54 % |

Run: ``PYTHONPATH=.:tests python benchmarks/sft_qlora_branch.py [narrow] [full]``
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from tiny_models import narrow_catalog_config

from fitcheck.core import estimate
from fitcheck.core.trainers import trainer_row
from fitcheck.report import Component, Phase
from fitcheck.spec import DeviceType, TrainerKind, TrainerSpec
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, trace_step

SHAPES = ((256, 688), (256, 1376), (512, 1376))
TARGETS = (("all-linear",), ("q_proj", "v_proj"))


def narrow(targets: tuple[str, ...], hidden: int, inter: int, batch: int, cast: bool = True) -> float:
    """(formula - trace) during backward, bytes per token, of the narrowed CUDA SFT QLoRA spec."""
    cfg = narrow_catalog_config("Qwen/Qwen2.5-7B")
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_attention_heads=hidden // 64)
    spec = cell_spec(Cell("qwen2", "qlora_noprep", True, "sdpa", "autocast", 256, batch), cfg)
    assert spec.lora is not None
    spec = dataclasses.replace(spec, trainer=TrainerSpec(kind=TrainerKind.SFT),
                               lora=dataclasses.replace(spec.lora, target_modules=targets),
                               hardware=dataclasses.replace(spec.hardware, device_type=DeviceType.CUDA))
    kw: dict[str, Any] = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    kw["cublas_workspaces"] = ()
    if cast:
        kw["trl_head"] = trainer_row(TrainerKind.SFT).fused_head
    comps = tuple(c for c in components_from_trace(trace_step(cfg, num_layers=2, **kw)) if isinstance(c, Component))
    f, t = estimate(spec), estimate(spec, activations=comps)

    def total(report: Any) -> int:
        return sum(c.at(Phase.BACKWARD) for c in report.components if c.location.value == "device")

    return (total(f) - total(t)) / (batch * 256)


def full(targets: tuple[str, ...]) -> tuple[int, int]:
    """(formula peak allocated, replayed peak allocated) of Qwen2.5-0.5B SFT QLoRA r16, 4 x 1024, H100-80GB."""
    from fitcheck.cli import build_parser, spec_from_args
    from fitcheck.torch_adapters import whole_run_events

    argv = ["estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--per_device_train_batch_size", "4",
            "--max_seq_length", "1024", "--bf16", "--gradient_checkpointing", "--use_peft", "--lora_r", "16",
            "--load_in_4bit", "--bnb_4bit_compute_dtype", "bfloat16", "--bnb_4bit_quant_type", "nf4",
            "--gpu", "H100-80GB", "--trainer", "sft", "--lora_target_modules", *targets]
    spec = spec_from_args(build_parser().parse_args(argv))[0]
    live = peak = 0
    for _serial, signed, _tag in whole_run_events(spec, steps=3):
        live += signed
        peak = max(peak, live)
    return estimate(spec).peak_allocated_bytes, peak


def main(argv: list[str]) -> int:
    if not argv or "narrow" in argv:
        print("| shape (h, I), targets | cast | formula - trace B/token, 1 x 256 / 2 x 256 |")
        for targets in TARGETS:
            for h, i in SHAPES:
                for cast in (True, False):
                    one, two = (narrow(targets, h, i, b, cast) for b in (1, 2))
                    print(f"| {h}, {i}, {','.join(targets)} | {'bf16 (TRL)' if cast else 'fp32 (peft)'} | "
                          f"{one:+.0f} / {two:+.0f} |", flush=True)
    if not argv or "full" in argv:
        for targets in TARGETS:
            formula, replay = full(targets)
            print(f"| {','.join(targets)} | formula {formula:,} | replay {replay:,} | {formula / replay - 1:+.2%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
