"""A real ``transformers.Trainer`` under FSDP on one CUDA GPU, next to ``fitcheck estimate`` of the same flags.

Issue 19 asks whether a bf16-loaded and an fp32-loaded model under FSDP + ``bf16=True`` really take the same
memory (accelerate 1.15 upcasts trainable low-precision parameters to fp32 before sharding:
``utils/fsdp_utils.py`` ``fsdp2_prepare_model``; FSDP1: ``accelerator.py`` ``prepare_model``). This runs the
real thing: ``torch.distributed.run`` with one process (NCCL), ``TrainingArguments(fsdp="full_shard auto_wrap",
fsdp_config={"fsdp_version": V, ...}, bf16=True)``, the model built with random weights on the CPU in the load
dtype (``from_pretrained`` without ``device_map`` keeps it there; FSDP moves it to the GPU in
``accelerator.prepare``), three optimizer steps. A callback reads the allocator's counters:

* ``prepare``: at ``on_train_begin`` (after ``_prepare_for_training``: FSDP wrapping, upcast, optimizer built);
* ``step``: steps 2-3 (peaks reset after step 1, so the optimizer states exist);
* after ``train()``: ``trainer.save_model()`` (the FULL_STATE_DICT gather) as ``save``.

One process per case (clean CUDA context). ``PYTHONPATH=. python benchmarks/fsdp_gpu.py --out DIR`` (GPU only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
PREFIX = "FSDP_GPU_RESULT "
MODEL = "meta-llama/Llama-3.2-1B"
# name: (load dtype, fsdp_version, gradient checkpointing)
CASES: dict[str, tuple[str, int, bool]] = {
    "fsdp2 bf16-loaded": ("bfloat16", 2, False),
    "fsdp2 fp32-loaded": ("float32", 2, False),
    "fsdp1 bf16-loaded": ("bfloat16", 1, False),
    "fsdp2 bf16-loaded ckpt": ("bfloat16", 2, True),
}
BATCH, SEQ = 4, 1024


def _counters() -> dict[str, int]:
    """The caching allocator's counters and the device's used bytes (``gpu_truth_step._cuda_counters``)."""
    from gpu_truth_step import _cuda_counters

    return _cuda_counters()


def failed(out: dict[str, Any], exc: BaseException) -> None:
    """Record a case's failure in its row: ``oom`` (a result) or ``error`` with the traceback's end."""
    oom = "out of memory" in str(exc).lower()
    out.update(status="oom" if oom else "error", error=f"{type(exc).__name__}: {exc}"[:800],
               traceback=traceback.format_exc()[-3000:])


def probe(measured: dict[str, Any], counters: Callable[[], dict[str, int]]) -> Any:
    """A ``TrainerCallback`` that records ``counters()`` into ``measured`` at ``on_train_begin`` (``prepare``, with the
    parameters' dtypes) and after step 1 (``step1``), resetting the peaks after each."""
    import torch
    import transformers

    class Probe(transformers.TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            measured["prepare"] = counters()
            measured["param_dtypes"] = sorted({str(p.dtype) for p in kw["model"].parameters()})
            torch.cuda.reset_peak_memory_stats()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 1:
                measured["step1"] = counters()
                torch.cuda.reset_peak_memory_stats()

    return Probe()


def build_on_cpu(config: dict[str, Any], dtype: Any) -> Any:
    """The model with random weights (seed 0) in ``dtype`` on the CPU, where ``from_pretrained`` without a
    ``device_map`` leaves it and FSDP's prepare finds it; the init runs on the GPU (fast), then the GPU is emptied."""
    import torch

    from fitcheck.torch_adapters import hf_config, model_class

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_class(config)._from_config(hf_config(config, "sdpa"), dtype=dtype)
    model.to("cpu")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return model


def _fsdp_config(version: int, work: Path) -> Path:
    cfg: dict[str, Any] = {"fsdp_version": version, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    if version == 1:
        cfg["use_orig_params"] = True
    path = work / "fsdp_config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def estimate_argv(model_dir: Path, dtype: str, fsdp_config: Path, ckpt: bool) -> list[str]:
    """``fitcheck estimate`` flags of the run."""
    return [*(["--gradient_checkpointing"] if ckpt else []),
            "--model_name_or_path", str(model_dir), "--dtype", dtype, "--bf16", "--fsdp", "full_shard auto_wrap",
            "--fsdp_config", str(fsdp_config), "--num_processes", "1", "--optim", "adamw_torch_fused",
            "--per_device_train_batch_size", str(BATCH), "--max_seq_length", str(SEQ), "--device_type", "cuda"]


def worker(case: str) -> dict[str, Any]:
    """One case under ``torch.distributed.run`` (1 process): estimate, then the real Trainer run."""
    dtype, version, ckpt = CASES[case]
    out: dict[str, Any] = {"case": case, "model": MODEL, "load_dtype": dtype, "fsdp_version": version,
                           "fsdp_activation_checkpointing": ckpt, "batch": BATCH, "seq": SEQ, "status": "ok"}
    started = time.perf_counter()
    try:
        import torch
        import transformers
        from gpu_truth import _environment, _estimate, _gpu_flag, parse_values

        from fitcheck.catalog import find_catalog_config

        out["environment"] = env = _environment("cuda")
        with tempfile.TemporaryDirectory(prefix="fsdp_gpu_") as tmp:
            work = Path(tmp)
            found = find_catalog_config(MODEL)
            assert found is not None
            config = found[0]
            (work / "model").mkdir()
            (work / "model" / "config.json").write_text(json.dumps(config), encoding="utf-8")
            values = parse_values(estimate_argv(work / "model", dtype, _fsdp_config(version, work), ckpt))
            values.update(_gpu_flag(str(env["gpu_name"]), int(env["gpu_total_bytes"])))
            try:
                out["estimate"] = _estimate(values)
            except Exception as exc:  # the measurement is worth keeping even where the estimate fails
                out["estimate_error"] = f"{type(exc).__name__}: {exc}"[:500]
            model = build_on_cpu(config, getattr(torch, dtype))
            model.config.use_cache = False
            ids = torch.randint(0, int(config["vocab_size"]), (BATCH * 3, SEQ))
            data = [{"input_ids": r, "labels": r} for r in ids]
            measured: dict[str, Any] = {}

            targs = transformers.TrainingArguments(
                output_dir=str(work / "out"), per_device_train_batch_size=BATCH, max_steps=3, bf16=True,
                fsdp="full_shard auto_wrap", fsdp_config=str(work / "fsdp_config.json"), optim="adamw_torch_fused",
                save_strategy="no", report_to="none", logging_steps=1000, dataloader_num_workers=0,
                gradient_checkpointing=ckpt)
            trainer = transformers.Trainer(model=model, args=targs, train_dataset=data,
                                           callbacks=[probe(measured, _counters)])
            torch.cuda.reset_peak_memory_stats()
            trainer.train()
            measured["step"] = _counters()
            torch.cuda.reset_peak_memory_stats()
            trainer.save_model(str(work / "saved"))
            measured["save"] = _counters()
            out["measured"] = measured
    except Exception as exc:
        failed(out, exc)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def run_worker(script: str, worker_args: list[str], prefix: str, timeout: float,
               row: dict[str, Any]) -> dict[str, Any]:
    """``script --worker ...`` in a fresh ``torch.distributed.run --nproc_per_node 1`` process (own CUDA context,
    NCCL group on a free port); its ``prefix`` result line, or ``row`` marked timeout / crash."""
    from gloo_rank import free_port

    port = int(free_port())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(port),
           script, "--worker", *worker_args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(prefix):
            return dict(json.loads(line[len(prefix):]))
    return {**row, "status": "crash", "error": (proc.stderr or proc.stdout)[-4000:]}


def run_case(case: str, timeout: float) -> dict[str, Any]:
    """One case in a fresh ``torch.distributed.run --nproc_per_node 1`` process."""
    return run_worker(str(Path(__file__).resolve()), [case], PREFIX, timeout, {"case": case})


def table(rows: list[dict[str, Any]]) -> str:
    """Measured vs estimated GiB per phase."""
    g = 2**30
    lines = [f"{'case':24} {'status':6} | {'prep alloc':>10} | {'step alloc':>10} {'est':>7} {'err':>7} | "
             f"{'step resv':>9} {'est':>7} | {'save':>6} {'est':>6} | dtypes"]
    for r in rows:
        m, e = r.get("measured") or {}, r.get("estimate") or {}
        step, prep, save = m.get("step") or {}, m.get("prepare") or {}, m.get("save") or {}
        sa, ea = step.get("max_allocated"), e.get("peak_allocated_bytes")
        err = f"{(ea - sa) / sa * 100:+6.1f}%" if sa and ea else "-"
        save_est = (e.get("phases") or {}).get("save")
        lines.append(
            f"{r['case']:24} {r.get('status', '?'):6} | {(prep.get('max_allocated') or 0) / g:10.2f} | "
            f"{(sa or 0) / g:10.2f} {(ea or 0) / g:7.2f} {err:>7} | {(step.get('max_reserved') or 0) / g:9.2f} "
            f"{(e.get('peak_reserved_bytes') or 0) / g:7.2f} | {(save.get('max_allocated') or 0) / g:6.2f} "
            f"{(save_est or 0) / g:6.2f} | {m.get('param_dtypes', '')}")
        if r.get("status") != "ok":
            lines.append(f"   -> {(r.get('error') or '')[:600]}")
    return "\n".join(lines)


def model_dir(work: Path, model: str = MODEL) -> Path:
    """``work/model`` holding the catalog's config.json of ``model`` (what an estimate of a row reads)."""
    from fitcheck.catalog import find_catalog_config

    found = find_catalog_config(model)
    assert found is not None
    (work / "model").mkdir()
    (work / "model" / "config.json").write_text(json.dumps(found[0]), encoding="utf-8")
    return work / "model"


def estimate_row(argv: list[str], env: dict[str, Any]) -> dict[str, Any]:
    """``fitcheck estimate`` of a row's flags on the GPU the row ran on (``env``: its recorded environment)."""
    from gpu_truth import _estimate, _gpu_flag, parse_values

    values = parse_values(argv)
    values.update(_gpu_flag(str(env.get("gpu_name", "H100")), int(env.get("gpu_total_bytes", 0) or 0)))
    return _estimate(values)


def rewrite_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace a data file's rows (``--rescore``: measurements untouched, estimates by this checkout)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["rows"] = rows
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def rescore_rows(path: Path, cases: Container[str],
                 argv_for: Callable[[Path, dict[str, Any]], list[str]]) -> list[dict[str, Any]]:
    """A data file's measured rows with ``estimate_row`` of ``argv_for(work, row)`` (``work``: a temporary folder
    per row); rows not ``ok`` or of no known case pass through (measurements untouched)."""
    out = []
    for r in json.loads(path.read_text(encoding="utf-8"))["rows"]:
        if r.get("status") != "ok" or r.get("case") not in cases:
            out.append(r)
            continue
        with tempfile.TemporaryDirectory(prefix="gpu_rescore_") as tmp:
            row = {k: v for k, v in r.items() if k != "estimate_phases"}  # now inside the estimate ("phases")
            out.append({**row, "estimate": estimate_row(argv_for(Path(tmp), r), r.get("environment") or {})})
    return out


def rescore(path: Path) -> list[dict[str, Any]]:
    """The measured rows of a data file with estimates recomputed by this checkout (measurements untouched)."""

    def argv_for(work: Path, r: dict[str, Any]) -> list[str]:
        dtype, version, ckpt = CASES[r["case"]]
        return estimate_argv(model_dir(work), dtype, _fsdp_config(version, work), ckpt)

    return rescore_rows(path, CASES, argv_for)


def case_arguments(description: str | None, cases: list[str], timeout_s: float) -> argparse.ArgumentParser:
    """The command line every per-case GPU benchmark shares (``--worker``, ``--cases``, ``--out``, ``--timeout_s``,
    ``--budget_s``, ``--rescore``)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--worker", default=None)
    ap.add_argument("--cases", nargs="+", default=cases)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "data"))
    ap.add_argument("--timeout_s", type=float, default=timeout_s)
    ap.add_argument("--budget_s", type=float, default=3600.0, help="start no case after this many seconds")
    ap.add_argument("--rescore", default=None, metavar="JSON", help="re-estimate a data file's rows (no GPU)")
    return ap


def run_cases(cases: list[str], budget_s: float, timeout_s: float, run_one: Callable[[str, float], dict[str, Any]],
              save: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """Run each case (``run_one(case, timeout)``), none started with under 30 s of ``budget_s`` left; ``save`` the
    rows after every case, so that a killed session keeps what ran."""
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for case in cases:
        left = budget_s - (time.perf_counter() - start)
        if left < 30:
            rows.append({"case": case, "status": "skipped", "error": "time budget"})
            continue
        print(f"... {case} {time.strftime('%T')}", file=sys.stderr, flush=True)
        rows.append(run_one(case, min(timeout_s, left)))
        r = rows[-1]
        print(f"    {r.get('status')} {r.get('seconds')} s {str(r.get('error', ''))[:300]}", file=sys.stderr,
              flush=True)
        save(rows)
    return rows


def cases_main(argv: list[str], name: str, cases: list[str], prefix: str,
               worker_fn: Callable[[str], dict[str, Any]], rescore_fn: Callable[[Path], list[dict[str, Any]]],
               table_fn: Callable[[list[dict[str, Any]]], str], timeout_s: float, method: str | None = None) -> int:
    """The CLI of a per-case GPU benchmark (``fsdp_gpu.py``, ``trainer_gpu.py``): run the cases (each in its own
    1-process ``torch.distributed.run``) or one as a worker, or ``--rescore`` a data file; print the table, write
    ``<name>_<gpu>.json`` after every case."""
    args = case_arguments(method, cases, timeout_s).parse_args(argv)
    if args.rescore:
        rows = rescore_fn(Path(args.rescore))
        rewrite_rows(Path(args.rescore), rows)
        print(table_fn(rows))
        return 0
    if args.worker:
        print(prefix + json.dumps(worker_fn(args.worker)), flush=True)
        return 0
    script = str(ROOT / "benchmarks" / f"{name}.py")

    def save(rows: list[dict[str, Any]]) -> None:
        gpu = next((r["environment"].get("gpu_name") for r in rows if r.get("environment")), None) or "cuda"
        slug = "".join(c if c.isalnum() else "_" for c in str(gpu).lower()).strip("_")
        Path(args.out).mkdir(parents=True, exist_ok=True)
        doc = {"schema": 1, "command": [f"benchmarks/{name}.py", *argv], **({"method": method} if method else {}),
               "rows": rows}
        (Path(args.out) / f"{name}_{slug}.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

    rows = run_cases(args.cases, args.budget_s, args.timeout_s,
                     lambda case, t: run_worker(script, [case], prefix, t, {"case": case}), save)
    print(table_fn(rows))
    return 0 if any(r.get("status") == "ok" for r in rows) else 1


def main(argv: list[str]) -> int:
    """Run the cases (or one, as a worker), print the table, write ``fsdp_gpu_<gpu>.json``."""
    return cases_main(argv, "fsdp_gpu", list(CASES), PREFIX, worker, rescore, table, 150.0, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
