"""PEFT adapters other than LoRA: fitcheck's default path against a real CPU step, per ``peft_type``.

For every type of ``readers.peft_config.TRACED_PEFT_TYPES`` (the one list), with the ``peft_config`` of its first
peft MetaMathQA row in ``benchmarks/calibration/published_measurements.json`` (the configs the published runs used),
on a transformers 5.23 Llama of h=256, I=688, 2 layers, vocabulary 2000, bf16 weights, seq 64, micro-batch 2,
``adamw_torch``, two steps:

* real: ``tracer.trace_step(fake=False)``: the model built with peft 0.21.2 ``get_peft_model`` and run for real on
  the CPU, live tensor bytes recorded per phase of the second step;
* trace: the same step on fake tensors (``fake=True``), what the default path traces;
* estimate: ``PinnedPath("always")`` on a CPU spec: the model states from the adapter's tensors as peft built them
  (``torch_adapters.peft_adapters.with_adapter_inventory``) plus the traced activations, per phase
  (``Report.phase_totals``: on CPU the live tensors, no allocator);
* trainable: ``requires_grad`` elements of the real model against ``Report.trainable_params``.

A type is supported when trace and estimate are within 2 % of the real step at every phase and the trainable counts
are equal. The table is written to ``benchmarks/data/peft_adapters_cpu.json``.

Run: ``python benchmarks/peft_adapters_cpu.py [--types IA3 LOHA ...]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "data" / "peft_adapters_cpu.json"
ROWS = ROOT / "benchmarks" / "calibration" / "published_measurements.json"
TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2000,
    "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
SEQ, BATCH = 64, 2
TOLERANCE = 0.02


def row_configs() -> dict[str, tuple[str, dict[str, Any]]]:
    """peft_type -> (row id, its peft_config): the first peft MetaMathQA row of each type."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for row in json.loads(ROWS.read_text()):
        cfg = row.get("peft_config")
        if str(row.get("id", "")).startswith("MMQA") and cfg and cfg.get("peft_type") != "LORA":
            out.setdefault(str(cfg["peft_type"]), (str(row["id"]), dict(cfg)))
    return out


def adapter_spec(config: dict[str, Any]) -> Any:
    """The spec fitcheck's reader makes of a ``peft_config`` (``readers.peft_config.adapter_from_mapping``)."""
    from fitcheck.readers import adapter_from_mapping

    return adapter_from_mapping(config, source="adapter_config.json")


def measure(peft_type: str, config: dict[str, Any]) -> dict[str, Any]:
    """Real step, trace and estimate of one adapter, per phase."""
    import dataclasses

    from tiny_models import spec_from_config  # type: ignore[import-not-found]  # tests/ on sys.path (above)

    from fitcheck.report import Phase
    from fitcheck.torch_adapters import PinnedPath, trace_step

    adapter = adapter_spec(config)
    kwargs: dict[str, Any] = {"seq_len": SEQ, "micro_batch": BATCH, "dtype": "bfloat16", "optimizer": "adamw_torch",
                              "adapter": adapter}
    t0 = time.perf_counter()
    real = trace_step(TINY, fake=False, **kwargs)
    t1 = time.perf_counter()
    fake = trace_step(TINY, fake=True, **kwargs)
    t2 = time.perf_counter()
    spec = dataclasses.replace(spec_from_config(TINY, seq=SEQ, batch=BATCH), peft=adapter)
    report = PinnedPath("always", cache=None)(spec)
    totals = report.phase_totals()
    phases: dict[str, Any] = {}
    for phase in real.phases:
        r = real.phases[phase].total
        phases[phase.value] = {"real": r, "trace": fake.phases[phase].total, "estimate": totals.get(phase, 0),
                               "trace_error": fake.phases[phase].total / r - 1,
                               "estimate_error": totals.get(phase, 0) / r - 1}
    return {"peft_type": peft_type, "phases": phases, "real_trainable": real_trainable(config),
            "estimate_trainable": report.trainable_params, "pinned": report.pinned,
            "seconds": {"real": round(t1 - t0, 2), "trace": round(t2 - t1, 2)},
            "peak_phase": Phase(report.peak_phase).value}


def real_trainable(config: dict[str, Any]) -> int:
    """``requires_grad`` elements of the real peft model (peft's own ``get_nb_trainable_parameters``)."""
    import torch

    from fitcheck.torch_adapters import build_model, wrap_adapter

    torch.manual_seed(0)
    model = wrap_adapter(build_model(TINY, dtype=torch.bfloat16, attn_implementation="sdpa", checkpointing=False,
                                     fake=False), adapter_spec(config))
    return int(model.get_nb_trainable_parameters()[0])


def main() -> int:
    """Measure every supported type, print the table, write the data file; 1 when a type misses 2 %."""
    from fitcheck.readers import TRACED_PEFT_TYPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", nargs="*", default=list(TRACED_PEFT_TYPES))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    configs = row_configs()
    results: list[dict[str, Any]] = []
    bad = 0
    print(f"{'peft_type':15s} {'row':40s} {'phase':18s} {'real':>10s} {'trace':>8s} {'estimate':>8s} trainable")
    for peft_type in args.types:
        row, config = configs[peft_type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                res = measure(peft_type, config)
            except Exception as exc:  # a type that cannot be built here is reported, not hidden
                print(f"{peft_type:15s} {row:40s} FAILED {type(exc).__name__}: {exc}")
                results.append({"peft_type": peft_type, "row": row, "failed": f"{type(exc).__name__}: {exc}"})
                bad += 1
                continue
        res["row"] = row
        results.append(res)
        for phase, p in res["phases"].items():
            ok = abs(p["trace_error"]) <= TOLERANCE and abs(p["estimate_error"]) <= TOLERANCE
            bad += not ok
            print(f"{peft_type:15s} {row:40s} {phase:18s} {p['real']:>10,d} {p['trace_error']:+8.2%} "
                  f"{p['estimate_error']:+8.2%} {res['real_trainable']:,}/{res['estimate_trainable']:,}"
                  f"{'' if ok else '  MISS'}")
        bad += res["real_trainable"] != res["estimate_trainable"]
    if not args.no_write:
        OUT.write_text(json.dumps({"model": TINY, "seq_len": SEQ, "micro_batch": BATCH, "optimizer": "adamw_torch",
                                   "tolerance": TOLERANCE, "results": results}, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
