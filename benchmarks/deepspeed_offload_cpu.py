"""A REAL DeepSpeed ``offload_optimizer`` engine on CPU, its tensors split into host and device by identity: what the
device holds at each phase vs ``fitcheck estimate``'s ``Location.DEVICE`` components.

On CPU "host" and "device" are the same memory, so the live-tensor recorder (``fitcheck.torch_adapters``
``LiveTensorRecorder``) counts both; after the run every storage the engine keeps on its host side is tagged and
left out of the device series. deepspeed 0.19.8, the host side:

- ZeRO-1/2 (``runtime/zero/stage_1_and_2.py``, ``cpu_offload``): the fp32 master partitions
  ``single_partition_of_fp32_groups`` and their ``.grad`` (``initialize_optimizer_states``, on ``self.device`` =
  cpu), the optimizer's states, ``temp_grad_buffer_for_cpu_offload``, ``accumulated_grads_in_cpu`` and the bf16
  copy-back buffer ``param_buffer_of_bit16_for_cpu_offload_groups`` (``device=weights_partition.device``);
- ZeRO-3 (``runtime/zero/stage3.py``, ``offload_optimizer``): ``fp32_partitioned_groups_flat`` and their ``.grad``,
  the optimizer's states and ``grad_partitions_flat_buffer`` (on ``self.device`` = cpu), with ``offload_param`` the
  bf16 partitions (``fp16_partitioned_groups_flat``, ``param_groups_fp16_flat_cpu_memory``, each ``ds_tensor``).

Everything else (the bf16 parameters, the ipg buckets, ``temp_grad_buffer_for_gpu_offload``, ``.grad``,
activations) is the device's. The optimizer is torch's AdamW (``zero_force_ds_cpu_optimizer: false``): DeepSpeedCPUAdam
needs its C++ op built; which Adam runs on the host moves no device byte. The optimizer step is not compared (its
temporaries are made on the host by the host optimizer, and torch's are not tagged).

The tiny Llama (``deepspeed_cpu.TINY``), fp32-loaded, bf16 engine, one gloo process, 2 x ``seq`` tokens, reduce
bucket hidden² (transformers' "auto"). Run: ``PYTHONPATH=. python benchmarks/deepspeed_offload_cpu.py`` (the table);
``--measure NAME`` one case (device peaks: forward, start of backward, backward, as JSON); ``--write`` records
``benchmarks/data/deepspeed_offload_cpu.json`` for ``tests/test_deepspeed_offload.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.deepspeed_cpu import TINY, recorded_steps, run_spec, tiny_engine

DATA = Path(__file__).parent / "data" / "deepspeed_offload_cpu.json"
BUCKET = 128 * 128
CASES: dict[str, dict[str, Any]] = {
    "zero1-offload": {"stage": 1, "seq": 16},
    "zero1-offload-accum2": {"stage": 1, "seq": 16, "accum": 2},
    "zero2-offload": {"stage": 2, "seq": 16},
    "zero2-offload-s64": {"stage": 2, "seq": 64},
    "zero3-offload": {"stage": 3, "seq": 16},
    "zero3-offload-accum2": {"stage": 3, "seq": 16, "accum": 2},
}


def _host_tensors(opt: Any) -> list[Any]:
    """The tensors the ZeRO optimizer keeps on its host side (the module docstring)."""
    import torch

    out: list[Any] = []

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            out.append(t)
            if t.grad is not None:
                out.append(t.grad)
        elif isinstance(t, (list, tuple)):
            for x in t:
                add(x)
        elif isinstance(t, dict):
            for x in t.values():
                add(x)

    for name in ("single_partition_of_fp32_groups", "temp_grad_buffer_for_cpu_offload", "accumulated_grads_in_cpu",
                 "param_buffer_of_bit16_for_cpu_offload_groups", "fp32_partitioned_groups_flat",
                 "grad_partitions_flat_buffer", "param_groups_fp16_flat_cpu_memory"):
        add(getattr(opt, name, None))
    add(list(opt.optimizer.state.values()))
    return out


def measure(stage: int, seq: int = 16, batch: int = 2, accum: int = 1) -> dict[str, int]:
    """Device-side live-tensor peaks (bytes) of the second of two steps: forward (+ loss), the backward region's
    first event (recorded, not compared) and backward, the largest micro-step's; ``host_bytes``: the host side."""
    # deepspeed_cpu's engine and steps, with offload_optimizer to the host and torch's AdamW there
    engine, ids = tiny_engine(stage, seq, batch, config=TINY, bucket=BUCKET, accum=accum,
                              zero={"offload_optimizer": {"device": "cpu", "pin_memory": False}},
                              top={"zero_force_ds_cpu_optimizer": False})
    rec = recorded_steps(engine, ids, accum)
    host = {s for t in _host_tensors(engine.optimizer) if (s := rec.serial(t)) is not None}
    out = {"forward": 0, "backward_start": 0, "backward": 0, "host_bytes": sum(rec.sizes[s] for s in host)}
    for m in range(accum):
        for phase, key in (("forward", "forward"), ("backward", "backward")):
            rows = rec.series([f"{phase}1.{m}"], lambda s: 1 if s in host else 0, 2)
            out[key] = max(out[key], max(r[0] for r in rows))
            if phase == "backward":
                out["backward_start"] = max(out["backward_start"], rows[0][0])
    return out


def spec_of(case: dict[str, Any]) -> Any:
    """The TrainingSpec of a case: ``deepspeed_cpu.run_spec`` with ``offload_optimizer`` cpu."""
    from fitcheck.spec import OffloadDevice

    spec = run_spec(config=TINY, bucket=BUCKET, **case)
    ds = replace(spec.sharding.deepspeed, offload_optimizer=OffloadDevice.CPU)
    return replace(spec, sharding=replace(spec.sharding, deepspeed=ds))


def estimate_of(case: dict[str, Any]) -> dict[str, int]:
    """fitcheck's device bytes of a case: end of forward, and the backward's (the larger of its start and during
    it), as ``deepspeed_cpu.py --cases`` compares them."""
    from fitcheck.core import estimate
    from fitcheck.report import Location, Phase

    rep = estimate(spec_of(case))
    tot = {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}
    return {"forward": tot[Phase.FORWARD_END], "backward": max(tot[Phase.BACKWARD_START], tot[Phase.BACKWARD])}


def table(recorded: dict[str, dict[str, int]]) -> None:
    """Print every case's real device peaks against the estimate."""
    print(f"{'case':22} {'phase':15} {'real B':>10} {'est B':>10} {'error':>8}")
    for name, case in CASES.items():
        est = estimate_of(case)
        for key in ("forward", "backward"):
            r, e = recorded[name][key], est[key]
            print(f"{name:22} {key:15} {r:10d} {e:10d} {(e - r) / r * 100:+7.2f}%")


def record() -> dict[str, dict[str, int]]:
    """Run every case, each in its own process."""
    out = {}
    for name in CASES:
        proc = subprocess.run([sys.executable, __file__, "--measure", name], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONPATH": "."})
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(**CASES[sys.argv[2]])))
        sys.exit(0)
    data = record() if "--write" in sys.argv or not DATA.exists() else json.loads(DATA.read_text(encoding="utf-8"))
    if "--write" in sys.argv:
        DATA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    table(data)
