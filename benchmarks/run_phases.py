"""The whole run, phase by phase: fitcheck's estimate vs real CPU runs and vs published GPU figures.

Phases and what measures them here (the CPU ones; the GPU ones are this repo's
committed measurements and published figures, cited per row):

* ``load``: a real ``from_pretrained`` of tiny checkpoints on CPU (``load_cpu.py``): bytes kept after loading
  and, for unquantized checkpoints, the peak.
* ``prepare``: the real ``Accelerator.prepare`` under FSDP1/FSDP2 + bf16 on 2 gloo ranks (``fsdp_upcast_cpu.py``):
  trainable shard and AdamW-state bytes after the fp32 upcast.
* ``step``: a real CPU training step of the tiny Llama (``cpu_truth.py``, live tensors, two rows).
* ``eval``: ``trl_truth.py`` measures ``evaluate()``.
* ``save``: the real save calls on 2 gloo CPU ranks (``save_cpu.py``: accelerate FSDP2 ``get_state_dict`` with
  ``FULL_STATE_DICT``, DeepSpeed ZeRO-3 ``_zero3_consolidated_16bit_state_dict``): the largest gather (rank 1) and
  rank 0's host state dict vs ``fitcheck.core.saving``; the paths not compared say why.
* ``published``: every row of ``published_measurements.json`` whose metric is reserved memory or nvidia-smi
  (``published.py``'s planning, ``published_rows.py``), estimated now: error = (estimate - measured) / measured,
  with the phase that sets the estimate.

Prints one table per phase and the median error and its sign; ``--write`` stores the tables in
``benchmarks/data/run_phases.json`` with their sources.

* ``gpu``: the real CUDA runs committed in ``data/`` (``trainer_gpu.py``: a Trainer's prepare, step, evaluate and
  save, plain and under DeepSpeed; ``gpu_truth.py``: the load phase of every row), estimated by this tree.

Run: ``PYTHONPATH=.:benchmarks python benchmarks/run_phases.py [--write] [--no-cpu] [--save-only] [--gpu-only]``
(``--save-only --write``: rerun the save rows and replace only that table in the stored file).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "data" / "run_phases.json"
GIB = 1024**3


def _err(est: float, real: float) -> float:
    return (est - real) / real if real else 0.0


def load_rows() -> list[dict[str, Any]]:
    """Real from_pretrained on CPU vs the load events."""
    from benchmarks.load_cpu import KINDS, events_for, measure

    rows = []
    for kind in KINDS:
        real, model = measure(kind), events_for(kind)
        rows.append({"case": kind, "real_end": real["end"], "est_end": model["end"],
                     "end_error": _err(model["end"], real["end"]), "real_peak_cpu": real["peak"],
                     "est_peak_cuda_sequence": model["peak"]})
    return rows


def prepare_rows() -> list[dict[str, Any]]:
    """Real Accelerator.prepare (FSDP1/FSDP2, bf16) vs the estimate's shard and state bytes."""
    from benchmarks.fsdp_upcast_cpu import component, estimate_for, measure

    rows = []
    for version in (1, 2):
        for dtype in ("bfloat16", "float32"):
            real = measure(version, dtype)[0]
            rep = estimate_for(version, dtype)
            est = component(rep, "weights.trainable") + component(rep, "optimizer.states")
            got = sum(real["params"].values()) + sum(real["states"].values())
            rows.append({"case": f"FSDP{version} {dtype} load, bf16", "real": got, "est": est,
                         "error": _err(est, got), "real_dtypes": sorted({*real["params"], *real["states"]})})
    return rows


def step_rows() -> list[dict[str, Any]]:
    """Two rows of the real CPU step (cpu_truth.py)."""
    from benchmarks.cpu_truth import ROWS, measure

    rows = []
    for row in ROWS[:2]:
        real, est, real_phase, est_phase = measure(row)
        rows.append({"case": row.name, "real": real, "est": est, "error": _err(est, real),
                     "real_phase": real_phase, "est_phase": est_phase})
    return rows


def save_table() -> list[dict[str, Any]]:
    """Real save calls on 2 gloo ranks vs fitcheck's save cost (save_cpu.py)."""
    from benchmarks.save_cpu import save_rows

    return [{k: v for k, v in r.items() if k != "ranks"} for r in save_rows()]


def _print_save(rows: list[dict[str, Any]]) -> None:
    print("save (real save calls on 2 gloo ranks or one process; device gather and host per node: save_cpu._real)")
    print(f"  {'path':20}{'real gather':>12}{'est':>10}{'error':>9}{'real host':>11}{'est':>10}{'error':>9}")
    for r in rows:
        if "not_compared" in r:
            print(f"  {r['case']:20}not compared: {r['not_compared']}")
            continue
        def err(value: float | None) -> str:
            return f"{value:>+9.2%}" if value is not None else f"{'n/a':>9}"

        host = "n/a" if r["real_host"] is None else r["real_host"]
        print(f"  {r['case']:20}{r['real_gather']:>12}{r['est_gather']:>10}{err(r['gather_error'])}"
              f"{host:>11}{r['est_host']:>10}{err(r['host_error'])}" + (f"  ({r['note']})" if "note" in r else ""))


def published_rows_now() -> list[dict[str, Any]]:
    """Published reserved / nvidia-smi rows, estimated by this tree."""
    from published import run_plan
    from published_rows import Plan, load_rows, plan_row

    out = []
    for row in load_rows():
        plan = plan_row(row)
        if not isinstance(plan, Plan) or plan.metric not in ("reserved", "used") or plan.measured_bytes is None:
            continue
        try:
            res = run_plan(plan)
        except Exception as exc:  # every row is reported
            out.append({"id": plan.row_id, "skipped": f"{type(exc).__name__}: {exc}"})
            continue
        out.append({"id": plan.row_id, "group": plan.group, "metric": plan.metric + ("" if plan.metric_sure else "?"),
                    "measured_gib": plan.measured_bytes / GIB, "estimate_gib": res.estimate_bytes / GIB,
                    "error": res.error, "phase": res.extra["phase"], "source": row.get("source", "")})
    return out


GPU_PHASES = (("prepare", "load"), ("step", None), ("eval", "evaluation"), ("save", "save"))


def gpu_rows() -> list[dict[str, Any]]:
    """Real CUDA runs committed in data/ (no GPU needed), estimated by this tree: the Trainer runs of
    ``trainer_gpu.py`` phase by phase, and the load phase of every ``gpu_truth.py`` row.

    Measured: ``max_memory_allocated`` / ``max_memory_reserved`` of the phase (peaks reset before it); estimate: the
    report's phase of that name (``step``: the step's peak allocated and reserved)."""
    import shutil
    import tempfile

    from gpu_truth import rescore as truth_rescore
    from trainer_gpu import rescore as trainer_rescore

    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="run_phases_") as tmp:
        for path in sorted((ROOT / "data").glob("trainer_gpu_*.json")):
            copy = Path(tmp) / path.name
            shutil.copy(path, copy)
            for r in trainer_rescore(copy):
                if r.get("status") != "ok":
                    continue
                m, e = r["measured"], r["estimate"]
                for phase, est_phase in GPU_PHASES:
                    real = m.get(phase) or {}
                    if "max_allocated" not in real:
                        continue
                    est = (e["peak_allocated_bytes"] if phase == "step" else (e["phases"] or {}).get(est_phase or ""))
                    est_res = e["peak_reserved_bytes"] if phase == "step" else None
                    out.append({"file": path.name, "case": r["case"], "phase": phase,
                                "real_allocated": real["max_allocated"], "real_reserved": real["max_reserved"],
                                "est_allocated": est, "est_reserved": est_res,
                                "error": _err(est, real["max_allocated"]) if est else None,
                                "reserved_error": _err(est_res, real["max_reserved"]) if est_res else None})
        for path in sorted((ROOT / "data").glob("gpu_truth_nvidia_*.json")):
            copy = Path(tmp) / path.name
            shutil.copy(path, copy)
            for r in truth_rescore(copy):
                load = ((r.get("measured") or {}).get("phases") or {})
                real = load.get("prepare") or load.get("load")
                e = r.get("estimate") or {}
                if r.get("status") != "ok" or not real or "load_peak_allocated" not in e:
                    continue
                out.append({"file": path.name, "case": r["name"], "phase": "load",
                            "real_allocated": real["max_allocated"], "real_reserved": real["max_reserved"],
                            "est_allocated": e["load_peak_allocated"], "est_reserved": e["load_peak_reserved"],
                            "error": _err(e["load_peak_allocated"], real["max_allocated"]),
                            "reserved_error": _err(e["load_peak_reserved"], real["max_reserved"])})
    return out


def _print_gpu(rows: list[dict[str, Any]]) -> None:
    print("GPU runs (committed measurements in benchmarks/data/, this tree's estimate; GiB allocated / reserved)")
    print(f"  {'file':34}{'case':42}{'phase':8}{'real':>14}{'est':>14}{'error':>16}")
    for r in rows:
        def gib(a: Any, b: Any) -> str:
            return (f"{a / GIB:6.2f}/" + (f"{b / GIB:6.2f}" if b else f"{'-':>6}")) if a else f"{'-':>13}"

        err = "/".join(f"{e:+.1%}" if e is not None else "-" for e in (r["error"], r["reserved_error"]))
        real, est = gib(r["real_allocated"], r["real_reserved"]), gib(r["est_allocated"], r["est_reserved"])
        print(f"  {r['file'][:33]:34}{r['case'][:41]:42}{r['phase']:8}{real:>14}{est:>14}{err:>16}")
    for phase in ("load", "prepare", "step", "eval", "save"):
        errs = [r["error"] for r in rows if r["phase"] == phase and r["error"] is not None]
        res = [r["reserved_error"] for r in rows if r["phase"] == phase and r["reserved_error"] is not None]
        print(f"  {phase:8} allocated: {_summary(errs)}; reserved: {_summary(res)}")


def _summary(errors: list[float]) -> str:
    if not errors:
        return "no rows"
    med = statistics.median(errors)
    above, below = sum(e > 0 for e in errors), sum(e < 0 for e in errors)
    mid = statistics.median(abs(e) for e in errors)
    return (f"{len(errors)} rows, median error {med:+.1%}, median |error| {mid:.1%}, "
            f"{above} above / {below} below / {len(errors) - above - below} equal")


def main(argv: list[str]) -> int:
    """Print the tables; ``--write`` stores them; ``--no-cpu`` runs the published rows only; ``--save-only`` the
    save rows only."""
    tables: dict[str, Any] = {}
    if "--save-only" in argv:
        rows = save_table()
        _print_save(rows)
        if "--write" in argv:
            stored = json.loads(OUT.read_text())
            stored["tables"]["save"] = rows
            OUT.write_text(json.dumps(stored, indent=1) + "\n")
            print(f"wrote the save table into {OUT}")
        return 0
    if "--no-cpu" not in argv:
        tables["load"] = load_rows()
        print("load (real from_pretrained on CPU)")
        print(f"  {'checkpoint':20}{'real end':>12}{'est end':>12}{'error':>9}"
              f"{'real peak (CPU)':>17}{'CUDA seq peak':>15}")
        for r in tables["load"]:
            print(f"  {r['case']:20}{r['real_end']:>12}{r['est_end']:>12}{r['end_error']:>+9.2%}"
                  f"{r['real_peak_cpu']:>17}{r['est_peak_cuda_sequence']:>15}")
        print("  " + _summary([r["end_error"] for r in tables["load"]]))
        tables["prepare"] = prepare_rows()
        print("prepare (real Accelerator.prepare, 2 gloo ranks)")
        for r in tables["prepare"]:
            print(f"  {r['case']:26}{r['real']:>10}{r['est']:>10}{r['error']:>+9.2%}  real dtypes {r['real_dtypes']}")
        print("  " + _summary([r["error"] for r in tables["prepare"]]))
        tables["step"] = step_rows()
        print("step (real CPU step, live tensors)")
        for r in tables["step"]:
            print(f"  {r['case'][:40]:40}{r['real']:>12}{r['est']:>12}{r['error']:>+9.2%}")
        print("  " + _summary([r["error"] for r in tables["step"]]))
        tables["eval"] = "benchmarks/trl_truth.py measures Trainer/TRL evaluate() after a step (not rerun here)"
        print(f"eval: {tables['eval']}")
        tables["save"] = save_table()
        _print_save(tables["save"])
    tables["gpu"] = gpu_rows()
    _print_gpu(tables["gpu"])
    if "--gpu-only" in argv:
        return 0
    tables["published"] = published_rows_now()
    print("published GPU figures (reserved / nvidia-smi), this tree's estimate")
    print(f"  {'row':<14}{'group':<28}{'metric':<10}{'measured':>9}{'estimate':>9}{'error':>9}  phase")
    errs = []
    for r in tables["published"]:
        if "skipped" in r:
            print(f"  {r['id']:<14}skipped: {r['skipped']}")
            continue
        errs.append(r["error"])
        print(f"  {r['id']:<14}{r['group'][:27]:<28}{r['metric']:<10}{r['measured_gib']:>9.2f}{r['estimate_gib']:>9.2f}"
              f"{r['error']:>+9.1%}  {r['phase']}")
    print("  " + _summary(errs))
    if "--write" in argv:
        OUT.write_text(json.dumps({"source": "benchmarks/run_phases.py", "tables": tables}, indent=1) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
