"""8-bit (LLM.int8) LoRA: formula vs fake-tensor trace at real widths, and the CUDA estimate beside the CPU one.

For Llama-2-7B (the catalog config.json; traced with 1 and 2 layers and extrapolated to 32, as
``fitcheck.torch_adapters.differential.compare`` does) and each family's representative model, every int8 cell of
the differential grid (checkpointing on/off × SDPA/eager × bf16-loaded / fp32-loaded / bf16 autocast, TRL's
LoRA r=16, dropout 0.05, all-linear, after ``prepare_model_for_kbit_training``) is estimated twice on the same CPU
spec: with the pure formulas (``fitcheck/core/activations/int8.py``) and with a trace of real bitsandbytes
``Linear8bitLt`` layers running ``MatMul8bitFp`` (``fitcheck/torch_adapters/tracer_int8.py``). The last column is
the ``--device_type cuda`` estimate of the same run (``MatMul8bitLt``, from source: not traced).

Run: ``PYTHONPATH=. python benchmarks/int8_vs_trace.py [family ...]``
"""

from __future__ import annotations

import dataclasses
import sys

from fitcheck.catalog import find_catalog_config
from fitcheck.core import estimate
from fitcheck.report import Phase
from fitcheck.spec import DeviceType, HardwareSpec
from fitcheck.torch_adapters import Cell, cell_spec, compare, grid, model_config

LLAMA2 = "meta-llama/Llama-2-7b-hf"


def _cuda_peak(cell: Cell, cfg: dict[str, object]) -> int:
    spec = cell_spec(cell, cfg)
    spec = dataclasses.replace(spec, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    report = estimate(spec)
    return max(sum(c.at(p) for c in report.components if c.location.value == "device")
               for p in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD))


def main(argv: list[str]) -> int:
    """Print the tables; exit 1 when a cell is off by more than 2 %."""
    found = find_catalog_config(LLAMA2)
    if found is None:
        raise SystemExit(f"{LLAMA2} is not in the catalog")
    models: list[tuple[str, str, dict[str, object]]] = [("llama", "Llama-2-7B", dict(found[0]))]
    for family in argv or ["llama", "mistral", "qwen2", "gemma"]:
        models.append((family, family, model_config(family)))
    print(f"{'model / cell':52} {'trace GiB':>9} {'formula':>9} {'error':>8} {'cuda est':>9}")
    worst = 0.0
    for family, name, cfg in models:
        for cell in grid((family,), ("int8",)):
            out = compare(cell, cfg)
            if out.refused:
                print(f"{name + ' ' + cell.label:52} {out.refused}")
                continue
            worst = max(worst, abs(out.error))
            trace = max(out.trace.values())
            formula = max(out.formula.values())
            print(f"{name + ' ' + cell.label:52} {trace / 2**30:9.2f} {formula / 2**30:9.2f} {out.error * 100:+7.2f}%"
                  f" {_cuda_peak(cell, cfg) / 2**30:9.2f}", flush=True)
    print(f"worst |formula - trace| over the phases: {worst * 100:.2f}%")
    return 0 if worst <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
