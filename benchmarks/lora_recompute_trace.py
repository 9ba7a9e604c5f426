"""LoRA / QLoRA / DoRA with gradient checkpointing: the formula's during-backward bytes against the trace.

For each case (catalog model, method, precision as in ``benchmarks/formula_vs_trace.py``'s cells, micro-batch x
sequence; TRL's LoRA defaults r 16, alpha 32, dropout 0.05 on every linear layer, SDPA, CPU) this prints the
during-backward device bytes of ``fitcheck estimate`` from the formulas and from the fake-tensor trace
(``--trace``: one and two layers traced and extrapolated; ``--full``: every layer traced, minutes at 8 x 4096),
and the formula's error per phase on the activation, logits and temporary bytes (``differential.phase_errors``).
The moment the formula picks is printed too (``fitcheck.core.activations.lora_recompute``).

``--formula-only`` prints the formula's bytes without tracing (to compare another revision's formulas with
traces printed by this one: ``PYTHONPATH=<other checkout> python benchmarks/lora_recompute_trace.py
--formula-only``).

Run: ``python benchmarks/lora_recompute_trace.py [--full] [--formula-only] [--cases llama:lora:bf16:8:4096,...]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from fitcheck.report import Phase
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, phase_errors

MODELS = {"llama": "meta-llama/Llama-3.1-8B", "qwen2": "Qwen/Qwen2.5-7B", "qwen3": "Qwen/Qwen3-8B",
          "mistral": "mistralai/Mistral-7B-v0.1"}
DEFAULT = tuple(f"{fam}:{method}:bf16:{b}:{s}" for fam in ("llama", "qwen2") for method in ("lora", "qlora", "dora")
                for b, s in ((1, 512), (8, 512), (1, 4096), (8, 4096))) + tuple(
    f"llama:lora:{p}:{b}:{s}" for p in ("bf16amp", "fp32", "autocast") for b, s in ((1, 512), (8, 4096)))
GIB = 2**30


def _device(report: object, phase: Phase) -> int:
    return sum(c.at(phase) for c in report.components if c.location.value == "device")  # type: ignore[attr-defined]


def run_case(case: str, full: bool, formula_only: bool) -> str:
    """One line: formula and traced during-backward GiB, the error per phase, the formula's moment."""
    from fitcheck.catalog import find_catalog_config
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import trace_extrapolated, trace_step

    fam, method, precision, b, s = case.split(":")
    found = find_catalog_config(MODELS[fam])
    if found is None:
        return f"{case}: {MODELS[fam]} not in the catalog"
    config = dict(found[0])
    spec = cell_spec(Cell(fam, method, True, "sdpa", precision, int(s), int(b)), config)
    formula = estimate(spec)
    moment = next((c.detail.split("worst at the ")[-1] for c in formula.components
                   if c.name == "activations.saved" and "worst at" in c.detail), "")
    f_bwd = _device(formula, Phase.BACKWARD)
    if formula_only:
        return f"{case:28} formula {f_bwd / GIB:8.3f} GiB  ({moment})"
    t = time.perf_counter()
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    depth = int(config["num_hidden_layers"])
    result = trace_step(config, num_layers=depth, **kw) if full else trace_extrapolated(config, **kw)
    comps = components_from_trace(result)
    t_bwd = _device(estimate(spec, activations=comps), Phase.BACKWARD)
    errs = phase_errors(spec, comps)
    per_phase = " ".join(f"{e * 100:+7.2f}%" for e in errs.values())
    rel = (f_bwd - t_bwd) / t_bwd * 100
    return (f"{case:28} formula {f_bwd / GIB:8.3f} trace {t_bwd / GIB:8.3f} GiB ({rel:+6.2f}% of device)"
            f" | activations: {per_phase} | {moment} [{'full' if full else '1+2 layers'}, "
            f"{time.perf_counter() - t:.0f} s]")


def main(argv: list[str]) -> int:
    """Print one line per case."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="trace every layer instead of extrapolating from 1 and 2")
    ap.add_argument("--formula-only", action="store_true", help="no trace: the formula's bytes only")
    ap.add_argument("--cases", default=",".join(DEFAULT), help="family:method:precision:batch:seq,...")
    ns = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    print("phases of the activation errors: " + ", ".join(p.value for p in (Phase.FORWARD_END, Phase.BACKWARD_START,
                                                                             Phase.BACKWARD)))
    for case in ns.cases.split(","):
        print(run_case(case, ns.full, ns.formula_only), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
