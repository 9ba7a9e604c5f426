"""Why reserved memory is modelled low under checkpointing: the allocator replay at two layer groups vs full depth.

For each measured row of a ``benchmarks/gpu_truth.py`` data file (CPU only; the measurements are not re-run):

* ``estimate``: what ``fitcheck estimate`` answers now (``gpu_truth._estimate``: the default path, whose reserved
  is the formula's 11 % where the checked formulas answer, else the whole run's gap: ``replay_whole_run``);
* ``two-group replay``: ``allocator_replay.replay_step`` -- the step traced at two repeating layer groups, replayed
  through ``fitcheck.core.caching``, its gap fraction applied to the estimate (``core.estimate(gap_fraction=)``);
* ``full depth``: ``allocator_replay.replay_steady_state`` -- the run as the GPU ran it (every layer, the optimizer,
  two warm-up steps), replayed: its own ``max_memory_reserved``, and its gap fraction applied to the estimate,
  never below that ``max_memory_reserved`` (``core.estimate(replayed=)``, as the default path takes a replay of the
  run itself) (``--deepened``: the same sequence built from one and two layer groups,
  ``allocator_replay.replay_deepened``).

``--depths 1,2,4,8`` also prints the replay's gap (peak reserved - peak allocated) at those depths, to show
whether the two-group number can be extrapolated.

    PYTHONPATH=. python benchmarks/reserved_replay.py [--data benchmarks/data/gpu_truth_nvidia_h100_80gb_hbm3.json]
        [--rows ckpt QLoRA] [--depths 1,2,4,8] [--out benchmarks/data/reserved_replay_h100.json]
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
from gpu_truth import ROWS, _estimate, rescore_values

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "benchmarks" / "data" / "gpu_truth_nvidia_h100_80gb_hbm3.json"
MIB = 2**20


def _spec_and_values(row: Any, env: dict[str, Any], tmp: str) -> tuple[Any, dict[str, object]]:
    from fitcheck.cli import spec_from_values

    values = rescore_values(row, env, tmp)
    spec, _ = spec_from_values(values, {})
    return spec, values


def _err(est: float, meas: float) -> float:
    return round(100.0 * (est - meas) / meas, 2)


def score_row(r: dict[str, Any], env: dict[str, Any], depths: Sequence[int], deepened: bool = False) -> dict[str, Any]:
    """The three reserved numbers of one measured row, with their errors and costs."""
    from fitcheck.core import estimate
    from fitcheck.core.loading import allocator_conf
    from fitcheck.torch_adapters import (
        replay_deepened,
        replay_events,
        replay_steady_state,
        replay_step,
        trace_kwargs,
        trace_step,
    )

    row = next(x for x in ROWS if x.name == r["name"])
    measured = int(r["measured"]["max_reserved"])
    with tempfile.TemporaryDirectory(prefix="reserved_replay_") as tmp:
        spec, values = _spec_and_values(row, env, tmp)
        est = _estimate(values)
        t0 = time.perf_counter()
        two = replay_step(spec)
        t1 = time.perf_counter()
        full = replay_deepened(spec) if deepened else replay_steady_state(spec)
        t2 = time.perf_counter()
        sweep = {}
        for d in depths:
            ev = trace_step(spec.model.config, **{**trace_kwargs(spec), "steps": 3, "num_layers": d}).alloc_events
            rep = replay_events([ev], allocator_conf(spec))
            sweep[str(d)] = rep.peak_reserved - rep.peak_allocated
    two_res = estimate(spec, gap_fraction=two.gap_fraction).peak_reserved_bytes
    full_res = estimate(spec, replayed=full.measured(True)).peak_reserved_bytes  # the run itself: its bytes a floor
    return {"name": r["name"], "measured_reserved": measured, "measured_allocated": r["measured"]["max_allocated"],
            "estimate_reserved": est["peak_reserved_bytes"], "estimate_err_pct": _err(est["peak_reserved_bytes"],
                                                                                      measured),
            "two_group_gap_fraction": round(two.gap_fraction, 4), "two_group_reserved": two_res,
            "two_group_err_pct": _err(two_res, measured), "two_group_seconds": round(t1 - t0, 1),
            "full_depth_gap_fraction": round(full.gap_fraction, 4), "full_depth_replay_allocated": full.peak_allocated,
            "full_depth_replay_reserved": full.peak_reserved,
            "full_depth_replay_err_pct": _err(full.peak_reserved, measured),
            "full_depth_reserved": full_res, "full_depth_err_pct": _err(full_res, measured),
            "full_depth_seconds": round(t2 - t1, 1), "full_depth_method": "deepened" if deepened else "traced",
            "gap_by_depth": sweep}


def main(argv: Sequence[str]) -> int:
    """CLI: score the rows, print the table, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="a gpu_truth.py data file with measured rows")
    ap.add_argument("--rows", nargs="+", default=[], help="only rows whose name contains one of these")
    ap.add_argument("--depths", default="", help="comma-separated depths for the gap-by-depth sweep")
    ap.add_argument("--deepened", action="store_true",
                    help="full depth built from one and two layer groups (allocator_replay.replay_deepened)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(list(argv))
    warnings.simplefilter("ignore", FutureWarning)
    doc = json.loads(Path(args.data).read_text(encoding="utf-8"))
    env = doc.get("environment") or {}
    depths = [int(d) for d in args.depths.split(",") if d]
    rows = [r for r in doc["rows"] if r.get("status") == "ok" and r.get("measured")
            and (not args.rows or any(f in r["name"] for f in args.rows))]
    out = []
    print(f"{'row (MiB)':34} {'measured':>9} | {'estimate':>9} {'err':>7} | {'2-group':>9} {'err':>7} | "
          f"{'full':>9} {'err':>7} {'replay':>9} {'err':>7} {'s':>5}")
    for r in rows:
        s = score_row(r, r.get("environment") or env, depths, args.deepened)
        out.append(s)
        print(f"{s['name']:34} {s['measured_reserved'] / MIB:9.0f} | {s['estimate_reserved'] / MIB:9.0f} "
              f"{s['estimate_err_pct']:+6.2f}% | {s['two_group_reserved'] / MIB:9.0f} "
              f"{s['two_group_err_pct']:+6.2f}% | "
              f"{s['full_depth_reserved'] / MIB:9.0f} {s['full_depth_err_pct']:+6.2f}% "
              f"{s['full_depth_replay_reserved'] / MIB:9.0f} {s['full_depth_replay_err_pct']:+6.2f}% "
              f"{s['full_depth_seconds']:5.1f}", flush=True)
        if depths:
            print("   gap by depth (MiB): " + ", ".join(f"{d}: {g / MIB:.0f}" for d, g in s["gap_by_depth"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"data": str(Path(args.data).name), "rows": out}, indent=1) + "\n",
                                  encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
