"""How far the formula's published 11 % reserved gap is from the whole run replayed through the caching allocator.

Where the checked formula answers (``pinned``), ``device_used`` rests on ``core/allocator.py``
``FRAGMENTATION_OF_TRANSIENT`` (reserved = allocated + 11 % of the step's transient bytes). The whole-run replay
(``allocator_whole_run.replay_whole_run``: every layer, the optimizer, three steps, through ``fitcheck.core.caching``)
is within -0.7 .. +0.17 % of ``max_memory_reserved`` on the H100/H200 rows. This benchmark prints, per CUDA config,
the formula's reserved with the published gap next to the same estimate with the replay's gap
(``core.estimate(spec, replayed=replay.measured(...))``: the same activations, only the gap differs, never below the
replay's own reserved where the replay is this run), and the
ratio ``formula / replay`` by regime. Its band [lo, hi] is the published gap's error that
``fitcheck/torch_adapters/verdict_replay.py`` replays inside.

Configs: the fixed runs of ``benchmarks/data/json_identity_configs.json`` that are CUDA, a plain Trainer run
(``pinned_path.plain_trainer_run``), pinned by the formula and without ``--seq_lengths`` (a sample of them per
regime, ``--per-regime``), and the measured rows of the GPU truth files (whose measured reserved is printed too).

    PYTHONPATH=. python benchmarks/formula_gap_vs_replay.py [--per-regime 4] [--no-gpu-rows]
        [--out benchmarks/data/formula_gap_vs_replay.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_truth import ROWS, rescore_values

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "data" / "json_identity_configs.json"
GPU_FILES = ("gpu_truth_nvidia_h100_80gb_hbm3.json", "gpu_truth_nvidia_h200.json")
DEFAULT_OUT = ROOT / "benchmarks" / "data" / "formula_gap_vs_replay.json"
MIB = 2**20
REGIMES = ("full", "LoRA", "QLoRA", "checkpointing", "no checkpointing", "expandable", "max_split_size_mb")


def regimes(spec: Any) -> tuple[str, ...]:
    """The regimes a spec belongs to: its method (full / LoRA / QLoRA), checkpointing, and allocator setting."""
    from fitcheck.core.loading import allocator_conf

    method = "QLoRA" if spec.quant is not None and spec.quant.bits == 4 else "LoRA" if spec.lora else "full"
    conf = allocator_conf(spec)
    out = [method, "checkpointing" if spec.activations.checkpointing else "no checkpointing"]
    if conf.expandable_segments:
        out.append("expandable")
    if conf.max_split_size is not None and conf.max_split_size < 2**62:
        out.append("max_split_size_mb")
    return tuple(out)


def _spec(values: dict[str, object]) -> Any:
    from fitcheck.cli import spec_from_values

    return spec_from_values(values, {})[0]


def _values(argv: Sequence[str]) -> dict[str, object]:
    from fitcheck.cli import add_estimate_arguments, explicit_values

    parser = argparse.ArgumentParser()
    add_estimate_arguments(parser)
    return explicit_values(parser.parse_args([a for a in argv[1:] if a not in ("--json", "--no_trace")]))


def candidates(per_regime: int) -> list[tuple[str, Any]]:
    """(label, spec) of the fixed runs the formula answers pinned on CUDA for a plain Trainer run, ``per_regime``
    of each set of regimes, the first ones in the set's order."""
    from fitcheck.core import estimate
    from fitcheck.errors import FitcheckError
    from fitcheck.spec import DeviceType
    from fitcheck.torch_adapters import plain_trainer_run as plain

    taken: dict[tuple[str, ...], int] = {}
    out = []
    for argv in json.loads(CONFIGS.read_text(encoding="utf-8")):
        if argv[0] != "estimate" or "--seq_lengths" in argv or "--trace" in argv:
            continue
        try:
            spec = _spec(_values(argv))
            if spec.hardware.device_type is DeviceType.CPU or not plain(spec) or not estimate(spec).pinned:
                continue
        except (FitcheckError, SystemExit, ValueError):
            continue
        key = regimes(spec)
        if taken.get(key, 0) >= per_regime:
            continue
        taken[key] = taken.get(key, 0) + 1
        out.append((" ".join(argv[1:]).replace(" --json", "").replace(" --no_trace", ""), spec))
    return out


def score(label: str, spec: Any, cache: dict[str, Any], measured: int | None = None) -> dict[str, Any]:
    """The formula's reserved with the published gap and with the whole run's replayed gap, for one spec."""
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import plain_replay_is_rank_run, replay_whole_run

    formula = estimate(spec)
    t0 = time.perf_counter()
    replay = replay_whole_run(spec, optimizer_traces=cache)
    seconds = time.perf_counter() - t0
    # as verdict_replay.replayed_report takes it: the gap fraction, and the replay's own bytes where it is this run
    replayed = estimate(spec, replayed=replay.measured(plain_replay_is_rank_run(spec)))
    row = {"config": label, "regimes": list(regimes(spec)), "pinned": formula.pinned,
           "formula_reserved": formula.peak_reserved_bytes, "replay_reserved": replayed.peak_reserved_bytes,
           "formula_used": formula.device_used_bytes, "replay_used": replayed.device_used_bytes,
           "budget": formula.budget_bytes, "replay_gap_fraction": round(replay.gap_fraction, 4),
           "ratio": round(formula.peak_reserved_bytes / replayed.peak_reserved_bytes, 4),
           "used_ratio": round(formula.device_used_bytes / replayed.device_used_bytes, 4),
           "fits_formula": formula.fits, "fits_replay": replayed.fits, "replay_seconds": round(seconds, 1)}
    if measured:
        row["measured_reserved"] = measured
        row["formula_vs_measured_pct"] = round(100 * (formula.peak_reserved_bytes / measured - 1), 2)
        row["replay_vs_measured_pct"] = round(100 * (replayed.peak_reserved_bytes / measured - 1), 2)
    return row


def gpu_rows() -> list[tuple[str, dict[str, object], int]]:
    """(name, CLI values, measured max_memory_reserved) of the measured CUDA rows of one length and no DeepSpeed."""
    out = []
    for name in GPU_FILES:
        doc = json.loads((ROOT / "benchmarks" / "data" / name).read_text(encoding="utf-8"))
        for r in doc["rows"]:
            row = next((x for x in ROWS if x.name == r["name"]), None)
            if row is None or r.get("status") != "ok" or not r.get("measured") or row.lengths:
                continue
            env = r.get("environment") or doc.get("environment") or {}
            with tempfile.TemporaryDirectory(prefix="gap_vs_replay_") as tmp:
                values = rescore_values(row, env, tmp)
                values["_config"] = (Path(tmp) / "config.json").read_text(encoding="utf-8")
            out.append((f"{name.split('_nvidia_')[1][:-5]}: {row.name}", values, int(r["measured"]["max_reserved"])))
    return out


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """min / median / max of ``ratio`` (formula / replay reserved) per regime and over all rows."""
    import statistics

    def band(rs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        vals = sorted(r["ratio"] for r in rs)
        return {"n": len(vals), "min": vals[0], "median": round(statistics.median(vals), 4), "max": vals[-1]}

    out = {reg: band([r for r in rows if reg in r["regimes"]]) for reg in REGIMES
           if any(reg in r["regimes"] for r in rows)}
    out["all"] = band(rows)
    return out


def main(argv: Sequence[str]) -> int:
    """Score the configs, print the table and the band by regime, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-regime", type=int, default=4, help="fixed configs per set of regimes")
    ap.add_argument("--no-gpu-rows", action="store_true")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    cache: dict[str, Any] = {}
    rows = []
    items: list[tuple[str, Any, int | None]] = [(label, spec, None) for label, spec in candidates(args.per_regime)]
    if not args.no_gpu_rows:
        from fitcheck.torch_adapters import plain_trainer_run

        for name, values, reserved in gpu_rows():
            with tempfile.TemporaryDirectory(prefix="gap_vs_replay_") as tmp:
                (Path(tmp) / "config.json").write_text(str(values.pop("_config")), encoding="utf-8")
                values["model_name_or_path"] = tmp
                gpu_spec = _spec(values)
            if plain_trainer_run(gpu_spec):
                items.append((name, gpu_spec, reserved))
    for label, spec, measured in items:
        try:
            row = score(label, spec, cache, measured)
        except Exception as exc:  # a config the replay cannot compose: listed, not scored
            print(f"skip {label}: {type(exc).__name__}: {exc}", flush=True)
            continue
        rows.append(row)
        print(f"{row['ratio']:7.4f}  formula {row['formula_reserved'] / MIB:9.0f}  replay "
              f"{row['replay_reserved'] / MIB:9.0f} MiB  {row['replay_seconds']:5.1f}s  {label}", flush=True)
    bands = summary(rows)
    print("\nformula / replay reserved, by regime (min, median, max):")
    for reg, b in bands.items():
        print(f"  {reg:18s} n={b['n']:3d}  {b['min']:.4f}  {b['median']:.4f}  {b['max']:.4f}")
    Path(args.out).write_text(json.dumps({"rows": rows, "band": bands}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
