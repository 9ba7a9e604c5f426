"""``--seq_lengths`` step by step: the replayed run's ``max_memory_reserved`` after each step vs the GPU's.

For each measured row of a ``benchmarks/gpu_truth.py`` data file that ran one step per padded length
(``Row.lengths``; the GPU recorded the allocator's counters after each step: ``measured.per_step``), the run is
replayed as ``fitcheck estimate --seq_lengths`` replays it (``allocator_whole_run.replay_whole_lengths``: every layer,
the optimizer, each step starting from what the earlier ones left cached, through ``fitcheck/core/caching``), and
the reserved peak after each step is printed next to the measured one. The load phase is the run's start: its
reserved peak and the oversize blocks ``max_split_size_mb`` leaves cached (``LoadPhase.oversize_cached``) are
part of each step's figure, as on the GPU (nothing is reset between loading and the steps of such a row).

    PYTHONPATH=. python benchmarks/lengths_replay.py [--data benchmarks/data/gpu_truth_nvidia_h200.json]

CPU only (the measurements are not re-run); about 10 s of tracing per row.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_truth import ROWS, rescore_values

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "benchmarks" / "data" / "gpu_truth_nvidia_h200.json"
MIB = 2**20


def score_row(r: dict[str, Any], env: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(length, measured reserved, replayed reserved) after each step of one row."""
    from fitcheck.cli import spec_from_values
    from fitcheck.core.loading import load_phase
    from fitcheck.torch_adapters import replay_whole_lengths

    row = next(x for x in ROWS if x.name == r["name"])
    with tempfile.TemporaryDirectory(prefix="lengths_replay_") as tmp:
        spec, _ = spec_from_values(rescore_values(row, env, tmp), {})
    lp = load_phase(spec, spec.hardware.gpu_memory_bytes)
    load, oversize = (0, 0) if lp is None else (lp.peak_reserved, lp.oversize_cached)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sequence, _ = replay_whole_lengths(spec, row.lengths)
    return [(int(s["seq"]), int(s["max_reserved"]), max(load, replayed + oversize))
            for s, replayed in zip(r["measured"]["per_step"], sequence.step_reserved, strict=True)]


def main(argv: Sequence[str]) -> int:
    """Print measured vs replayed reserved (MiB) after each step of every row with lengths."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="a gpu_truth.py data file with per-step counters")
    args = ap.parse_args(list(argv))
    doc = json.loads(Path(args.data).read_text(encoding="utf-8"))
    worst = 0.0
    for r in doc["rows"]:
        if r.get("status") != "ok" or not (r.get("measured") or {}).get("per_step"):
            continue
        steps = score_row(r, r.get("environment") or doc.get("environment") or {})
        cells = []
        for n, meas, est in steps:
            err = 100.0 * (est - meas) / meas
            worst = max(worst, abs(err))
            cells.append(f"{n}: {meas / MIB:.0f}/{est / MIB:.0f} ({err:+.1f}%)")
        print(f"{r['name']:45} " + " | ".join(cells))
    print(f"largest |error| after a step: {worst:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
