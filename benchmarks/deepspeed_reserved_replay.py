"""DeepSpeed's whole run replayed through the caching allocator, as the estimate does, next to the H200 runs.

The H200 Trainer runs (``benchmarks/data/trainer_gpu_nvidia_h200.json``, Llama-3.2-1B, bf16, 4 x 1024, one
process) reserve far more than they allocate under DeepSpeed (ZeRO-2: 36.69 GiB reserved, 28.74 allocated). The
default path of ``fitcheck estimate`` composes the plain Trainer's whole run from the traced step
(``fitcheck.torch_adapters.whole_run_events``) and, for a DeepSpeed run, rewrites it into DeepSpeed 0.19.8's
(``fitcheck/torch_adapters/deepspeed_run_events.py``: ``initialize``' flat buffers, fp32 master and
``initialize_optimizer_states``' zeroed gradients, the gradients handed to the engine, the engine's step with its
fp64 norm temporaries; each piece cited there) before replaying it through ``core/caching``. This prints that
replay per phase as ``trainer_gpu.py`` measured them (peaks reset after prepare and after step 1; DeepSpeed's own
``empty_cache()`` in ``initialize`` also resets them: ``runtime/utils.py`` ``empty_cache`` calls
``reset_peak_memory_stats``). ZeRO-2's gradient partition lives in ``reduction_stream``'s pool
(``core/states/deepspeed_streams.py``), added here as the estimate adds it.

Result (GiB, allocated / reserved; ``PYTHONPATH=.:benchmarks python benchmarks/deepspeed_reserved_replay.py``,
~60 s on a shared CPU):

========  ===============  ===============  ===============
run       prepare          step 1           steps 2-3
========  ===============  ===============  ===============
ZeRO-2    11.51 / 11.51    23.05 / 36.69    28.71 / 36.69
measured  11.51 / 11.51    23.08 / 36.69    28.74 / 36.69
ZeRO-3    10.64 / 14.38    21.82 / 30.37    31.02 / 34.28
measured  10.64 / 14.38    21.82 / 30.39    31.05 / 34.30
========  ===============  ===============  ===============

Every phase within 0.2 %; ``fitcheck estimate`` on these rows (``trainer_gpu.py --rescore``): ZeRO-2 reserved
+0.1 %, ZeRO-3 +0.1 % (with the published gap it was -11.6 % and -5.4 %). Before the cuBLAS workspaces were
placed where the GPU places them (``cuda_emulation.py`` item 4), ZeRO-2's step 1 reached 32.05 GiB here and the
run's peak only in step 2. The sequence itself is checked against real engines
on CPU (``benchmarks/deepspeed_run_events_cpu.py``: live bytes and large allocations of ZeRO-1/2/3).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

Event = tuple[int, int, str]
G = 2**30
# the H200 rows (GiB): prepare, step 1, steps 2-3 (max_memory_allocated / max_memory_reserved)
MEASURED = {2: ((11.51, 11.51), (23.08, 36.69), (28.74, 36.69)), 3: ((10.64, 14.38), (21.82, 30.39), (31.05, 34.30))}


def _spec() -> Any:
    from gpu_truth import parse_values
    from trainer_gpu import MODEL, estimate_argv

    from fitcheck.catalog import find_catalog_config
    from fitcheck.cli import spec_from_values

    work = Path(tempfile.mkdtemp(prefix="ds_replay_"))
    (work / "model").mkdir()
    found = find_catalog_config(MODEL)
    assert found is not None
    (work / "model" / "config.json").write_text(json.dumps(found[0]), encoding="utf-8")
    values = parse_values(estimate_argv(work / "model", "trainer bf16 full", work))
    values["gpu"] = "H200"
    return spec_from_values(values, {})[0]


def replay_phases(events: list[Event]) -> list[tuple[float, float]]:
    """(prepare, step 1, steps 2-3) peaks (allocated, reserved) in GiB of ``deepspeed_run_events.deepspeed_run``'s
    events; peaks reset after prepare, after step 1 and at DeepSpeed's ``empty_cache()``, as the GPU's were."""
    from fitcheck.core.caching import CachingAllocator

    alloc = CachingAllocator(None)
    handles: dict[int, int] = {}
    out: list[tuple[float, float]] = []
    in_setup, prev = True, ""
    for k, (s, n, t) in enumerate(events, 1):
        ends_step1 = len(out) == 1 and prev.startswith("optimizer") and not t.startswith("optimizer")
        if t.startswith("side:"):  # a side stream's pool: added as deepspeed_streams adds it
            continue
        if (in_setup and t not in ("setup", "empty_cache")) or ends_step1:
            in_setup = False
            out.append((alloc.stats.peak_allocated / G, alloc.stats.peak_reserved / G))
            alloc.stats.peak_allocated = alloc.stats.allocated
        prev = t
        if t == "empty_cache":
            alloc.empty_cache()
            alloc.reset_peak_stats()
        elif n > 0:
            handles[s] = k
            alloc.malloc(k, n)
        elif s in handles:
            alloc.free(handles.pop(s))
    return [*out, (alloc.stats.peak_allocated / G, alloc.stats.peak_reserved / G)]


def main() -> int:
    """Print the replay next to the H200 measurements."""
    from dataclasses import replace

    from fitcheck.spec import DeepSpeedSpec, ShardingSpec, Strategy
    from fitcheck.torch_adapters import deepspeed_plan, deepspeed_run, whole_run_events

    spec = _spec()
    events = whole_run_events(spec)
    print(f"{'':7}{'prepare a/r':>15} {'step 1 a/r':>15} {'steps 2-3 a/r':>15}   (replayed; measured below)")
    for stage in (2, 3):
        # trainer_gpu.py's configs: overlap_comm and contiguous_gradients on, reduce_bucket_size "auto" = hidden^2
        ds = DeepSpeedSpec(stage=stage, overlap_comm=True, reduce_bucket_size=spec.model.config["hidden_size"] ** 2)
        plan = deepspeed_plan(replace(spec, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, ds)))
        phases = replay_phases(deepspeed_run(events, plan))
        # ZeRO-2's gradient partition in reduction_stream's own pool: reserved from step 1's backward on, allocated
        # during backward and the step (not at the step's peak, the start of backward)
        side = plan.elem * plan.numel / G if stage == 2 else 0.0
        replayed = [phases[0], (phases[1][0] + side, phases[1][1] + side), (phases[2][0], phases[2][1] + side)]
        print(f"ZeRO-{stage} " + " ".join(f"{a:7.2f}/{r:6.2f}" for a, r in replayed))
        print(f"{'':7}" + " ".join(f"{a:7.2f}/{r:6.2f}" for a, r in MEASURED[stage]) + "   measured; steps 2-3 "
              f"reserved {(replayed[2][1] - MEASURED[stage][2][1]) / MEASURED[stage][2][1] * 100:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
