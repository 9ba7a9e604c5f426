"""bitsandbytes <= 0.43.1 keeps every 4-bit linear's input: bound vs measured vs formula vs trace, per recipe.

``MatMul4Bit.forward`` at bitsandbytes 0.41.0-0.43.1 ends ``ctx.tensors = (A, B)`` (PR #1270, 0.43.2: ``(None,
B)``). Per recipe (a transformers 5.23 Llama of h=256, I=688, 2 layers, peft 0.21.2 LoRA, the installed bitsandbytes
0.50.2 ``Linear4bit`` quantized on CPU), in bytes per token per layer, old stack minus modelled stack:

* bound: the warning's bound before this was modelled (``versions.legacy_bnb_kept_inputs``: the distinct inputs);
* measured: a real CPU step (``tracer.trace_step(fake=False)``) with ``MatMul4Bit`` patched to keep A
  (``tracer_quant.matmul4bit_keeps_input``) minus the same step without the patch;
* formula: ``estimate`` with ``--stack bitsandbytes=0.42.0`` minus without (core/activations/bnb_kept_inputs.py);
* trace: the default path's fake-tensor trace of each stack (``tracer_depth.trace_components``).

Each at the end of forward (``fwd``) and at the worst moment during backward (``bwd``).

Measured (2026-11-27, torch 2.13 CPU, seq 64): the real step and the trace agree to the byte on every recipe. At the
end of forward the formula agrees with them to the byte too. During backward it agrees except in three recipes:
q/v + k-bit prep + reentrant checkpointing (2,224 against 2,736), all-linear + fp32 compute without dropout (0
against 1,376: one layer's down_proj input held past its own backward) and all-linear + fp32 compute with dropout
(3,776 against 4,288). Those are under 2 % of the step's device total.

Run: ``python benchmarks/old_bnb_kept_inputs.py [--seq 64]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2000,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}
QV = ("q_proj", "v_proj")
ALL = ("all-linear",)
# name: (targets, dropout, checkpointing none/nonreentrant/reentrant, compute dtype, k-bit preparation, autocast)
RECIPES: dict[str, tuple[tuple[str, ...], float, str, str, bool, str]] = {
    "HF q/v, no prep (s14 test)": (QV, 0.0, "none", "bfloat16", False, "no"),
    "q/v, dropout 0.05, no prep": (QV, 0.05, "none", "bfloat16", False, "no"),
    "q/v, k-bit prep": (QV, 0.0, "none", "bfloat16", True, "no"),
    "all-linear, dropout 0.05, prep": (ALL, 0.05, "none", "bfloat16", True, "no"),
    "all-linear, prep, fp32 compute": (ALL, 0.0, "none", "float32", True, "no"),
    "all-linear, dropout 0.05, prep, fp32 compute": (ALL, 0.05, "none", "float32", True, "no"),
    "q/v, prep, bf16 autocast": (QV, 0.0, "none", "bfloat16", True, "bf16"),
    "q/v, dropout 0.05, prep, non-reentrant ckpt": (QV, 0.05, "nonreentrant", "bfloat16", True, "no"),
    "all-linear, dropout 0.05, prep, non-reentrant ckpt": (ALL, 0.05, "nonreentrant", "bfloat16", True, "no"),
    "q/v, dropout 0.05, prep, reentrant ckpt": (QV, 0.05, "reentrant", "bfloat16", True, "no"),
    "all-linear, no prep, autocast, non-reentrant ckpt": (ALL, 0.0, "nonreentrant", "bfloat16", False, "bf16"),
}


def _specs(recipe: tuple[tuple[str, ...], float, str, str, bool, str], seq: int) -> tuple[Any, Any]:
    from tiny_models import spec_from_config  # type: ignore[import-not-found]  # tests/ on sys.path (above)

    from fitcheck.spec import Dtype, LoraSpec, QuantSpec, StackSpec

    targets, dropout, ckpt, compute, prep, mixed = recipe
    quant = QuantSpec(bits=4, quant_type="nf4", compute_dtype=Dtype(compute), prepare_for_kbit_training=prep)
    lora = LoraSpec(r=8, alpha=16, dropout=dropout, target_modules=targets)
    new = spec_from_config(TINY, seq=seq, mixed=mixed, checkpointing=ckpt != "none", lora=lora, quant=quant)
    if ckpt == "reentrant":
        new = dataclasses.replace(new, activations=dataclasses.replace(new.activations, use_reentrant=True))
    return new, dataclasses.replace(new, stack=StackSpec((("bitsandbytes", "0.42.0"),), "--stack"))


def measure(recipe: tuple[tuple[str, ...], float, str, str, bool, str], seq: int) -> dict[str, tuple[float, float]]:
    """Per source, (end of forward, during backward) bytes per token per layer, old stack minus modelled."""
    from fitcheck.core import estimate
    from fitcheck.core.activations import legacy_bnb_kept_inputs
    from fitcheck.report import Phase
    from fitcheck.torch_adapters import activation_trace_kwargs, trace_components, trace_step

    new, old = _specs(recipe, seq)
    per = seq * int(TINY["num_hidden_layers"])
    phases = (Phase.FORWARD_END, Phase.BACKWARD)

    def device(report: Any, phase: Phase) -> int:
        return sum(c.at(phase) for c in report.components if c.location.value == "device")

    def delta(a: Any, b: Any) -> tuple[float, float]:
        return tuple((device(b, p) - device(a, p)) / per for p in phases)  # type: ignore[return-value]

    real = {}
    for name, spec in (("new", new), ("old", old)):
        run = trace_step(spec.model.config, fake=False, **activation_trace_kwargs(spec))
        real[name] = {p: b.total for p, b in run.phases.items()}
    bound = legacy_bnb_kept_inputs(old) / per
    return {
        "bound": (bound, bound),
        "measured": tuple((real["old"][p] - real["new"][p]) / per for p in phases),  # type: ignore[dict-item]
        "formula": delta(estimate(new), estimate(old)),
        "trace": delta(estimate(new, activations=trace_components(new)),
                       estimate(old, activations=trace_components(old))),
    }


def main() -> None:
    """Print the table (markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    print(f"B/token/layer (mean of {TINY['num_hidden_layers']} layers), seq {args.seq}, h=256, I=688; fwd / bwd")
    print("| recipe | bound | measured (real CPU) | formula | trace |")
    print("|---|---|---|---|---|")
    for name, recipe in RECIPES.items():
        row = measure(recipe, args.seq)
        cells = " | ".join(f"{row[k][0]:,.0f} / {row[k][1]:,.0f}" for k in ("bound", "measured", "formula", "trace"))
        print(f"| {name} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
