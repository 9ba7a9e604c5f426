"""LLM.int8 on CUDA: the measured ``gpu_truth`` int8 rows against the estimate, and the outlier columns that explain
what is left.

bitsandbytes 0.50.2 ``MatMul8bitLt.forward`` (``autograd/_functions.py``) quantizes each 8-bit linear's input with
``int8_vectorwise_quant(A.to(float16), threshold=6.0)``; on CUDA (``backends/cuda/ops.py``) every column holding an
element with ``|x| >= threshold`` is an outlier column. ``int8_mixed_scaled_mm`` (``backends/default/ops.py``, the
kernel CUDA runs too) copies those columns, ``subA = A[:, outlier_cols].contiguous()`` in the input's dtype, and
the Function keeps it in ``ctx.tensors = (CAt, subA, A)`` until the graph dies (an attribute: non-reentrant
checkpointing does not drop it either). It also dequantizes the matching weight columns into a transient
``subB`` (fp32 ``out x cols`` from ``int8_vectorwise_dequant``, after an int8 ``CB[:, cols].contiguous()`` copy).

How many columns that is depends on the values. A trained model has a few systematic outlier features; the
``gpu_truth`` rows run random weights (``from_config``, normal(0, initializer_range)), where the down_proj input
``act(gate) * up`` is a product of two normals of std ``0.02 * sqrt(hidden_size)``: its tails cross 6.0 in
almost every column at 4096 rows for Llama-2-7B's width. fitcheck counts no outlier columns (a trained model's
few; ``core/activations/int8_outliers.py`` gives the bound, every column); this script counts them on the
row's own random model (CPU, fp32, layer by layer, no_grad; same initialisation and random token ids as
``benchmarks/gpu_truth_step.py``) and prints, next to the measurement, the estimate, the estimate plus the kept
``subA`` of those columns, plus the largest ``subB`` transient too (both from ``int8_outlier_bytes``, the formula's
one home), and the estimate plus the bound (``int8_outlier_bound``: every column). The measurement must lie
between the estimate and the estimate plus the bound (``tests/test_int8_outliers.py``).

Run: ``PYTHONPATH=. python benchmarks/int8_cuda_outliers.py [--data benchmarks/data/gpu_truth_nvidia_h200.json]
[--rows NAME ...] [--out benchmarks/data/int8_cuda_outliers.json]`` (about 6 minutes on 2 CPU cores; 8 GB RAM);
``--counts benchmarks/data/int8_cuda_outliers.json`` reuses the recorded columns (seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_truth

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 6.0  # BitsAndBytesConfig.llm_int8_threshold default (transformers 5.23 utils/quantization_config.py)
MIB = 2**20
_SEEN: dict[str, dict[str, list[int]]] = {}


def outlier_columns(config: Mapping[str, Any], dtype: str, batch: int, seq: int) -> dict[str, list[int]]:
    """Outlier columns of every 8-bit linear's input, per layer (``name -> [cols per layer]``), and the widths.

    The random model of the row (transformers ``from_config`` in ``dtype``, seed 0), run in fp32 on CPU layer by
    layer without autograd: k-bit preparation makes the residual stream and norms fp32, and LoRA's B starts at
    zero, so the values the 8-bit layers see are those of the plain model up to 16-bit rounding.
    """
    import torch

    from fitcheck.torch_adapters import hf_config, model_class

    torch.manual_seed(0)  # benchmarks/gpu_truth_step.py: the same seed, class and config
    cfg = hf_config(config, "sdpa")
    model = model_class(config)._from_config(cfg, dtype=getattr(torch, dtype))
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    counts: dict[str, list[int]] = {}

    def hook(name: str) -> Any:
        def count(_mod: Any, args: tuple[Any, ...]) -> None:
            a = args[0].reshape(-1, args[0].shape[-1]).to(torch.float16)  # MatMul8bitLt: A.to(float16)
            counts.setdefault(name, []).append(int((a.abs() >= THRESHOLD).any(dim=0).sum()))
        return count

    with torch.no_grad():
        hidden = model.model.embed_tokens(ids).float()
        pos = torch.arange(seq).unsqueeze(0).expand(batch, -1)
        model.model.rotary_emb.float()
        emb = model.model.rotary_emb(hidden, pos)
        for layer in model.model.layers:
            layer.float()
            handles = [m.register_forward_pre_hook(hook(n)) for n, m in layer.named_modules()
                       if isinstance(m, torch.nn.Linear)]
            out = layer(hidden, attention_mask=None, position_ids=pos, position_embeddings=emb)
            hidden = out[0] if isinstance(out, tuple) else out
            for h in handles:
                h.remove()
            layer.to(getattr(torch, dtype))
    return counts


def row_report(r: Mapping[str, Any], counts: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """Counts, estimate, the outlier bytes for those counts and for every column, and the measured bytes of one int8
    row of a ``gpu_truth`` data file (``counts``: reuse the columns an earlier ``--out`` file recorded)."""
    from fitcheck.cli import spec_from_values
    from fitcheck.core import estimate
    from fitcheck.core.activations import int8_outlier_bound, int8_outlier_bytes

    row = next(x for x in gpu_truth.ROWS if x.name == r["name"])
    with tempfile.TemporaryDirectory(prefix="int8_outliers_") as tmp:
        values = gpu_truth.rescore_values(row, r.get("environment") or {}, tmp)
        spec, _ = spec_from_values(values, {})
    est = estimate(spec).peak_allocated_bytes
    config = gpu_truth.row_config(row, "cuda")
    dtype = str(values.get("dtype") or "float32")
    start = time.time()
    if counts is None:
        key = json.dumps([config, dtype, row.batch, row.seq], sort_keys=True)
        if key not in _SEEN:  # the checkpointed and plain rows run the same model and tokens
            _SEEN[key] = outlier_columns(config, dtype, row.batch, row.seq)
        counts = _SEEN[key]
    got = int8_outlier_bytes(spec, counts)  # fitcheck's one home for subA / subB (core/activations/int8_outliers.py)
    bound = int8_outlier_bound(spec)
    return {"name": r["name"], "measured": r["measured"]["max_allocated"], "estimate": est, "sub_a": got.kept,
            "sub_b_transient": got.transient, "bound_kept": bound.kept, "bound_transient": bound.transient,
            "outlier_columns": dict(counts), "seconds": round(time.time() - start, 1)}


def main(argv: Sequence[str]) -> int:
    """Print the table (and write ``--out``); exit 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "benchmarks" / "data" / "gpu_truth_nvidia_h200.json"))
    ap.add_argument("--rows", nargs="+", default=[], help="only rows whose name contains one of these")
    ap.add_argument("--counts", default=None, help="reuse the outlier columns of an earlier --out file (no model run)")
    ap.add_argument("--out", default=None, help="write the counts and the table here (JSON)")
    args = ap.parse_args(argv)
    doc = json.loads(Path(args.data).read_text(encoding="utf-8"))
    rows = [r for r in doc["rows"] if "int8" in r["name"] and r.get("status") == "ok"
            and (not args.rows or any(s in r["name"] for s in args.rows))]
    stored = {} if args.counts is None else {
        x["name"]: x["outlier_columns"] for x in json.loads(Path(args.counts).read_text(encoding="utf-8"))["rows"]}
    print(f"{'row':40} {'measured':>9} {'estimate':>9} {'err':>8} {'subA':>7} {'est+subA':>8} {'subB':>6} "
          f"{'+subB':>7} {'bound':>6} {'est+bound':>9}  MiB")
    out = []
    for r in rows:
        rep = row_report(r, stored.get(r["name"]) if args.counts else None)
        out.append(rep)
        m, e, a, t = rep["measured"], rep["estimate"], rep["sub_a"], rep["sub_b_transient"]
        bound = rep["bound_kept"] + rep["bound_transient"]

        def err(x: int, m: int = m) -> str:
            return f"{(x / m - 1) * 100:+7.2f}%"

        print(f"{rep['name'][:40]:40} {m / MIB:9.1f} {e / MIB:9.1f} {err(e)} {a / MIB:7.1f} {err(e + a)} "
              f"{t / MIB:6.1f} {err(e + a + t)} {bound / MIB:6.0f} {err(e + bound)}", flush=True)
    if args.out:
        data = Path(args.data).resolve()
        name = str(data.relative_to(ROOT)) if data.is_relative_to(ROOT) else str(data)
        Path(args.out).write_text(json.dumps({"data": name, "threshold": THRESHOLD, "rows": out}, indent=1)
                                  + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
