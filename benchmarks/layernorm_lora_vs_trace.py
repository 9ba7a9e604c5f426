"""GPT-2 / Phi-2 checkpointed LoRA under CUDA autocast: the formula against fake-tensor traces at the same depth.

``fitcheck estimate --trace`` extrapolates one- and two-layer traces to the full depth (``tracer_depth``); where
layer 0 differs from the others (Phi-2's fp16 weights under bf16 autocast: layer 0 reads the fp16 embedding, the
layers above an fp32 residual stream) that extrapolation is off. This script compares, at 2 and 3 layers of the
catalog config (the rest unchanged), the formula's device bytes besides weights, adapters, optimizer states and
CUDA overheads (activations, gradients, input ids) with a fake-tensor trace of the same depth (``trace_step`` with
``activation_trace_kwargs``: CUDA kernels, TRL's policy step, the LM head left to the formula), per phase.
The moments are ``fitcheck.core.activations.layernorm_recompute``'s.

Run: ``python benchmarks/layernorm_lora_vs_trace.py [--cases gpt2:sft:8:1024,...] [--layers 2,3]``
(case: model:trainer:micro-batch:sequence[:dropout]; ``--formula-only`` skips the traces, e.g. to print another
checkout's formulas: ``PYTHONPATH=<checkout> python benchmarks/layernorm_lora_vs_trace.py --formula-only``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from fitcheck.catalog import find_catalog_config
from fitcheck.core import estimate
from fitcheck.readers import inventory_from_config, spec_from_values
from fitcheck.report import Category, Phase
from fitcheck.spec import TrainingSpec

MODELS = {"gpt2": "openai-community/gpt2", "gpt2-medium": "openai-community/gpt2-medium",
          "phi-2": "microsoft/phi-2"}
LAYER_KEY = {"gpt2": "n_layer", "gpt2-medium": "n_layer", "phi-2": "num_hidden_layers"}
DEFAULT_CASES = ("gpt2:sft:8:1024", "gpt2:sft:1:2048", "gpt2-medium:sft:8:256", "gpt2-medium:sft:1:512:0",
                 "phi-2:kto:4:1024", "phi-2:sft:1:2048", "phi-2:sft:8:256:0")
PHASES = (Phase.BACKWARD_START, Phase.BACKWARD)
BODY = (Category.ACTIVATIONS, Category.TEMPORARIES, Category.GRADIENTS)  # input ids are ACTIVATIONS


def case_spec(case: str, layers: int | None) -> TrainingSpec:
    """The spec of one case, its config cut to ``layers`` (None: the catalog's depth)."""
    model, trainer, b, s, *drop = case.split(":")
    found = find_catalog_config(MODELS[model])
    assert found is not None, model
    cfg: dict[str, Any] = found[0]
    if layers is not None:
        cfg[LAYER_KEY[model]] = layers
    values: dict[str, object] = {
        "trainer": trainer, "use_peft": True, "bf16": True, "gradient_checkpointing": True,
        "per_device_train_batch_size": int(b), "max_seq_length": int(s), "gpu": "H100",
        "lora_target_modules": ["all-linear"], "lora_dropout": float(drop[0]) if drop else 0.05,
    }
    inv = inventory_from_config(cfg, MODELS[model], found[1])
    return spec_from_values(values, inventory=inv)[0]


def formula_body(spec: TrainingSpec) -> dict[Phase, int]:
    """The formula's activation, gradient and input bytes per phase."""
    report = estimate(spec)
    return {ph: sum(c.at(ph) for c in report.components if c.category in BODY) for ph in PHASES}


def traced_body(spec: TrainingSpec) -> dict[Phase, int]:
    """The same bytes from a fake-tensor trace of the spec's step at its depth."""
    from fitcheck.torch_adapters import activation_trace_kwargs, trace_step

    kwargs = activation_trace_kwargs(spec)
    result = trace_step(spec.model.config, num_layers=None, **kwargs)
    out = {}
    for ph in PHASES:
        br = result.phases[ph]
        out[ph] = br.total - br.get("parameters") - br.get("optimizer_state")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--layers", default="2,3")
    ap.add_argument("--formula-only", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    print("case | layers | phase | formula | trace | formula vs trace")
    for case in args.cases.split(","):
        for n in (int(x) for x in args.layers.split(",")):
            spec = case_spec(case, n)
            f = formula_body(spec)
            t = None if args.formula_only else traced_body(spec)
            for ph in PHASES:
                err = "" if t is None else f"{(f[ph] - t[ph]) / t[ph] * 100:+.2f} %"
                print(f"{case} | {n} | {ph.value} | {f[ph]:,} | {'' if t is None else f'{t[ph]:,}'} | {err}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
