"""Formula vs fake-tensor trace for Qwen3-MoE and DeepSeek-V3 (MLA, shared experts), at real widths.

Each model's catalog config.json is cut to a few layers (DeepSeek-V3: ``first_k_dense_replace`` cut to
layers − 1, so both a dense and a MoE layer are there; experts and every width stay real). The same CPU spec
(bf16, SDPA, batch 1, no checkpointing, AdamW) is estimated twice with ``fitcheck.core.estimate``: with the pure
formulas, and with the activation components of ``fitcheck.torch_adapters.tracer.trace_step`` on that config
(no depth extrapolation: dense and MoE layers differ). Prints every device byte per phase (end of forward,
start of backward, during backward) and the signed error; LoRA is r=16 ``all-linear`` as peft 0.21 applies it
(the fused experts and the router through ``lora.ParamWrapper``).

    python benchmarks/moe_mla_vs_trace.py [--seqs 512 2048] [--layers 2] [--models ...] [--methods full lora]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    OptimizerSpec,
    PrecisionSpec,
    TrainingSpec,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from families_vs_trace import inventory, reduced

MODELS = ("Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3")
PHASES = (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD)
LORA = LoraSpec(r=16, target_modules=("all-linear",))
_STATES = frozenset({Category.WEIGHTS, Category.ADAPTERS, Category.QUANT_META, Category.GRADIENTS,
                     Category.OPTIMIZER, Category.MASTER})


def cpu_spec(cfg: dict[str, object], model_id: str, seq: int, lora: LoraSpec | None) -> TrainingSpec:
    """The CPU spec the trace runs: bf16 weights, SDPA, one sequence of ``seq`` tokens."""
    return TrainingSpec(
        model=inventory(cfg, model_id),
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.NO),
        optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(micro_batch=1, seq_len=seq, grad_accum=1),
        activations=ActivationSpec(checkpointing=False, attn_implementation=AttnImpl.SDPA),
        hardware=HardwareSpec(device_type=DeviceType.CPU),
        lora=lora,
    )


def device_bytes(components: tuple[Component, ...], phase: Phase, states: bool = True) -> int:
    """Device bytes of a report's components at one phase (``states=False``: without the model states,
    which both estimates share: what is left is activations, logits and temporaries)."""
    return sum(c.at(phase) for c in components
               if c.location is Location.DEVICE and (states or c.category not in _STATES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=["full", "lora"])
    args = parser.parse_args()
    from fitcheck.catalog import find_catalog_config
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import components_from_trace, trace_step

    print("| model | layers | method | seq | phase | formula MiB | trace MiB | error | activations: formula MiB "
          "| trace MiB | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model_id in args.models:
        found = find_catalog_config(model_id)
        assert found is not None, model_id
        cfg = reduced(found[0], args.layers)
        for method in args.methods:
            lora = LORA if method == "lora" else None
            for seq in args.seqs:
                spec = cpu_spec(cfg, model_id, seq, lora)
                formula = estimate(spec).components
                traced = estimate(spec, activations=components_from_trace(
                    trace_step(cfg, seq_len=seq, micro_batch=1, dtype="bfloat16", lora=lora))).components
                for phase in PHASES:
                    f, t = device_bytes(formula, phase), device_bytes(traced, phase)
                    fa, ta = device_bytes(formula, phase, False), device_bytes(traced, phase, False)
                    print(f"| {model_id} | {args.layers} | {method} | {seq} | {phase.value} | {f / 2**20:,.1f} | "
                          f"{t / 2**20:,.1f} | {(f - t) / t:+.2%} | {fa / 2**20:,.1f} | {ta / 2**20:,.1f} | "
                          f"{(fa - ta) / ta:+.2%} |", flush=True)


if __name__ == "__main__":
    main()
