"""The SFT step traced with TRL's repeated token tiles skipped vs every tile, at real width (issue 20).

``tracer_trl.repeated_tiles_skipped`` runs the first two or three token tiles of ``ChunkedLogProbFunction`` and the
last. This traces Qwen2.5-0.5B's SFT step (the boundary replay's step: ``replay_step_args.run_trace_kwargs``) both
ways at a few micro-batches x 512 and prints the events, the trace's seconds and whether the allocator replays are
equal. Measured (session 13, 2-core machine at load 6-12, 1-layer traces unless said):

| run | tiles / pass | events skipped / every | seconds skipped / every | replay |
|---|---|---|---|---|
| 80 x 512 bf16, CUDA folds | 10 | 491 / 491 | 5.9 / 3.8 | equal |
| 80 x 512 fp32 + bf16 autocast | 10 | 661 / 805 | 6.5 / 3.2 | equal |
| 72 x 512 fp32 + bf16 autocast | 9 | 637 / 781 | 11.3 / 4.7 | equal |
| 40 x 512 CPU folds | 5 | 1747 / 2587 | 15.9 / 6.8 | equal |
| 48 x 512 fp32 CPU folds, 2 layers | 6 | 2743 / 3631 | 21.6 / 9.7 | equal |
| 1139 x 512 bf16, CUDA folds | 143 | 491 / 491 | 10.3 / 54.7 | equal |

(the first trace of a process includes its warm-up: the seconds of small runs are not a comparison.)

Usage: ``python benchmarks/sft_tiles.py 1139 80`` (micro-batches; ``--fp32`` loads fp32 under bf16 autocast).
"""

from __future__ import annotations

import sys
import time
import warnings

from fitcheck.cli import spec_from_values
from fitcheck.torch_adapters import replay_events, run_trace_kwargs, trace_step


def compare(micro_batch: int, fp32: bool = False, layers: int = 1) -> str:
    """One row: the step traced both ways at ``micro_batch`` x 512."""
    values = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": micro_batch,
              "gpu": "H100-80GB", "trainer": "sft", "max_length": 512, **({"dtype": "float32"} if fp32 else {})}
    spec = spec_from_values(values, {})[0]
    kwargs = {**run_trace_kwargs(spec), "optimizer": None, "steps": 1}
    rows = []
    for skip in (True, False):
        start = time.perf_counter()
        trace = trace_step(spec.model.config, num_layers=layers, skip_tiles=skip, **kwargs)
        rows.append((len(trace.alloc_events), time.perf_counter() - start, replay_events([trace.alloc_events])))
    (n1, s1, r1), (n2, s2, r2) = rows
    return f"| {micro_batch} x 512{' fp32' if fp32 else ''} | {n1} / {n2} | {s1:.1f} / {s2:.1f} | " \
           f"{'equal' if r1 == r2 else f'DIFFER {r1} {r2}'} |"


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    fp32 = "--fp32" in sys.argv
    for arg in sys.argv[1:]:
        if arg.isdigit():
            print(compare(int(arg), fp32), flush=True)
