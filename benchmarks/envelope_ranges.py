"""Each kind of run of the envelope checked over a range of shapes: sequences, micro-batches, widths.

For a kind (family, method, checkpointing, attention, precision; the LoRA recipe of the grid: TRL's defaults, r 16,
alpha 32, dropout 0.05, every linear layer) this runs the formulas against fake-tensor traces of the real model
at 3 sequence lengths up to the longest the model allows (at least 32k where it does), micro-batch 1 and 8, and
the family's two catalog widths (``WIDTHS``), and measures the error per phase on the activation, logits and
temporary bytes (``differential.phase_errors``), not on device totals. The traces at one (width, sequence) are
shared by both micro-batches' formulas (``trace_batch.BatchTraces``).

Writes ``fitcheck/catalog/envelope_ranges.json`` (package data the envelope reads): kind -> the shapes checked
(width, sequence, micro-batch), the worst signed error per phase, whether every shape was within 2 %, and
(``errors``) each shape's error per phase in % (end of forward, start of backward, during backward). A kind is
pinned only inside the range of shapes it was checked at, and only when it was within 2 % at all of them
(``fitcheck.core.activations.envelope.in_envelope``).

The full grid is hours on a 2-core machine; ``--sample N`` runs N kinds (the most used first: LoRA/QLoRA/DoRA/full
with checkpointing, SDPA, 16-bit), and each run merges into the file, so it grows over runs.

``--device cuda`` checks the kinds on CUDA specs instead (the formulas' CUDA branch against the CUDA-emulating
trace, ``fitcheck/torch_adapters/cuda_emulation.py``) and writes their rows as ``label@cuda``: a CUDA answer of a kind
with such a row is pinned by it (``fitcheck.core.activations.envelope.in_envelope``).

Run: ``python benchmarks/envelope_ranges.py [--sample N] [--families a,b] [--methods a,b] [--attn sdpa,eager]
[--ckpt ckpt,nockpt] [--precisions a,b] [--kinds label,label] [--redo] [--budget S] [--device cpu|cuda]
[--targets q,v]`` (``--kinds`` runs those labels again, in the file or not; ``--targets q,v`` checks peft's default
targets, q_proj and v_proj, and writes ``label+qv`` rows: ``envelope_range.recipe_suffix``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from fitcheck.report import Phase
from fitcheck.spec import DeviceType, HardwareSpec
from fitcheck.torch_adapters import PHASES, Cell, cell_spec, phase_errors

TOLERANCE = 0.02
OUT = Path(__file__).parents[1] / "fitcheck" / "catalog" / "envelope_ranges.json"
# two real widths per family (catalog models), the first the formula_vs_trace grid's model where it allows 32k
WIDTHS: dict[str, tuple[str, ...]] = {
    "llama": ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"),
    "mistral": ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-Small-24B-Instruct-2501"),
    "qwen2": ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-72B"),
    "qwen3": ("Qwen/Qwen3-8B", "Qwen/Qwen3-32B"),
    "gemma": ("google/gemma-7b", "google/gemma-2b"),
    "gemma2": ("google/gemma-2-9b", "google/gemma-2-27b"),
    "phi3": ("microsoft/Phi-3-mini-4k-instruct", "microsoft/phi-4"),
    "gpt2": ("openai-community/gpt2-large", "openai-community/gpt2-xl"),
    "phi": ("microsoft/phi-2",),
    "falcon": ("tiiuae/falcon-7b",),
    "bloom": ("bigscience/bloomz-7b1",),
    "olmo2": ("allenai/OLMo-2-1124-7B",),
    "granite": ("ibm-granite/granite-3.3-8b-instruct",),
}
BATCHES = (1, 8)
PRIORITY_METHODS = ("lora", "qlora", "full", "dora", "qlora_noprep", "freeze")
PRIORITY_PRECISIONS = ("bf16", "bf16amp", "autocast", "fp32")


def sequences(config: dict[str, Any]) -> tuple[int, ...]:
    """3 sequence lengths up to the longest the model allows (32k when it allows that much).

    A Mistral-style sliding window (``sliding_window`` on a family that bands every layer's mask, not switched
    off by ``use_sliding_window``) is checked
    below the window only: from the window on the estimate says it is not modelled and is never pinned
    (``core/activations/recipe_gaps.py`` ``sliding_window_findings``)."""
    longest = int(config.get("max_position_embeddings") or config.get("n_positions") or 2048)
    top = min(longest, 32768)
    window = config.get("sliding_window")
    banded = config.get("model_type") in ("mistral", "mixtral", "phi3", "qwen2", "qwen2_moe", "qwen3_moe")
    if banded and isinstance(window, int) and config.get("use_sliding_window", True) is not False:
        top = min(top, window - 1)
        return (512, max(1024, top // 4), top)
    return (512, max(1024, top // 8), top)


def kinds(families: tuple[str, ...], methods: tuple[str, ...]) -> list[tuple[str, str, bool, str, str]]:
    """Kinds in the order they are checked (the most used recipes first)."""
    out = []
    for ckpt, attn in ((True, "sdpa"), (False, "sdpa"), (True, "eager"), (False, "eager")):
        for precision in PRIORITY_PRECISIONS:
            for method in methods:
                if precision == "bf16amp" and method not in ("lora", "dora"):
                    continue
                for family in families:
                    out.append((family, method, ckpt, attn, precision))
    return out


def check_kind(kind: tuple[str, str, bool, str, str], device: str = "cpu",
               targets: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every shape of one kind (on ``device`` specs; ``targets``: these LoRA targets instead of every linear
    layer): the worst signed error per phase and the shapes checked."""
    from fitcheck.catalog import find_catalog_config
    from fitcheck.torch_adapters import BatchTraces, activation_trace_kwargs, components_from_trace

    family, method, ckpt, attn, precision = kind
    worst = {p: 0.0 for p in PHASES}
    shapes: list[list[Any]] = []
    per_shape: list[list[Any]] = []
    refused = ""
    for model in WIDTHS[family]:
        found = find_catalog_config(model)
        if found is None:
            continue
        config = dict(found[0])
        for seq in sequences(config):
            traces = None
            for batch in BATCHES:
                cell = Cell(family, method, ckpt, attn, precision, seq, batch)
                try:
                    spec = cell_spec(cell, config)
                    if targets and spec.lora is not None:  # peft's default targets (envelope_range.QV_RECIPE)
                        spec = dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, target_modules=targets))
                    if device == "cuda":  # the formulas' CUDA branch, the trace emulating CUDA (trace_kwargs)
                        spec = dataclasses.replace(spec, hardware=HardwareSpec(device_type=DeviceType.CUDA))
                    if traces is None:
                        traces = BatchTraces(spec.model.config, activation_trace_kwargs(spec), skip_first=True)
                    errs = phase_errors(spec, components_from_trace(traces.result(batch)))
                except Exception as exc:  # a refusal is recorded, the grid goes on
                    refused = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
                    continue
                width = int(config.get("hidden_size") or config.get("n_embd") or 0)
                shapes.append([width, seq, batch])
                per_shape.append([width, seq, batch, *(round(errs[p] * 100, 2) for p in PHASES)])
                for p, e in errs.items():
                    if abs(e) > abs(worst[p]):
                        worst[p] = e
    within = bool(shapes) and not refused and all(abs(e) <= TOLERANCE for e in worst.values())
    return {"shapes": shapes, "worst": {p.value: round(e * 100, 2) for p, e in worst.items()},
            "within": within, "refused": refused, "errors": per_shape}


def label(kind: tuple[str, str, bool, str, str]) -> str:
    """``family/method/ckpt|nockpt/attn/precision``."""
    family, method, ckpt, attn, precision = kind
    return f"{family}/{method}/{'ckpt' if ckpt else 'nockpt'}/{attn}/{precision}"


def _parse(text: str) -> tuple[str, str, bool, str, str]:
    """A kind from its label (``family/method/ckpt|nockpt/attn/precision``); exits 2 on a malformed one."""
    parts = text.split("/")
    if len(parts) != 5 or parts[0] not in WIDTHS or parts[2] not in ("ckpt", "nockpt"):
        raise SystemExit(f"--kinds: {text!r} is not family/method/ckpt|nockpt/attn/precision with a family of "
                         f"WIDTHS ({', '.join(WIDTHS)})")
    return (parts[0], parts[1], parts[2] == "ckpt", parts[3], parts[4])


def main(argv: list[str]) -> int:
    """Run the sampled kinds, print one line each, merge into the data file."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=0, help="kinds to run (0: all)")
    ap.add_argument("--families", default=",".join(WIDTHS))
    ap.add_argument("--methods", default=",".join(PRIORITY_METHODS))
    ap.add_argument("--budget", type=float, default=0.0, help="stop after this many seconds")
    ap.add_argument("--redo", action="store_true", help="run kinds already in the file again")
    ap.add_argument("--attn", default="sdpa,eager", help="attention implementations to run")
    ap.add_argument("--ckpt", default="ckpt,nockpt", help="checkpointing on (ckpt) and/or off (nockpt)")
    ap.add_argument("--precisions", default=",".join(PRIORITY_PRECISIONS))
    ap.add_argument("--out", default=str(OUT), help="data file to merge into (default: the package's)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="check on CUDA specs against the CUDA-emulating trace (rows labelled label@cuda)")
    ap.add_argument("--targets", choices=("", "q,v"), default="",
                    help="q,v: peft's default LoRA targets (q_proj, v_proj) instead of every linear layer (rows "
                    "labelled label+qv)")
    ap.add_argument("--kinds", default="", help="exact labels to run (family/method/ckpt/attn/precision, comma "
                    "separated); overrides the filters above")
    ns = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    out = Path(ns.out)
    # envelope_range.RECIPE_SUFFIXES, CUDA_SUFFIX
    suffix = ("+qv" if ns.targets else "") + ("@cuda" if ns.device == "cuda" else "")
    targets = ("q_proj", "v_proj") if ns.targets else ()
    if targets:  # a recipe of adapters: the methods without them have no such rows
        ns.methods = ",".join(m for m in ns.methods.split(",") if m not in ("full", "freeze"))
    data: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if ns.kinds:  # exactly these labels, in this order (any method the grid has: int8 too)
        todo = [_parse(x) for x in ns.kinds.split(",") if x]
    else:
        todo = [k for k in kinds(tuple(ns.families.split(",")), tuple(ns.methods.split(",")))
                if k[3] in ns.attn.split(",") and ("ckpt" if k[2] else "nockpt") in ns.ckpt.split(",")
                and k[4] in ns.precisions.split(",") and (ns.redo or label(k) + suffix not in data)]
    if ns.sample:
        todo = todo[: ns.sample]
    start = time.perf_counter()
    for kind in todo:
        if ns.budget and time.perf_counter() - start > ns.budget:
            break
        t = time.perf_counter()
        row = check_kind(kind, ns.device, targets)
        row["seconds"] = round(time.perf_counter() - t, 1)
        data[label(kind) + suffix] = row
        out.write_text(json.dumps(data, indent=1, sort_keys=True))
        phases = " ".join(f"{v:+6.2f}%" for v in row["worst"].values())
        print(f"{label(kind) + suffix:47} {'in ' if row['within'] else 'OUT'} {phases}  {len(row['shapes'])} shapes "
              f"{row['seconds']:.0f} s {row['refused']}", flush=True)
    ok = sum(1 for r in data.values() if r["within"])
    print(f"\n{ok} of {len(data)} kinds within {TOLERANCE:.0%} over their ranges ({out.name}); phases: "
          f"{', '.join(p.value for p in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
