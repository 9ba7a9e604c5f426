"""Time of the default answer in a fresh process: the formula, one traced answer, the full traced report, each
traced one cold (an empty trace cache) and warm (what a cold run left in fitcheck's cache:
``fitcheck/torch_adapters/trace_cache.py``).

For each case (kinds of run outside the checked envelope, so that the default path traces), fresh interpreters
per mode, median of ``--repeat``, wall and CPU (user + sys of the child: on a shared machine the wall time also
counts the time waiting for a core, the CPU time does not):

- ``formula``: ``fitcheck estimate ... --no_trace --json`` (the formula answer with suggestions);
- ``traced answer``: the headline of the default path only (``PinnedPath("auto")(spec)``, what ``fitcheck.
  estimate`` and the callback ask), traces included;
- ``full report``: ``fitcheck estimate ... --json`` (the default path: headline, largest micro-batch,
  suggestions, every one traced the way the headline was);

each traced mode ``cold`` (every run with its own empty ``FITCHECK_CACHE_DIR``) and ``warm`` (the directory the
last cold run filled). Next to them the import floor (``python -c "import torch, transformers, peft"``; more than a
traced answer imports: a plain ``import peft`` compiles bitsandbytes' kernels through torch._inductor, the tracer
does not) and its parts (``import torch``, each case's ``transformers.models.<family>.modeling_<family>``, ``import
peft``, and each case's trace floor: the imports its traced answer makes besides fitcheck's own, made as the tracer
makes them, what a cold traced answer cannot go under: ``floor_rows``), the step traces
(``tracer.trace_step``) and optimizer traces (``tracer_optimizer.trace_optimizer``) each child ran, and whether the
warm full report printed the same bytes as the cold one. Issue 20's targets: formula <= 0.3 s, traced answer
<= 3 s, full report <= 5 s.

At the end, issue 20's three numbers per case against its targets (``print_targets``: formula, traced answer and
full report, cold and warm, median wall with the CPU seconds next to it, and by how much each misses). ``--issue20``
times the six configs of ``ISSUE20_CASES`` (Llama-3-8B QLoRA and Mistral-7B ZeRO-3, which the formula answers
pinned, Qwen2.5-7B LoRA, a TRL DPO run, Qwen3-8B QLoRA and GPT-2, which it traces) instead of ``CASES``.

Also the in-process time of each part after the imports (``--inproc``), and the number of traces run.

``--split`` instead runs one cold child per mode with hooks that split its CPU seconds into the imports (each
module's own body, by top-level package), building the model, the step and optimizer traces, the allocator
replay, and the rest: what a cold traced answer spends where, and the floor the library imports leave.

``--imports`` runs one cold traced answer per case under ``-X importtime``: its largest first-level imports and which
heavy packages (peft, bitsandbytes, trl, deepspeed, ...) it imported (``benchmarks/data/default_path_imports.json``).

Run: ``python benchmarks/default_path_speed.py [--repeat 3] [--issue20] [--no_floor] [--inproc] [--split]
[--imports] [--compile] [--json FILE] [case ...]``
(CPU, no network; the caches are temporary directories, removed at the end). Cases: those of ``CASES`` (the
default), and the four H100 rows of ``H100_ROWS`` by name. To time another checkout (e.g. ``main`` before issue
20), run it with ``PYTHONPATH=<that checkout>``: the children inherit it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CASES: dict[str, list[str]] = {
    # QLoRA on an fp32 load under bf16 autocast with checkpointing: not in the envelope (2026-11-23)
    "qwen3-8b-qlora": ["--model_name_or_path", "Qwen/Qwen3-8B", "--max_seq_length", "4096",
                       "--per_device_train_batch_size", "2", "--gradient_checkpointing", "--use_peft",
                       "--load_in_4bit", "--dtype", "float32", "--bf16", "--gpu", "H100-80GB"],
    # a full fine-tune of Gemma-7B with SDPA and checkpointing: not in the envelope
    "gemma-7b-full": ["--model_name_or_path", "google/gemma-7b", "--max_seq_length", "2048",
                      "--per_device_train_batch_size", "2", "--gradient_checkpointing", "--dtype", "bfloat16",
                      "--gpu", "H100-80GB"],
}
# issue 20's configs of session 19 (``--issue20``): two the formula answers pinned (its headline's whole run is
# still replayed: ``verdict_replay.NearBudget``), four it traces (outside the checked envelope), a TRL DPO among them
_H = ["--gpu", "H100-80GB"]
ISSUE20_CASES: dict[str, list[str]] = {
    "llama3-8b-qlora": ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--use_peft", "--load_in_4bit", "--bf16",
                        "--dtype", "bfloat16", "--gradient_checkpointing", "--per_device_train_batch_size", "4",
                        "--max_seq_length", "2048", *_H],
    "qwen2.5-7b-lora": ["--model_name_or_path", "Qwen/Qwen2.5-7B", "--use_peft", "--bf16", "--dtype", "bfloat16",
                        "--gradient_checkpointing", "--per_device_train_batch_size", "4", "--max_seq_length", "2048",
                        *_H],
    "mistral-7b-zero3": ["--model_name_or_path", "mistralai/Mistral-7B-v0.1", "--bf16", "--dtype", "bfloat16",
                         "--zero_stage", "3", "--num_processes", "8", "--gradient_checkpointing",
                         "--per_device_train_batch_size", "4", "--max_seq_length", "2048", *_H],
    "trl-dpo-qwen0.5b": ["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--trainer", "dpo", "--max_prompt_length",
                         "256", "--max_seq_length", "512", "--per_device_train_batch_size", "2", "--bf16", "--dtype",
                         "bfloat16", *_H],
    "qwen3-8b-qlora": CASES["qwen3-8b-qlora"],
    "gpt2-full": ["--model_name_or_path", "openai-community/gpt2", "--per_device_train_batch_size", "8",
                  "--max_seq_length", "1024", *_H],
}
# issue 20's targets, seconds of wall time in a fresh process on the 2-core development machine (median of 3)
TARGETS = {"formula": 0.3, "traced answer": 3.0, "full report": 5.0}
# the four Llama-3.2-1B rows measured on an H100 whose reserved memory the whole-run allocator replay answers
# (benchmarks/gpu_truth.py ROWS; the bf16 row is inside the checked envelope: the formula answers it, no trace)
_L1 = ["--model_name_or_path", "meta-llama/Llama-3.2-1B", "--dtype", "bfloat16", "--optim", "adamw_torch_fused",
       "--device_type", "cuda", "--gpu", "H100-80GB"]
_LORA = ["--use_peft", "--lora_r", "16", "--lora_alpha", "32", "--lora_target_modules", "all-linear"]
H100_ROWS: dict[str, list[str]] = {
    "h100-llama1b-bf16": [*_L1, "--per_device_train_batch_size", "4", "--max_seq_length", "1024"],
    "h100-llama1b-ckpt": [*_L1, "--gradient_checkpointing", "--per_device_train_batch_size", "8",
                          "--max_seq_length", "2048"],
    "h100-llama1b-lora": [*_L1, "--bf16", *_LORA, "--per_device_train_batch_size", "4", "--max_seq_length", "2048"],
    "h100-llama1b-qlora": [*_L1, "--bf16", "--load_in_4bit", "--bnb_4bit_quant_type", "nf4",
                           "--use_bnb_nested_quant", *_LORA, "--gradient_checkpointing",
                           "--per_device_train_batch_size", "4", "--max_seq_length", "2048"],
}

# counts the traces a child runs (printed to stderr at exit), before anything binds the tracer's functions
_COUNT = """
import atexit, sys
import fitcheck.torch_adapters.tracer as _tracer, fitcheck.torch_adapters.tracer_optimizer as _topt
_counts = {"step": 0, "optimizer": 0}
def _counted(name, real):
    def run(*args, **kwargs):
        _counts[name] += 1
        return real(*args, **kwargs)
    return run
_tracer.trace_step = _counted("step", _tracer.trace_step)
_topt.trace_optimizer = _counted("optimizer", _topt.trace_optimizer)
atexit.register(lambda: print("TRACES", _counts["step"], _counts["optimizer"], file=sys.stderr))
"""

# --split: where a child's CPU goes (time.process_time, exclusive of what nests inside): each import's own module
# body by top-level package (importlib's _find_and_load, the function every import statement calls on a module
# not yet in sys.modules), fitcheck's build of the model, each trace, the allocator replay, and the rest. The
# hooks only measure: no module is replaced.
_SPLIT = """
import atexit, collections, functools, json as _json, sys, time
import _frozen_importlib as _fi
_clock, _excl, _calls, _stack = time.process_time, collections.Counter(), collections.Counter(), []
def _enter(name):
    _stack.append([name, _clock(), 0.0])
def _leave():
    name, start, kids = _stack.pop()
    spent = _clock() - start
    _excl[name] += spent - kids
    _calls[name] += 1
    if _stack:
        _stack[-1][2] += spent
_HOOKS = {  # module -> (function, part): wrapped as the module is first imported, before anything binds them
    "fitcheck.torch_adapters.tracer_build": [("build_model", "build the model (transformers/peft on fake tensors)")],
    "fitcheck.torch_adapters.tracer": [("trace_step", "trace steps (fake tensors)")],
    "fitcheck.torch_adapters.tracer_optimizer": [("trace_optimizer", "trace optimizer steps")],
    "fitcheck.torch_adapters.allocator_replay": [("replay_whole_run", "allocator replay (compose, deepen, simulate)"),
                                                 ("replay_events", "allocator replay (compose, deepen, simulate)")],
    "fitcheck.torch_adapters.allocator_deepen": [("deepen", "allocator replay (compose, deepen, simulate)")],
}
def _timed(module, attr, label):
    real = getattr(module, attr)
    @functools.wraps(real)
    def run(*args, **kwargs):
        _enter(label)
        try:
            return real(*args, **kwargs)
        finally:
            _leave()
    setattr(module, attr, run)
_real_find_and_load = _fi._find_and_load
def _find_and_load(name, import_):
    _enter("import " + name.split(".")[0])
    try:
        module = _real_find_and_load(name, import_)
    finally:
        _leave()
    for attr, label in _HOOKS.pop(name, ()):
        _timed(module, attr, label)
    return module
_fi._find_and_load = _find_and_load
_T0 = _clock()
def _report():
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    parts = dict(_excl)
    parts["the rest (fitcheck's spec, formulas, advice, rendering; the interpreter)"] = (
        usage.ru_utime + usage.ru_stime - sum(parts.values()))
    print("SPLIT " + _json.dumps({"parts": parts, "calls": dict(_calls)}), file=sys.stderr)
atexit.register(_report)
"""

_REPORT = """
import sys
from fitcheck.cli.main import console
sys.argv = ["fitcheck", "estimate", *sys.argv[1:]]
console()  # what the ``fitcheck`` console script runs, its exit included
"""

_ANSWER = """
import os, sys, warnings
warnings.simplefilter("ignore")
from fitcheck.cli import build_parser, spec_from_args
from fitcheck.torch_adapters import PinnedPath, cache_from_environment
args = build_parser().parse_args(["estimate", *sys.argv[1:]])
spec, _ = spec_from_args(args)
path = PinnedPath("auto", cache=cache_from_environment(os.environ))
report = path(spec)
traced = any(c.name == "activations.traced" for c in report.components)
print("traced" if traced else "formula", "pinned" if report.pinned else "not pinned", report.peak_allocated_bytes,
      report.peak_reserved_bytes)
import atexit
atexit._run_exitfuncs()  # the console script's exit (fitcheck.cli.main.console): no interpreter teardown
sys.stdout.flush()
os._exit(0)
"""


class Run:
    """One fresh child: wall and CPU seconds, its stdout, the step and optimizer traces it ran, and (``--split``)
    where its CPU went."""

    def __init__(self, wall: float, cpu: float, stdout: str, traces: tuple[int, int],
                 split: dict[str, Any] | None = None) -> None:
        self.wall, self.cpu, self.stdout, self.traces, self.split = wall, cpu, stdout, traces, split

    @property
    def answer(self) -> str:
        """The last line of its stdout."""
        lines = self.stdout.strip().splitlines()
        return lines[-1] if lines else ""


def _child(argv: list[str], cache: str = "off") -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "FITCHECK_CACHE_DIR": cache}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{argv}: exit {out.returncode}\n{out.stderr[-2000:]}")
    counted = [line.split()[1:] for line in out.stderr.splitlines() if line.startswith("TRACES ")]
    traces = (int(counted[-1][0]), int(counted[-1][1])) if counted else (0, 0)
    split = [json.loads(line[6:]) for line in out.stderr.splitlines() if line.startswith("SPLIT ")]
    return Run(wall, cpu, out.stdout, traces, split[-1] if split else None)


def modes(flags: list[str]) -> dict[str, list[str]]:
    """argv per mode for one case."""
    return {
        "formula": [sys.executable, "-m", "fitcheck.cli.main", "estimate", *flags, "--json", "--no_trace"],
        "traced answer": [sys.executable, "-c", _COUNT + _ANSWER, *flags],
        "full report": [sys.executable, "-c", _COUNT + _REPORT, *flags, "--json"],
    }


def _row(name: str, mode: str, cache: str, runs: list[Run], note: str = "") -> dict[str, Any]:
    """Print and return one row (medians)."""
    row = {"case": name, "mode": mode, "cache": cache, "wall_s": round(statistics.median(r.wall for r in runs), 2),
           "cpu_s": round(statistics.median(r.cpu for r in runs), 2), "step_traces": runs[-1].traces[0],
           "optimizer_traces": runs[-1].traces[1], "note": note}
    print(f"{name:16} {mode:14} {cache:5} {row['wall_s']:10.2f} s {row['cpu_s']:9.2f} s {row['step_traces']:7} "
          f"{row['optimizer_traces']:5}  {note}", flush=True)
    return row


def time_case(name: str, flags: list[str], repeat: int) -> list[dict[str, Any]]:
    """Formula, then each traced mode cold (an empty cache per run) and warm (the last cold run's cache)."""
    argvs = modes(flags)
    rows = [_row(name, "formula", "-", [_child(argvs["formula"]) for _ in range(repeat)])]
    for mode in ("traced answer", "full report"):
        dirs = [tempfile.mkdtemp(prefix="fitcheck-speed-") for _ in range(repeat)]
        try:
            cold = [_child(argvs[mode], d) for d in dirs]
            warm = [_child(argvs[mode], dirs[-1]) for _ in range(repeat)]
        finally:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
        answer = cold[-1].answer[:60] if mode == "traced answer" else ""
        same = "same stdout as cold" if all(w.stdout == cold[-1].stdout for w in warm) else "STDOUT DIFFERS FROM COLD"
        rows.append(_row(name, mode, "cold", cold, answer))
        rows.append(_row(name, mode, "warm", warm, same))
    return rows


def print_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 20's three numbers per case (the medians of :func:`time_case`'s rows) against :data:`TARGETS`: wall
    seconds, CPU seconds in brackets (on a shared machine the wall also counts the wait for a core), and by how
    much each misses its target."""
    out = []
    print("\nissue 20's targets: formula <= 0.3 s, traced answer <= 3 s, full report <= 5 s (median wall of the fresh "
          "processes; CPU seconds in brackets; '+x' = over the target by x s)")
    print(f"{'case':18} {'formula':>22} {'traced answer cold':>22} {'traced answer warm':>22} "
          f"{'full report cold':>22} {'full report warm':>22}")
    for case in dict.fromkeys(r["case"] for r in rows if r["mode"] in TARGETS):
        got = {(r["mode"], r["cache"]): r for r in rows if r["case"] == case}
        cells, row = [], {"case": case}
        for mode, cache in (("formula", "-"), ("traced answer", "cold"), ("traced answer", "warm"),
                            ("full report", "cold"), ("full report", "warm")):
            r = got.get((mode, cache))
            if r is None:
                cells.append(f"{'-':>22}")
                continue
            over = r["wall_s"] - TARGETS[mode]
            cells.append((f"{r['wall_s']:.2f} ({r['cpu_s']:.2f}) " + (f"+{over:.2f}" if over > 0 else "ok")).rjust(22))
            row[f"{mode} {cache}".strip(" -")] = {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
                                                  "over_target_s": round(max(over, 0.0), 2)}
        print(f"{case:18} " + " ".join(cells))
        out.append(row)
    return out


# the packages a split names on its own line; every other import is summed as "other imports"
_NAMED = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "deepspeed", "sympy", "scipy",
          "numpy", "huggingface_hub", "fitcheck")


def split_case(name: str, flags: list[str]) -> list[dict[str, Any]]:
    """One cold child per mode (formula, traced answer, full report) with the ``_SPLIT`` hooks: its CPU by part
    (imports by package, building the model, traces, replay, the rest), printed and returned."""
    rows = []
    for mode, argv in modes(flags).items():
        code_at = argv.index("-c") + 1 if "-c" in argv else None
        if code_at is None:  # the formula child runs the module: the same, through -c, with the hooks first
            argv = [sys.executable, "-c", _REPORT, *argv[argv.index("estimate") + 1:]]
            code_at = 2
        argv = [*argv[:code_at], _SPLIT + argv[code_at], *argv[code_at + 1:]]
        with tempfile.TemporaryDirectory(prefix="fitcheck-split-") as cache:
            run = _child(argv, cache)
        parts: dict[str, float] = dict(run.split["parts"]) if run.split else {}
        calls: dict[str, int] = dict(run.split["calls"]) if run.split else {}
        imports = {k[len("import "):]: v for k, v in parts.items() if k.startswith("import ")}
        named = {k: imports.pop(k, 0.0) for k in _NAMED}
        print(f"{name} / {mode}: {run.cpu:.2f} CPU-s, {run.wall:.2f} s wall (one cold child, hooks on)")
        lines = [(f"import {k}", v, "") for k, v in named.items() if v >= 0.005]
        lines.append(("other imports", sum(imports.values()), ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(imports.items(), key=lambda kv: -kv[1])[:6])))
        lines += [(k, v, f"{calls[k]} calls" if k in calls else "") for k, v in parts.items()
                  if not k.startswith("import ")]
        for label, cpu, note in lines:
            print(f"  {cpu:7.2f} CPU-s  {label:70} {note}")
            rows.append({"case": name, "mode": mode, "part": label, "cpu_s": round(cpu, 3), "note": note})
    return rows


def _family(flags: list[str]) -> str:
    """The case's ``model_type`` (its config.json in fitcheck's catalog)."""
    from fitcheck.catalog import find_catalog_config

    found = find_catalog_config(flags[flags.index("--model_name_or_path") + 1])
    if found is None:
        raise SystemExit(f"not in the catalog: {flags}")
    return str(found[0]["model_type"])


def floor_rows(cases: list[list[str]], repeat: int) -> list[dict[str, Any]]:
    """What a cold traced answer cannot go under, each in fresh processes (median of ``repeat``): ``import torch``,
    each case's ``transformers.models.<family>.modeling_<family>`` (torch; transformers 5.23 ``masking_utils.py``
    line 19 imports ``torch._dynamo._trace_wrapped_higher_order_op``, whose package ``__init__`` imports all of
    torch._dynamo and, through ``torch.fx.experimental.symbolic_shapes``, sympy; ``modeling_utils`` imports
    accelerate; scipy is only looked up, with ``importlib.util.find_spec``, never imported), ``import peft`` (peft
    0.21.2's ``__init__`` imports every tuner, and ``peft/helpers.py`` bitsandbytes, whose ops compile through
    torch._inductor when imported plainly), and per case its trace floor (:func:`trace_floor_code`): what the traced
    answer itself imports besides fitcheck."""
    imports = {"(import torch)": "import torch"}
    for family in dict.fromkeys(_family(flags) for flags in cases):
        imports[f"(import modeling_{family})"] = f"import transformers.models.{family}.modeling_{family}"
    imports["(import peft)"] = "import peft"
    for flags in cases:
        code = trace_floor_code(flags)
        imports.setdefault(f"(trace floor {code.splitlines()[0].split('.')[-1]}"
                           f"{' + peft' if 'peft' in code else ''}{' + trl' if 'trl' in code else ''})", code)
    return [_row(name, "", "-", [_child([sys.executable, "-c", code]) for _ in range(repeat)],
                 code.replace("\n", "; ")) for name, code in imports.items()]


def trace_floor_code(flags: list[str]) -> str:
    """The imports a cold traced answer of ``flags`` makes besides fitcheck's own, as the tracer makes them: the
    model's modeling module (what ``getattr(transformers, architecture)`` imports), for a PEFT or k-bit run
    bitsandbytes the way ``tracer_patches.bitsandbytes_uncompiled`` imports it (no inductor) and then peft, for a
    TRL trainer the same bitsandbytes and then ``trl.trainer.utils`` (``tracer_trl.triton_folds``). Measured
    against the ``-X importtime`` log of the traced answers (session 20): nothing else outside fitcheck but a few
    ms of transformers integrations."""
    family = _family(flags)
    lines = [f"import transformers.models.{family}.modeling_{family}"]
    peft = any(f in flags for f in ("--use_peft", "--load_in_4bit", "--load_in_8bit"))
    if peft or "--trainer" in flags:  # trl.trainer.utils imports peft too (transformers' trainer_utils)
        lines += ["from fitcheck.torch_adapters import bitsandbytes_uncompiled", "bitsandbytes_uncompiled()"]
    if peft:
        lines.append("import peft")
    if "--trainer" in flags:
        lines.append("import trl.trainer.utils")
    return "\n".join(lines)


def _top_imports(stderr: str, top: int) -> list[tuple[str, float]]:
    """The ``top`` largest cumulative entries of a ``-X importtime`` log that no other import nests (what the
    script and fitcheck's functions imported themselves), in seconds."""
    entries = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, cumulative, name = line.split("|")
        if len(name) - len(name.lstrip()) == 1:  # one space: a first-level import (nested ones are indented more)
            entries.append((name.strip(), int(cumulative) / 1e6))
    return sorted(entries, key=lambda e: -e[1])[:top]


# packages a traced answer may import; which it did is printed per case
_WATCHED = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "deepspeed", "scipy", "sympy",
            "torch._dynamo", "transformers.generation.utils", "transformers.models.auto.modeling_auto",
            "transformers.trainer")


def imports_case(name: str, flags: list[str], top: int = 12) -> list[dict[str, Any]]:
    """One cold traced answer under ``-X importtime``: its ``top`` largest first-level imports (cumulative seconds,
    inflated by the log itself) and which of ``_WATCHED`` it imported."""
    said = f"print('IMPORTED', *[m for m in {_WATCHED!r} if m in sys.modules], file=sys.stderr)\n"
    probe = _ANSWER.replace("import atexit\n", "import atexit\n" + said, 1)
    with tempfile.TemporaryDirectory(prefix="fitcheck-imports-") as cache:
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "FITCHECK_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", probe, *flags], capture_output=True,
                             text=True, env=env, check=False)
    lists = [line.split()[1:] for line in out.stderr.splitlines() if line.startswith("IMPORTED")]
    imported, tops = (lists[-1] if lists else []), _top_imports(out.stderr, top)
    print(f"{name}: {out.stdout.strip()[:60]}\n  imported: {' '.join(imported)}")
    for module, seconds in tops:
        print(f"  {seconds:7.2f} s  {module}")
    return [{"case": name, "mode": "traced answer", "answer": out.stdout.strip()[:60], "imported": imported,
             "top_imports_s": tops}]


def inproc(flags: list[str]) -> None:
    """Time the parts in one process after the imports: the headline, the largest micro-batch, suggestions."""
    import warnings

    warnings.simplefilter("ignore")
    t = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from fitcheck.advice import advise, max_micro_batch
    from fitcheck.cli import build_parser, spec_from_args
    from fitcheck.torch_adapters import PinnedPath

    print(f"  imports (torch, transformers, fitcheck): {time.perf_counter() - t:.2f} s")

    def traces() -> int:  # traces run so far: one per depth of each micro-batch traced, per kind of step
        return sum(len(b.traced) * len(b.plan) for b in path._traces.values())

    spec, _ = spec_from_args(build_parser().parse_args(["estimate", *flags]))
    path = PinnedPath("auto")
    t = time.perf_counter()
    report = path(spec)
    t1, n1 = time.perf_counter(), traces()
    follow = path.following(report)
    m = max_micro_batch(report.spec, follow)
    t2, n2 = time.perf_counter(), traces()
    sugg = advise(report.spec, report, estimate_fn=follow)
    t3 = time.perf_counter()
    print(f"  headline {t1 - t:.2f} s ({n1} traces, first-use imports included; reserved "
          f"{report.peak_reserved_bytes}), largest micro-batch {m}: "
          f"{t2 - t1:.2f} s ({n2 - n1} traces), {len(sugg)} suggestions: {t3 - t2:.2f} s ({traces() - n2} "
          f"traces)")


def _bytecode(compile_first: bool) -> None:
    """Say whether the children read cached bytecode, and write it first if asked.

    With ``PYTHONDONTWRITEBYTECODE`` set (as on the CI machine) and no ``__pycache__`` in a source checkout, every
    fresh process compiles fitcheck's ~170 modules again: about 0.6 s of CPU that an installed package (``pip
    install`` writes the bytecode) does not pay.
    """
    import compileall

    import fitcheck

    root = os.path.dirname(fitcheck.__file__)
    if compile_first:
        compileall.compile_dir(root, quiet=1)
    cached = os.path.isdir(os.path.join(root, "__pycache__"))
    print(f"fitcheck at {root}: bytecode {'cached' if cached else 'NOT cached (compiled in every child)'}; "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")


def _write_json(path: str, machine: str, **fields: Any) -> None:
    """The ``--json`` file: the machine and its load, the date (UTC), then ``fields`` in order."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump({"machine": machine, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **fields}, out,
                  indent=1)
        out.write("\n")


def main(argv: list[str]) -> int:
    """Print the table (median of --repeat fresh processes per mode)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inproc", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="write fitcheck's bytecode first, as `pip install` does (compileall)")
    ap.add_argument("--split", action="store_true",
                    help="one cold child per mode with hooks that split its CPU: imports by package, building the "
                    "model, traces, the allocator replay, the rest")
    ap.add_argument("--imports", action="store_true",
                    help="one cold traced answer per case under -X importtime: its largest first-level imports and "
                    "which of torch, transformers, peft, bitsandbytes, trl, deepspeed, ... it imported")
    ap.add_argument("--no_floor", action="store_true",
                    help="skip the import-floor rows (python alone, import torch / transformers / peft)")
    ap.add_argument("--issue20", action="store_true",
                    help="the six configs of ISSUE20_CASES (QLoRA, LoRA, ZeRO-3, TRL DPO, GPT-2) instead of CASES")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON (benchmarks/data/)")
    ap.add_argument("cases", nargs="*")
    ns = ap.parse_args(argv)
    cases = {**CASES, **H100_ROWS, **ISSUE20_CASES}
    names = ns.cases or list(ISSUE20_CASES if ns.issue20 else CASES)
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.1f} on {os.cpu_count()} cores")
    _bytecode(ns.compile)
    if ns.inproc:
        for name in names:
            print(name)
            inproc(cases[name])
        return 0
    if ns.imports:
        import_rows = [row for name in names for row in imports_case(name, cases[name])]
        if ns.json:
            _write_json(ns.json, f"{os.cpu_count()} cores, load average {load:.1f} at start", imports=import_rows)
        return 0
    if ns.split:
        split_rows = [row for name in names for row in split_case(name, cases[name])]
        if ns.json:
            _write_json(ns.json, f"{os.cpu_count()} cores, load average {load:.1f} at start", split=split_rows)
        return 0
    print(f"{'case':16} {'mode':14} {'cache':5} {'wall (median)':>12} {'cpu (median)':>11} {'traces':>7} "
          f"{'optim':>5}  answer")
    rows = [_row("(python alone)", "", "-", [_child([sys.executable, "-c", "pass"]) for _ in range(ns.repeat)],
                 "the interpreter and site, no fitcheck")]
    if not ns.no_floor:
        rows.append(_row("(import floor)", "", "-", [_child([sys.executable, "-c", "import torch, transformers, peft"])
                                                   for _ in range(ns.repeat)], "import torch, transformers, peft"))
        rows += floor_rows([cases[name] for name in names], ns.repeat)
    for name in [None, *names]:  # the JSON is written after each case: a run cut short keeps what it measured
        rows += time_case(name, cases[name], ns.repeat) if name else []
        if ns.json:
            _write_json(ns.json, f"{os.cpu_count()} cores, load average {load:.1f} at start, "
                        f"{os.getloadavg()[0]:.1f} at this write", repeat=ns.repeat, rows=rows)
    summary = print_targets(rows)
    if ns.json:
        with open(ns.json, encoding="utf-8") as fh:
            data = json.load(fh)
        with open(ns.json, "w", encoding="utf-8") as out:
            json.dump({**data, "targets": TARGETS, "summary": summary}, out, indent=1)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
