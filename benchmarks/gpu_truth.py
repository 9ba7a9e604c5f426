"""Real training steps on a CUDA GPU (or a CPU) next to the ``fitcheck estimate`` of the same flags.

Each row is a ``fitcheck estimate`` flag list. The harness parses it with the CLI's own parser
(``fitcheck.cli.estimate.add_estimate_arguments`` + ``spec_from_values``), estimates it, then runs the same
training the libraries would run for those flags, with random weights (memory does not depend on values):

* model: ``from_config`` of the catalog's config.json (depth reduced where a row says so), built on the device,
  in ``--dtype``, with ``--attn_implementation``; ``use_cache`` off, as TRL/Trainer set it for training;
* ``--load_in_4bit/8bit``: the random weights are saved and reloaded with ``from_pretrained(...,
  quantization_config=BitsAndBytesConfig(...), device_map={"": device})`` (transformers' own quantizer), then
  ``peft.prepare_model_for_kbit_training`` as TRL's SFTTrainer calls it for a quantized model;
* ``--use_peft``: ``peft.get_peft_model`` with the ``LoraConfig`` TRL's ``get_peft_config`` builds;
* ``--gradient_checkpointing``: ``activation_checkpointing_enable()`` as ``Trainer.train`` calls it;
* optimizer: ``Trainer.get_optimizer_cls_and_kwargs`` with Trainer's two weight-decay groups, and the
  bitsandbytes 8-bit embedding override of ``Trainer.create_optimizer``;
* a step: forward + loss (under ``torch.autocast`` for ``--bf16``/``--fp16``), backward,
  ``clip_grad_norm_(1.0)`` (TrainingArguments.max_grad_norm default), ``optimizer.step()``, ``zero_grad``.

On CUDA the model is loaded with ``from_pretrained`` onto the GPU (the load phase: the allocator's counters after
loading and after ``prepare_model_for_kbit_training`` are recorded under ``measured.phases`` and compared with
``fitcheck.core.loading.load_phase``). Three steps run; the peak counters are reset after the first, so the
peak is that of steps 2-3 (optimizer states exist: the steady state the estimate describes). On CUDA the
measured numbers are ``max_memory_allocated``, ``max_memory_reserved`` and nvidia-smi-style used memory
(``mem_get_info`` total - free); on CPU (``--device cpu``: tiny widths, ``--device_type cpu`` estimates) the
peak of live tensor bytes from ``fitcheck.torch_adapters.live_tracker``. Each row runs in its own process (clean
CUDA context, counters and caches); an OOM is a result, not a failure; a time budget bounds the whole run.

GPU:  ``PYTHONPATH=. python benchmarks/gpu_truth.py --quick --out benchmarks/data/``
CPU:  ``PYTHONPATH=. python benchmarks/gpu_truth.py --device cpu``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_truth_step import _environment, build_model, make_optimizer, train_steps

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "GPU_TRUTH_RESULT "
MEASURE_ONLY = "GPU_TRUTH_MEASURE_ONLY"  # set (--measure_only): rows are measured, not estimated (see --rescore)
CPU_SHAPE = "--per_device_train_batch_size 2 --max_seq_length 64"  # appended in CPU mode (tiny widths too)

L1, Q05, Q15 = "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B"
G2, M7, GPT2, PHI2 = "google/gemma-2-2b", "mistralai/Mistral-7B-v0.1", "openai-community/gpt2", "microsoft/phi-2"
BF16, FP16 = "--dtype bfloat16", "--dtype float16"
L2 = "meta-llama/Llama-2-7b-hf"
LENGTHS = (512, 2048, 1024, 1536, 768, 2048)  # padded lengths of successive steps (a dataset's spread)
LORA = "--use_peft --lora_r 16 --lora_alpha 32 --lora_target_modules all-linear"
QLORA = f"--load_in_4bit --bnb_4bit_quant_type nf4 --use_bnb_nested_quant {LORA}"


@dataclass(frozen=True)
class Row:
    """One configuration: a catalog model, its ``fitcheck estimate`` flags, optional reduced depth, subsets."""

    name: str
    model: str
    flags: str
    batch: int = 4
    seq: int = 1024
    optim: str = "adamw_torch_fused"  # transformers' default on torch >= 2.8, written out
    layers: int | None = None
    quick: bool = False  # in --quick (about 5 minutes on an H100)
    cpu: bool = False  # in the --device cpu subset
    lengths: tuple[int, ...] = ()  # one step per padded length, in order (``--seq_lengths``); seq = the longest
    alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF of the worker (and ``--cuda_alloc_conf``)

    def argv(self, device: str) -> list[str]:
        """Estimate flags (CPU mode: tiny batch and sequence appended; argparse keeps the last value)."""
        shape = f"--optim {self.optim} --per_device_train_batch_size {self.batch} --max_seq_length {self.seq}"
        extra = (f" --seq_lengths {','.join(map(str, self.lengths))}" if self.lengths and device != "cpu" else "") + (
            f" --cuda_alloc_conf {self.alloc_conf}" if self.alloc_conf else "")
        return shlex.split(f"{self.flags} {shape}{extra} {CPU_SHAPE if device == 'cpu' else ''}")


ROWS: tuple[Row, ...] = (
    Row("llama1b bf16 full adamw_torch", L1, BF16, optim="adamw_torch", quick=True, cpu=True),
    Row("llama1b bf16 full fused", L1, BF16, quick=True),
    Row("llama1b bf16 full bnb8bit", L1, BF16, optim="adamw_bnb_8bit", quick=True, cpu=True),
    Row("llama1b bf16+autocast full fused", L1, f"{BF16} --bf16", quick=True),
    Row("llama1b fp32+autocast full fused", L1, "--dtype float32 --bf16", quick=True, cpu=True),
    Row("llama1b bf16 full eager", L1, f"{BF16} --attn_implementation eager", batch=2),
    Row("llama1b bf16 full ckpt b8 s2048", L1, f"{BF16} --gradient_checkpointing", 8, 2048, quick=True, cpu=True),
    Row("llama1b bf16 full ckpt b1 s8192", L1, f"{BF16} --gradient_checkpointing", 1, 8192),
    Row("llama1b bf16 full sgd", L1, BF16, optim="sgd"),
    Row("llama1b LoRA all-linear", L1, f"{BF16} --bf16 {LORA}", seq=2048, quick=True, cpu=True),
    Row("llama1b QLoRA nf4 dq ckpt", L1, f"{BF16} --bf16 {QLORA} --gradient_checkpointing", seq=2048, quick=True,
        cpu=True),
    Row("llama1b int8 LoRA", L1, f"{BF16} --bf16 --load_in_8bit {LORA}"),
    Row("qwen0.5b bf16 full fused", Q05, BF16, batch=8, quick=True),
    Row("qwen1.5b bf16 full ckpt", Q15, f"{BF16} --gradient_checkpointing", seq=2048),
    Row("qwen1.5b LoRA default targets", Q15, f"{BF16} --bf16 --use_peft", batch=8, cpu=True),
    Row("gemma2-2b bf16 full eager", G2, f"{BF16} --attn_implementation eager", batch=2, quick=True, cpu=True),
    Row("gemma2-2b QLoRA ckpt", G2, f"{BF16} --bf16 --attn_implementation eager {QLORA} --gradient_checkpointing"),
    Row("mistral7b-8L bf16 full fused", M7, BF16, 2, 2048, layers=8, quick=True),
    Row("mistral7b LoRA ckpt", M7, f"{BF16} --bf16 {LORA} --gradient_checkpointing", seq=2048),
    Row("mistral7b QLoRA nf4 dq ckpt", M7, f"{BF16} --bf16 {QLORA} --gradient_checkpointing", seq=2048),
    Row("gpt2 fp32 full adamw_torch", GPT2, "--dtype float32", batch=8, optim="adamw_torch", quick=True, cpu=True),
    Row("gpt2 fp32+autocast full", GPT2, "--dtype float32 --bf16", batch=8),
    Row("phi2 bf16 full ckpt fused", PHI2, f"{BF16} --gradient_checkpointing", seq=2048),
    Row("phi2 LoRA default targets", PHI2, f"{BF16} --bf16 --use_peft", seq=2048, cpu=True),
    # issue 19: batches of other padded lengths, the allocator's settings, the CUDA LLM.int8 path at 4k
    Row("llama1b bf16 full fused lengths", L1, BF16, seq=2048, lengths=LENGTHS),
    Row("llama1b bf16 full fused lengths expandable", L1, BF16, seq=2048, lengths=LENGTHS,
        alloc_conf="expandable_segments:True"),
    Row("llama1b bf16 full fused expandable", L1, BF16, alloc_conf="expandable_segments:True"),
    Row("llama1b bf16 full fused lengths split128", L1, BF16, seq=2048, lengths=LENGTHS,
        alloc_conf="max_split_size_mb:128"),
    Row("llama1b QLoRA ckpt lengths", L1, f"{BF16} --bf16 {QLORA} --gradient_checkpointing", seq=2048,
        lengths=LENGTHS),
    Row("llama2-7b-8L int8 LoRA ckpt b1 s4096", L2, f"{FP16} --fp16 --load_in_8bit {LORA} --gradient_checkpointing",
        1, 4096, layers=8),
    Row("llama2-7b-8L int8 LoRA b1 s4096", L2, f"{FP16} --fp16 --load_in_8bit {LORA}", 1, 4096, layers=8),
    # issue 19's loading report (Qwen3-8B QLoRA: 11.96 GiB reserved after from_pretrained on an A100-40GB)
    Row("qwen3-8b QLoRA ckpt b2 s2048", "Qwen/Qwen3-8B", f"{BF16} --bf16 {QLORA} --gradient_checkpointing", 2, 2048),
)


# ----------------------------------------------------------------------------------------------- configs
def tiny_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The same architecture at tiny widths (CPU mode): 128 wide, 4 heads (GQA kept), 2 layers, vocab 512."""
    c = dict(config)
    heads = c.get("num_attention_heads", c.get("n_head"))
    kv = c.get("num_key_value_heads")
    sizes = {"hidden_size": 128, "n_embd": 128, "intermediate_size": 256, "num_attention_heads": 4, "n_head": 4,
             "head_dim": 32, "query_pre_attn_scalar": 32, "vocab_size": 512}
    c.update({k: v for k, v in sizes.items() if k in c})
    if kv is not None:
        c["num_key_value_heads"] = 4 if kv == heads else 2
    for key, token in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2)):
        if c.get(key) is not None:
            c[key] = token  # ids must stay inside the tiny vocabulary (padding_idx)
    return c


def row_config(row: Row, device: str) -> dict[str, Any]:
    """config.json of a row: the catalog's, at tiny widths on CPU, reduced in depth as the row says."""
    from fitcheck.catalog import find_catalog_config
    from fitcheck.torch_adapters import reduced_config

    found = find_catalog_config(row.model)
    if found is None:
        raise KeyError(f"{row.model} is not in the fitcheck catalog")
    config = found[0]
    if device == "cpu":
        return reduced_config(tiny_config(config), 2)
    return reduced_config(config, row.layers)


def parse_values(argv: Sequence[str]) -> dict[str, object]:
    """Flag values exactly as ``fitcheck estimate`` reads them (its own parser)."""
    from fitcheck.cli import add_estimate_arguments, explicit_values

    parser = argparse.ArgumentParser()
    add_estimate_arguments(parser)
    return explicit_values(parser.parse_args(list(argv)))


# -------------------------------------------------------------------------------------------------- a row
def _err(est: int | None, meas: int | None) -> float | None:
    return None if not est or not meas else round((est - meas) / meas * 100, 2)


def run_row(row: Row, device: str) -> dict[str, Any]:
    """Estimate and run one row in this process; never raises (errors and OOMs are recorded)."""
    result: dict[str, Any] = {"name": row.name, "model": row.model, "layers": row.layers, "device": device,
                              "argv": ["--model_name_or_path", row.model, *row.argv(device)], "status": "ok",
                              "shape": "tiny_config() widths, 2 layers" if device == "cpu" else
                              f"num_hidden_layers={row.layers}" if row.layers else "catalog config.json"}
    started = time.perf_counter()
    missing = _missing_packages(row)
    if missing:
        return {**result, "status": "skipped", "error": f"not installed: {', '.join(missing)}"}
    try:
        result["environment"] = env = _environment(device)
        with tempfile.TemporaryDirectory(prefix="gpu_truth_") as tmp:
            work = Path(tmp)
            config = row_config(row, device)
            (work / "model").mkdir()
            (work / "model" / "config.json").write_text(json.dumps(config), encoding="utf-8")
            values = parse_values(["--model_name_or_path", str(work / "model"), *row.argv(device),
                                   "--device_type", device])
            if device == "cuda":
                values.update(_gpu_flag(str(env["gpu_name"]), int(env["gpu_total_bytes"])))
            try:  # the measurement is worth keeping even where the estimate fails
                if not os.environ.get(MEASURE_ONLY):  # device time is scarce: --rescore estimates on any machine
                    result["estimate"] = _estimate(values)
            except Exception as exc:
                result["estimate_error"] = f"{type(exc).__name__}: {exc}"[:500]
            result["measured"] = _measure(config, values, device, work, result, row.lengths)
    except Exception as exc:  # a row's failure is a result
        oom = "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"
        result["status"] = "oom" if oom else "error"
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        if not oom:
            result["traceback"] = traceback.format_exc()[-2000:]
        if oom and device == "cuda":
            import torch

            result.setdefault("measured", {})["max_allocated"] = torch.cuda.max_memory_allocated()
    est, meas = result.get("estimate", {}), result.get("measured", {})
    if result["status"] == "ok":
        result["error_pct"] = error_pct(est, meas)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _missing_packages(row: Row) -> list[str]:
    """Packages a row needs that this interpreter lacks (bitsandbytes is not in every CUDA image)."""
    import importlib.util

    needs = ["torch", "transformers"]
    if "--use_peft" in row.flags:
        needs.append("peft")
    if "bnb" in row.optim or "load_in_" in row.flags:
        needs.append("bitsandbytes")
    return [n for n in needs if importlib.util.find_spec(n) is None]


def _gpu_flag(name: str, total: int) -> dict[str, object]:
    """``--gpu`` when fitcheck's table knows the card (its overheads), else ``--gpu_memory`` in bytes."""
    from fitcheck.catalog import lookup_gpu
    from fitcheck.errors import ConfigError

    try:
        return {"gpu": lookup_gpu(name).name}
    except ConfigError:
        return {"gpu_memory": f"{total}B"}


def _estimate(values: Mapping[str, object]) -> dict[str, Any]:
    from fitcheck.cli import spec_from_values
    from fitcheck.core import estimate
    from fitcheck.core.loading import load_phase
    from fitcheck.readers import parse_seq_lengths
    from fitcheck.render import report_to_dict
    from fitcheck.torch_adapters import PinnedPath

    spec, _ = spec_from_values(values, {})
    formula = estimate(spec)
    # what `fitcheck estimate` answers for these flags (fitcheck.cli.estimate build_report: --seq_lengths goes to
    # the path, not the spec)
    lengths = parse_seq_lengths(str(values["seq_lengths"])) if values.get("seq_lengths") else ()
    report = PinnedPath("auto", seq_lengths=lengths)(spec)
    as_dict = report_to_dict(report)
    lp = load_phase(spec, spec.hardware.gpu_memory_bytes)
    load = {} if lp is None else {"load_peak_allocated": lp.peak_allocated, "load_peak_reserved": lp.peak_reserved,
                                  "load_end_allocated": lp.end_allocated, "load_end_reserved": lp.end_reserved}
    return {**load, "peak_allocated_bytes": report.peak_allocated_bytes,
            "peak_reserved_bytes": report.peak_reserved_bytes,
            "device_used_bytes": report.device_used_bytes, "peak_phase": report.peak_phase.value,
            "fits": report.fits, "budget_bytes": report.budget_bytes, "trainable_params": report.trainable_params,
            "regime": report.regime, "pinned": as_dict.get("pinned"),
            "formula_peak_allocated_bytes": formula.peak_allocated_bytes,
            "formula_peak_reserved_bytes": formula.peak_reserved_bytes,
            "components": as_dict["components"], "phases": as_dict["phases"]}


def _measure(config: Mapping[str, Any], values: Mapping[str, object], device: str, work: Path,
             result: dict[str, Any], lengths: tuple[int, ...] = ()) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    phases: dict[str, dict[str, int]] = {}
    model = build_model(config, values, device, work, phases)
    result["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = make_optimizer(model, str(values.get("optim") or "adamw_torch_fused"), work)
    measured: dict[str, Any] = train_steps(model, opt, values, device, lengths=lengths if device == "cuda" else ())
    if phases:  # CUDA: the load and preparation phases, before step 1 (gpu_truth_step.build_model)
        measured["phases"] = phases
    return measured


# ------------------------------------------------------------------------------------------------ driver
def select(device: str, quick: bool, filters: Sequence[str]) -> list[Row]:
    """Rows for a run: the CPU subset on CPU, ``--quick`` rows, names containing any filter."""
    rows = [r for r in ROWS if (device != "cpu" or r.cpu) and (not quick or r.quick)]
    return [r for r in rows if not filters or any(f.lower() in r.name.lower() for f in filters)]


def run_in_subprocess(row: Row, device: str, timeout: float) -> dict[str, Any]:
    """Run one row in a fresh interpreter (own CUDA context and allocator); a timeout is a result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", row.name, "--device", device]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if row.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = row.alloc_conf
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"name": row.name, "model": row.model, "status": "timeout", "error": f"over {timeout:.0f} s"}
    return worker_result(row, proc.stdout, proc.stderr, proc.returncode)


def worker_result(row: Row, stdout: str, stderr: str, returncode: int) -> dict[str, Any]:
    """The row's result from a worker's output; a worker that died without one is a ``crash`` row."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX):]))
    return {"name": row.name, "model": row.model, "status": "crash",
            "error": f"exit {returncode}: {(stderr or stdout)[-1500:]}"}


def summary(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and largest |error| per measure over the rows that ran, and the OOM verdicts."""
    out: dict[str, Any] = {"rows": len(results), "ok": sum(r.get("status") == "ok" for r in results)}
    for key in ("allocated", "reserved", "used"):
        errs = [abs(e) for r in results if (e := (r.get("error_pct") or {}).get(key)) is not None]
        if errs:
            out[f"median_abs_err_{key}_pct"] = round(statistics.median(errs), 2)
            out[f"max_abs_err_{key}_pct"] = round(max(errs), 2)
    out["trainable_params_mismatch"] = [r["name"] for r in results if "trainable_params" in r and "estimate" in r
                                        and r["trainable_params"] != r["estimate"]["trainable_params"]]
    ooms = [r for r in results if r.get("status") == "oom" and "estimate" in r]
    out["oom_rows_predicted_not_fit"] = f"{sum(not r['estimate']['fits'] for r in ooms)}/{len(ooms)}"
    return out


def _mib(v: Any) -> str:
    return f"{v / 2**20:9.2f}" if isinstance(v, int) else f"{'-':>9}"


def _pct(v: Any) -> str:
    return f"{v:+7.2f}%" if isinstance(v, float | int) else f"{'-':>8}"


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """Measured vs estimated MiB and signed error per row (allocated, reserved, nvidia-smi used)."""
    lines = [f"{'row':34} {'status':7}| {'alloc':>9} {'est':>9} {'err':>8} | {'reserved':>9} {'est':>9} "
             f"{'err':>8} | {'used':>9} {'est':>9} {'err':>8} | est phase"]
    for r in results:
        m, e, p = r.get("measured") or {}, r.get("estimate") or {}, r.get("error_pct") or {}
        lines.append(
            f"{r['name'][:34]:34} {r.get('status', '?'):7}| {_mib(m.get('max_allocated'))} "
            f"{_mib(e.get('peak_allocated_bytes'))} {_pct(p.get('allocated'))} | {_mib(m.get('max_reserved'))} "
            f"{_mib(e.get('peak_reserved_bytes'))} {_pct(p.get('reserved'))} | {_mib(m.get('used_peak'))} "
            f"{_mib(e.get('device_used_bytes'))} {_pct(p.get('used'))} | {e.get('peak_phase', '')}")
        if r.get("status") not in ("ok", None) or "estimate_error" in r:
            lines.append(f"{'':34} -> {(r.get('error') or r.get('estimate_error') or '')[:200]}")
    return "\n".join(lines)


def output_path(out: str | None, device: str, results: Sequence[Mapping[str, Any]]) -> Path:
    """``--out`` (a file, or a directory to put ``gpu_truth_<gpu>.json`` in); default benchmarks/data/."""
    gpu = next((r["environment"].get("gpu_name") for r in results if r.get("environment", {}).get("gpu_name")),
               None)
    slug = "cpu" if device == "cpu" else re.sub(r"[^a-z0-9]+", "_", str(gpu or "cuda").lower()).strip("_")
    target = Path(out) if out else ROOT / "benchmarks" / "data"
    return target / f"gpu_truth_{slug}.json" if target.is_dir() or out is None or out.endswith("/") else target


def write_json(path: Path, device: str, results: Sequence[Mapping[str, Any]], argv: Sequence[str]) -> None:
    """The data file: header (device, versions, command), every row, the summary."""
    env: dict[str, Any] = next((r["environment"] for r in results if "environment" in r), {})
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc = {"schema": 1, "device": device, "created": now,
           "command": ["benchmarks/gpu_truth.py", *argv], "environment": env,
           "method": "3 real steps per row, peak counters reset after step 1; see benchmarks/gpu_truth.py",
           "summary": summary(results), "rows": list(results)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def error_pct(est: Mapping[str, Any], meas: Mapping[str, Any]) -> dict[str, float | None]:
    """Signed estimate-vs-measured error per measure (step, and the load phase when both have it)."""
    out = {"allocated": _err(est.get("peak_allocated_bytes"), meas.get("max_allocated")),
           "reserved": _err(est.get("peak_reserved_bytes"), meas.get("max_reserved")),
           "used": _err(est.get("device_used_bytes"), meas.get("used_peak"))}
    load = meas.get("phases", {}).get("prepare") or meas.get("phases", {}).get("load")
    if load and "load_peak_allocated" in est:  # the load phase: estimate vs the allocator's counters
        out.update({"load_allocated": _err(est.get("load_peak_allocated"), load.get("max_allocated")),
                    "load_reserved": _err(est.get("load_peak_reserved"), load.get("max_reserved")),
                    "load_end_reserved": _err(est.get("load_end_reserved"), load.get("reserved"))})
    return out


def rescore_values(row: Row, env: Mapping[str, Any], tmp: str) -> dict[str, object]:
    """The CLI values a measured CUDA row is re-estimated from: its config.json written to ``tmp``, its flags, and
    the GPU it ran on (``env``: the row's recorded environment)."""
    (Path(tmp) / "config.json").write_text(json.dumps(row_config(row, "cuda")), encoding="utf-8")
    values = parse_values(["--model_name_or_path", tmp, *row.argv("cuda"), "--device_type", "cuda"])
    values.update(_gpu_flag(str(env.get("gpu_name", "H100")), int(env.get("gpu_total_bytes", 0) or 0)))
    return values


def rescore(path: Path) -> list[dict[str, Any]]:
    """The measured rows of a data file with estimates recomputed by this checkout (measurements untouched).

    GPU time is scarce and the estimate is a pure function of the flags: a formula change is re-scored against
    the committed measurements instead of re-measured. Each row records the commit-independent inputs (argv,
    layers, gpu name and memory) it is re-estimated from.
    """
    doc = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for r in doc["rows"]:
        row = next((x for x in ROWS if x.name == r["name"]), None)
        env = r.get("environment") or doc.get("environment") or {}
        if row is None or r.get("status") != "ok" or not r.get("measured"):
            out.append(r)
            continue
        with tempfile.TemporaryDirectory(prefix="gpu_truth_") as tmp:
            est = _estimate(rescore_values(row, env, tmp))
        r = {**r, "estimate": est, "error_pct": error_pct(est, r["measured"])}
        r.pop("estimate_error", None)
        out.append(r)
    return out


def _done_rows(path: str | None) -> dict[str, dict[str, Any]]:
    if not path or not Path(path).is_file():
        return {}
    rows = json.loads(Path(path).read_text(encoding="utf-8")).get("rows", [])
    return {r["name"]: r for r in rows if r.get("status") in ("ok", "oom")}


def main(argv: Sequence[str]) -> int:
    """CLI: run the selected rows, print the table, write the JSON. Exit 0 unless no row ran at all."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="the subset that fits in ~5 minutes on an H100")
    ap.add_argument("--rows", nargs="+", default=[], help="only rows whose name contains one of these")
    ap.add_argument("--out", default=None, help="JSON file or directory (default benchmarks/data/)")
    ap.add_argument("--budget_s", type=float, default=540.0, help="stop starting rows after this many seconds")
    ap.add_argument("--row_timeout_s", type=float, default=300.0)
    ap.add_argument("--resume", default=None, metavar="JSON",
                    help="reuse the ok/oom rows of an earlier data file; run only the others")
    ap.add_argument("--in_process", action="store_true", help="no subprocess per row (CPU debugging)")
    ap.add_argument("--measure_only", action="store_true", help="no estimate on the device; --rescore adds it")
    ap.add_argument("--list", action="store_true", help="print the rows and exit")
    ap.add_argument("--rescore", default=None, metavar="JSON",
                    help="re-estimate a data file's measured rows with this checkout (no GPU), print, rewrite it")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(list(argv))
    if args.worker:
        row = next(r for r in ROWS if r.name == args.worker)
        print(RESULT_PREFIX + json.dumps(run_row(row, args.device)), flush=True)
        return 0
    if args.rescore:
        rescored = rescore(Path(args.rescore))
        doc = json.loads(Path(args.rescore).read_text(encoding="utf-8"))
        doc.update(rows=rescored, summary=summary(rescored),
                   rescored={"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "command": ["benchmarks/gpu_truth.py", *argv]})
        Path(args.rescore).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(format_table(rescored))
        print(json.dumps(summary(rescored)))
        return 0
    if args.measure_only:
        os.environ[MEASURE_ONLY] = "1"
    rows = select(args.device, args.quick, args.rows)
    if args.list:
        for r in rows:
            print(f"{r.name:34} {r.model:28} layers={r.layers or 'all'} {' '.join(r.argv(args.device))}")
        return 0
    start, results = time.perf_counter(), []
    done = _done_rows(args.resume)
    for row in rows:
        if row.name in done:
            results.append(done[row.name])
            continue
        left = args.budget_s - (time.perf_counter() - start)
        if left < 20:
            results.append({"name": row.name, "model": row.model, "status": "skipped", "error": "time budget"})
            continue
        print(f"... {row.name}", file=sys.stderr, flush=True)
        res = run_row(row, args.device) if args.in_process else run_in_subprocess(
            row, args.device, min(args.row_timeout_s, left))
        results.append(res)
        write_json(output_path(args.out, args.device, results), args.device, results, argv)
    if results:
        write_json(output_path(args.out, args.device, results), args.device, results, argv)
    print(format_table(results))
    print(json.dumps(summary(results)))
    if results:
        print(f"wrote {output_path(args.out, args.device, results)}")
    return 0 if any(r.get("status") in ("ok", "oom") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
