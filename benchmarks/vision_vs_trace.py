"""Vision-language activations: the formula (core/activations/vision.py) vs a fake-tensor trace fed images.

Qwen2.5-VL-7B at its real widths (catalog config.json), the vision tower at full depth (32 blocks, window and
full attention as configured), ``--text_layers`` language-model layers (default 2, so the vision tower is a
visible share of the step), bf16, SDPA, one image per sample of ``--image_tokens`` patches (the tracer feeds
``pixel_values``, ``image_grid_thw`` and the placeholders: ``fitcheck.torch_adapters.trace_inputs_vlm``).

Rows: full fine-tuning (tower trained), LoRA r=16 ``all-linear`` (adapters on the tower: trained), LoRA on the
text attention only (``q_proj,k_proj,v_proj,o_proj``: the tower frozen), each with and without gradient
checkpointing, at two image sizes. Error = worst over end of forward / start of backward / during backward of
(formula − trace) / trace on the device total, and the same for the vision share alone (the formula's
``activations.vision`` vs the trace with images minus the trace of the same step with text-only tokens).

    python benchmarks/vision_vs_trace.py [--image_tokens 1024 4096] [--seq 2048] [--text_layers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from fitcheck.report import Phase
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

CONFIG = Path(__file__).resolve().parent.parent / "fitcheck/catalog/models/Qwen/Qwen2.5-VL-7B-Instruct/config.json"
PHASES = (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD)
METHODS = {
    "full": None,
    "lora-all-linear": LoraSpec(r=16, alpha=32, target_modules=("all-linear",)),
    "lora-text-attn": LoraSpec(r=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")),
}


def vlm_spec(method: str, ckpt: bool, image_tokens: int, seq: int, text_layers: int) -> TrainingSpec:
    """A CPU spec of Qwen2.5-VL-7B with ``text_layers`` language-model layers and the full vision tower."""
    from fitcheck.readers import with_task
    from fitcheck.torch_adapters import meta_inventory

    cfg: dict[str, Any] = json.loads(CONFIG.read_text())
    cfg["num_hidden_layers"] = text_layers
    inv = with_task(meta_inventory(cfg, "Qwen/Qwen2.5-VL-7B-Instruct", "catalog", "image-text-to-text"),
                    "image-text-to-text", 0)
    inv = dataclasses.replace(inv, shape=dataclasses.replace(inv.shape, image_tokens=image_tokens))
    return TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.NO),
        optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(micro_batch=1, seq_len=seq),
        activations=ActivationSpec(checkpointing=ckpt, attn_implementation=AttnImpl.SDPA),
        hardware=HardwareSpec(device_type=DeviceType.CPU),
        lora=METHODS[method],
    )


def _device(report: Any, phase: Phase, names: tuple[str, ...] | None = None) -> int:
    return sum(c.at(phase) for c in report.components
               if c.location.value == "device" and (names is None or c.name in names))


def row(method: str, ckpt: bool, image_tokens: int, seq: int, text_layers: int) -> dict[str, Any]:
    """Formula vs trace of one run (totals and the vision share)."""
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import trace_components

    spec = vlm_spec(method, ckpt, image_tokens, seq, text_layers)
    text = vlm_spec(method, ckpt, 0, seq, text_layers)
    t0 = time.perf_counter()
    formula = estimate(spec)
    traced = estimate(spec, activations=trace_components(spec))
    traced_text = estimate(text, activations=trace_components(text))
    seconds = time.perf_counter() - t0
    f = {p: _device(formula, p) for p in PHASES}
    t = {p: _device(traced, p) for p in PHASES}
    fv = {p: _device(formula, p, ("activations.vision",)) for p in PHASES}
    tv = {p: t[p] - _device(traced_text, p) for p in PHASES}
    worst = max(PHASES, key=lambda p: abs(f[p] - t[p]) / max(t[p], 1))
    errors = "/".join(f"{(f[p] - t[p]) / max(t[p], 1):+.2%}" for p in PHASES)
    worst_v = max(PHASES, key=lambda p: abs(fv[p] - tv[p]))
    return {
        "method": method, "ckpt": ckpt, "image_tokens": image_tokens, "seq": seq,
        "formula": f[worst], "trace": t[worst], "error": (f[worst] - t[worst]) / max(t[worst], 1),
        "phase": worst.value, "errors": errors, "vision_formula": fv[worst_v], "vision_trace": tv[worst_v],
        "vision_phase": worst_v.value, "seconds": seconds,
    }


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image_tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--text_layers", type=int, default=2)
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    args = ap.parse_args()
    gib = 1024**3
    print(f"Qwen2.5-VL-7B, {args.text_layers} text layers + 32 vision blocks, bf16, SDPA, 1 x {args.seq} tokens")
    print(f"{'method':16} {'ckpt':5} {'patches':>7} | {'formula':>9} {'trace':>9} {'error':>8} {'phase':18} | "
          f"{'fwd/bwd-start/bwd errors':26} | {'vision f':>9} {'vision t':>9} {'v.error':>8} | {'s':>5}")
    for method in args.methods:
        for ckpt in (False, True):
            for n in args.image_tokens:
                r = row(method, ckpt, n, args.seq, args.text_layers)
                ve = (r["vision_formula"] - r["vision_trace"]) / max(r["vision_trace"], 1)
                print(f"{method:16} {ckpt!s:5} {n:7d} | {r['formula'] / gib:9.3f} {r['trace'] / gib:9.3f} "
                      f"{r['error']:+8.2%} {r['phase']:18} {r['errors']:26} | {r['vision_formula'] / gib:9.3f} "
                      f"{r['vision_trace'] / gib:9.3f} {ve:+8.2%} | {r['seconds']:5.1f}", flush=True)


if __name__ == "__main__":
    main()
