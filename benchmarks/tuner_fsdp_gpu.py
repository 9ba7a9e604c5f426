"""``tune_micro_batch`` on a real FSDP2 ``transformers.Trainer`` on one CUDA GPU, and the weights it trains to.

Two runs, each its own ``torch.distributed.run --nproc_per_node 1`` process (NCCL, accelerate FSDP2, bf16):

* ``tuned``: per-GPU batch ``PER_GPU`` × 1 at ``SEQ`` tokens; ``tune_micro_batch`` picks the micro-batch by real
  trial steps (:mod:`fitcheck.integrations.tuner_fsdp`; sizes above the GPU's memory raise a real CUDA OOM
  inside FSDP2's step, which the search must survive), then ``train()`` runs ``STEPS`` optimizer steps;
* ``plain``: the same Trainer set directly to the size ``tuned`` found, ``train()`` for ``STEPS`` steps.

Same seed, same data. The tuner keeps its promise when both end with identical weights (a SHA-256 of every
parameter's full tensor) and ``tuned``'s trials are recorded next to fitcheck's prediction.

``PYTHONPATH=. python benchmarks/tuner_fsdp_gpu.py --out DIR`` (GPU only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
PREFIX = "TUNER_FSDP_RESULT "
MODEL, LAYERS, PER_GPU, SEQ, STEPS = "meta-llama/Llama-3.2-1B", 4, 32, 2048, 2


def _weights_sha(model: Any) -> str:
    from torch.distributed.tensor import DTensor

    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(name.encode())
        h.update(full.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def worker(mode: str, micro: int) -> dict[str, Any]:
    """One run (``tuned`` or ``plain`` at ``micro``) in this ``torch.distributed.run`` process."""
    out: dict[str, Any] = {"mode": mode, "model": MODEL, "layers": LAYERS, "per_gpu": PER_GPU, "seq": SEQ,
                           "status": "ok"}
    started = time.perf_counter()
    try:
        import torch
        import transformers
        from fsdp_gpu import build_on_cpu

        from fitcheck.catalog import find_catalog_config
        from fitcheck.torch_adapters import reduced_config

        found = find_catalog_config(MODEL)
        assert found is not None
        config = reduced_config(found[0], LAYERS)
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, int(config["vocab_size"]), (PER_GPU * STEPS * 2, SEQ), generator=gen)
        data = [{"input_ids": r, "labels": r} for r in ids]
        model = build_on_cpu(config, torch.bfloat16)
        model.config.use_cache = False
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Path(tmp) / "fsdp.json"
            cfg.write_text(json.dumps({"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}))
            args = transformers.TrainingArguments(
                output_dir=str(Path(tmp) / "o"), per_device_train_batch_size=PER_GPU if mode == "tuned" else micro,
                gradient_accumulation_steps=1 if mode == "tuned" else PER_GPU // micro, max_steps=STEPS, bf16=True,
                fsdp="full_shard auto_wrap", fsdp_config=str(cfg), optim="adamw_torch_fused", save_strategy="no",
                report_to="none", logging_steps=1000, seed=0, data_seed=0)
            trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
            out["fsdp_enabled"] = bool(trainer.is_fsdp_enabled)
            if mode == "tuned":
                from fitcheck.integrations import tune_micro_batch

                t0 = time.perf_counter()
                result = tune_micro_batch(trainer, max_seq_length=SEQ)
                out["tune_seconds"] = round(time.perf_counter() - t0, 1)
                out["tuned"] = {"micro_batch": result.micro_batch, "grad_accum": result.grad_accum,
                                "predicted_micro_batch": result.predicted_micro_batch,
                                "predicted_peak_bytes": result.predicted_peak_bytes,
                                "peak_source": result.peak_source,
                                "trials": [{"micro": t.micro_batch, "accum": t.grad_accum, "fits": t.fits,
                                            "peak_bytes": t.peak_bytes, "error": t.error} for t in result.trials]}
                out["allocated_after_tuning"] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            trainer.train()
            out["train_max_allocated"] = torch.cuda.max_memory_allocated()
            out["batch_trained"] = [args.per_device_train_batch_size, args.gradient_accumulation_steps]
            out["weights_sha256"] = _weights_sha(trainer.model)
    except Exception as exc:
        out.update(status="error", error=f"{type(exc).__name__}: {exc}"[:800], traceback=traceback.format_exc()[-4000:])
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def _launch(mode: str, micro: int, timeout: float) -> dict[str, Any]:
    from fsdp_gpu import run_worker

    return run_worker(str(Path(__file__).resolve()), [mode, "--micro", str(micro)], PREFIX, timeout, {"mode": mode})


def main(argv: list[str]) -> int:
    """Run ``tuned`` then ``plain`` at the tuned size; print and write ``tuner_fsdp_gpu.json``."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--worker", default=None)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "data"))
    ap.add_argument("--timeout_s", type=float, default=200.0)
    args = ap.parse_args(argv)
    if args.worker:
        print(PREFIX + json.dumps(worker(args.worker, args.micro)), flush=True)
        return 0
    tuned = _launch("tuned", 0, args.timeout_s)
    rows = [tuned]
    micro = (tuned.get("tuned") or {}).get("micro_batch")
    if micro:
        rows.append(_launch("plain", int(micro), args.timeout_s))
    same = len(rows) == 2 and rows[0].get("weights_sha256") is not None and \
        rows[0].get("weights_sha256") == rows[1].get("weights_sha256")
    doc = {"schema": 1, "command": ["benchmarks/tuner_fsdp_gpu.py", *argv], "same_weights": same, "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "tuner_fsdp_gpu.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if k != "traceback"})[:3000])
        if r.get("traceback"):
            print(r["traceback"])
    print(f"same weights after tuning: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
