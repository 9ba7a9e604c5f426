"""QLoRA without k-bit preparation on CUDA under bf16 autocast: the first recomputed layer's working set, traced.

peft 0.21.2 ``tuners/lora/bnb.py`` ``Linear4bit.forward`` runs its LoRA branch on the 16-bit input when the
argument-less ``torch.is_autocast_enabled()`` (CUDA's) is True, as on a GPU under ``torch.autocast("cuda")``; the
CUDA-emulating trace answers it so since ``torch_adapters/cuda_emulation.py`` item 5 (before, it ran the fp32 branch
of a CPU step). This prints, per (h, I) and dropout, the slope over the token count of (formula − trace) during
backward on a CUDA spec (bytes per token: the per-token error of ``qlora16_backward_working_set``; the constant
terms, dequantized weights among them, drop out), and the working set the trace implies (formula's − slope), as a
multiple of I with 6·h taken off. The old-trace column was measured with the tracer of main ``a3f6f23`` (before item
5: the call left to torch, the fp32 branch), against the same formula rows.

A Llama-3.1 (or Qwen2.5) config at those widths, 2 layers, vocabulary 1024, sequence 1024, micro-batch 1 / 2 / 4,
peft's fp32 adapters on every linear layer, a plain Trainer's step (``--trl``: TRL's SFT step, its bf16 cast and
fused head; ``--targets q,v``: peft's default targets). Measured (2026-11-27, branch s14-autocast):

| family | dropout | (h, I) | old trace: implied ws | fixed trace: implied ws |
|---|---|---|---|---|
| llama | 0.05 | (1024, 4096), (1024, 8192), (2048, 4096) | 10.00·I + 6·h (4 B/token) | 2.00·I + 6·h (4 B/token) |
| llama | 0 | (1024, 4096), (1024, 8192), (2048, 4096) | 6.00·I + 6·h (4 B/token) | 4·I − 10·h (36 B/token) |
| llama | 0 | (2048, 8192), (1024, 2816) | | 4·I − 10·h (36 B/token) |
| qwen2 | 0.05 / 0 | (1024, 4096), (2048, 4096) | | 2·I + 6·h / 4·I − 10·h |
| llama, TRL | 0.05 / 0 | (1024, 4096), (2048, 4096) | | 2·I + 6·h / 4·I − 10·h |
| llama, q/v | 0.05 / 0 | (1024, 4096), (2048, 4096) | | 6·I − 2·h / 6·I − 4·h |

(the fixed trace at 2048 / 4096 / 8192 tokens; the no-dropout rows are linear only from 2048 tokens on.)

Run: ``PYTHONPATH=.:tests python benchmarks/qlora16_cuda_branch.py [--family llama|qwen2] [--shapes 1024x4096,...]
[--dropouts 0.05,0] [--batches 1,2,4] [--trl] [--targets q,v]``
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from tiny_models import narrow_catalog_config

from fitcheck.core import estimate
from fitcheck.core.activations import qlora16_backward_working_set
from fitcheck.core.trainers import trainer_row
from fitcheck.report import Component, Phase
from fitcheck.spec import DeviceType, TrainerKind, TrainerSpec
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, trace_step

MODELS = {"llama": "meta-llama/Llama-3.1-8B", "qwen2": "Qwen/Qwen2.5-7B"}
SEQ = 1024


def error(family: str, h: int, inter: int, batch: int, dropout: float, trl: bool,
          targets: tuple[str, ...]) -> tuple[int, int]:
    """(formula − trace during backward in bytes, the formula's working set per token) of one CUDA spec."""
    cfg = narrow_catalog_config(MODELS[family], bos_token_id=1, eos_token_id=2)
    cfg.pop("rope_scaling", None)
    cfg.update(hidden_size=h, intermediate_size=inter, num_attention_heads=h // 64)
    spec = cell_spec(Cell(family, "qlora_noprep", True, "sdpa", "autocast", SEQ, batch), cfg)
    assert spec.lora is not None
    spec = dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, dropout=dropout, target_modules=targets),
                               hardware=dataclasses.replace(spec.hardware, device_type=DeviceType.CUDA))
    kw: dict[str, Any] = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    kw["cublas_workspaces"] = ()
    if trl:
        spec = dataclasses.replace(spec, trainer=TrainerSpec(kind=TrainerKind.SFT))
        kw["trl_head"] = trainer_row(TrainerKind.SFT).fused_head
    comps = tuple(c for c in components_from_trace(trace_step(cfg, num_layers=2, **kw)) if isinstance(c, Component))
    f, t = estimate(spec), estimate(spec, activations=comps)

    def total(report: Any) -> int:
        return sum(c.at(Phase.BACKWARD) for c in report.components if c.location.value == "device")

    return total(f) - total(t), qlora16_backward_working_set(spec)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="llama", choices=tuple(MODELS))
    ap.add_argument("--shapes", default="1024x4096,1024x8192,2048x4096")
    ap.add_argument("--dropouts", default="0.05,0")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--trl", action="store_true", help="TRL's SFT step (its bf16 adapters, fused head)")
    ap.add_argument("--targets", choices=("", "q,v"), default="")
    ns = ap.parse_args(argv)
    targets = ("q_proj", "v_proj") if ns.targets else ("all-linear",)
    batches = [int(b) for b in ns.batches.split(",")]
    for dropout in (float(d) for d in ns.dropouts.split(",")):
        for shape in ns.shapes.split(","):
            h, inter = (int(x) for x in shape.split("x"))
            rows = [error(ns.family, h, inter, b, dropout, ns.trl, targets) for b in batches]
            ws = rows[0][1]
            slopes = [(rows[k + 1][0] - rows[k][0]) / ((batches[k + 1] - batches[k]) * SEQ)
                      for k in range(len(rows) - 1)]
            implied = " ".join(f"{(ws - s - 6 * h) / inter:+.3f}·I + 6·h" for s in slopes)
            print(f"{ns.family} dropout {dropout} (h, I) = ({h}, {inter}): formula {ws} B/token; slope of formula − "
                  f"trace {' '.join(f'{s:+.0f}' for s in slopes)} B/token; implied {implied}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
