"""Time of the default answer in a fresh process: the formula, one traced answer, the full traced report.

For each case (kinds of run outside the checked envelope, so that the default path traces), three fresh
interpreters per mode, median of 3, wall and CPU (user + sys of the child: on a shared machine the wall time
also counts the time waiting for a core, the CPU time does not):

- ``formula``: ``fitcheck estimate ... --no_trace --json`` (the formula answer with suggestions);
- ``traced answer``: the headline of the default path only (``PinnedPath("auto")(spec)``, what ``fitcheck.
  estimate`` and the callback ask), traces included;
- ``full report``: ``fitcheck estimate ... --json`` (the default path: headline, largest micro-batch,
  suggestions, every one traced the way the headline was).

Also the in-process time of each part after the imports (``--inproc``), and the number of traces run.
Issue 20's targets: formula <= 0.3 s, traced answer <= 3 s, full report <= 5 s.

Run: ``python benchmarks/default_path_speed.py [--repeat 3] [--inproc] [--compile] [case ...]`` (CPU, no
network). Cases: those of ``CASES`` (the default), and the four H100 rows of ``H100_ROWS`` by name. To time
another checkout (e.g. ``main`` before issue 20), run it with ``PYTHONPATH=<that checkout>``:
the children inherit it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

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

_ANSWER = """
import sys, warnings
warnings.simplefilter("ignore")
from fitcheck.cli import build_parser, spec_from_args
from fitcheck.torch_adapters import PinnedPath
args = build_parser().parse_args(["estimate", *sys.argv[1:]])
spec, _ = spec_from_args(args)
path = PinnedPath("auto")
report = path(spec)
traced = any(c.name == "activations.traced" for c in report.components)
print("traced" if traced else "formula", "pinned" if report.pinned else "not pinned", report.peak_allocated_bytes,
      report.peak_reserved_bytes)
"""


def _child(argv: list[str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                         check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{argv}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return wall, cpu, out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def modes(flags: list[str]) -> dict[str, list[str]]:
    """argv per mode for one case."""
    cli = [sys.executable, "-m", "fitcheck.cli.main", "estimate", *flags, "--json"]
    return {
        "formula": [*cli, "--no_trace"],
        "traced answer": [sys.executable, "-c", _ANSWER, *flags],
        "full report": cli,
    }


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


def main(argv: list[str]) -> int:
    """Print the table (median of --repeat fresh processes per mode)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inproc", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="write fitcheck's bytecode first, as `pip install` does (compileall)")
    ap.add_argument("cases", nargs="*")
    ns = ap.parse_args(argv)
    cases = {**CASES, **H100_ROWS}
    names = ns.cases or list(CASES)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    _bytecode(ns.compile)
    print(f"{'case':16} {'mode':14} {'wall (median)':>14} {'cpu (median)':>13}  answer")
    floor = [_child([sys.executable, "-c", "pass"]) for _ in range(ns.repeat)]
    print(f"{'(python alone)':16} {'':14} {statistics.median(r[0] for r in floor):12.2f} s "
          f"{statistics.median(r[1] for r in floor):11.2f} s  the interpreter and site, no fitcheck")
    for name in names:
        if ns.inproc:
            print(name)
            inproc(cases[name])
            continue
        for mode, cmd in modes(cases[name]).items():
            runs = [_child(cmd) for _ in range(ns.repeat)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            answer = runs[-1][2][:60] if mode == "traced answer" else ""
            print(f"{name:16} {mode:14} {wall:12.2f} s {cpu:11.2f} s  {answer}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
