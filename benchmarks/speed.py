"""Wall time of ``fitcheck estimate`` vs ``accelerate estimate-memory`` on the same config.json, in one run.

Each command runs in a fresh interpreter (``subprocess``), so the times include Python start-up and imports —
what a user waits for. Both read the catalog's ``meta-llama/Meta-Llama-3-70B`` config.json; no network.

How the accelerate side is run offline: ``accelerate estimate-memory`` needs a Hub id because
``create_empty_model`` first calls ``verify_on_hub`` (``huggingface_hub.model_info``, a network request)
and then ``AutoConfig.from_pretrained(model_name)``. Everything after that is local, so this benchmark runs
the same steps as ``accelerate/commands/estimate.py`` without the Hub call:
``AutoConfig.from_pretrained(<dir with the config.json>)``, ``with init_empty_weights():
AutoModel.from_config(config, torch_dtype=torch.float32)`` (the constructor ``create_empty_model`` picks for a
config without ``auto_map``), ``calculate_maximum_sizes``, ``estimate_training_usage`` for float32/float16,
and ``create_ascii_table`` - i.e. ``gather_data`` + ``estimate_command`` with the model built from the local
file. ``HF_HUB_OFFLINE=1`` is set for both sides.

It also checks that ``fitcheck estimate`` on a known family answers without importing torch (or
transformers): the probe runs the CLI in-process and reports ``sys.modules`` at exit.

Run: ``python benchmarks/speed.py [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODEL_ID = "meta-llama/Meta-Llama-3-70B"
ROOT = Path(__file__).resolve().parent.parent


def catalog_config_dir(model_id: str = MODEL_ID) -> Path:
    """Directory of the catalog's config.json for a Hub id."""
    import fitcheck

    path = Path(fitcheck.__file__).parent / "catalog" / "models" / model_id
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no catalog config.json for {model_id} at {path}")
    return path


def fitcheck_command(model: str = MODEL_ID) -> list[str]:
    """argv of the fitcheck CLI run (the contract's flags for a bf16 full fine-tune), answered from the checked
    formulas (``--no_trace``): like accelerate's calculator, no trace. Without the flag, where torch is installed, a
    figure near the budget (a suggestion's, the largest micro-batch's boundary) is replayed through the caching
    allocator, which imports torch and traces (``torch_adapters/verdict_replay.py``; ``default_path_speed.py``
    times that path)."""
    return [sys.executable, "-m", "fitcheck.cli.main", "estimate", "--model_name_or_path", model,
            "--dtype", "bfloat16", "--bf16", "--json", "--no_trace"]  # fmt: skip


# The accelerate estimate-memory pipeline on a local config.json (see the module docstring).
_ACCELERATE_SNIPPET = """
import sys, torch
from transformers import AutoConfig, AutoModel
from accelerate import init_empty_weights
from accelerate.commands.estimate import create_ascii_table, estimate_training_usage
from accelerate.utils import calculate_maximum_sizes, convert_bytes
config = AutoConfig.from_pretrained(sys.argv[1])
with init_empty_weights():
    model = AutoModel.from_config(config, torch_dtype=torch.float32)
total_size, largest_layer = calculate_maximum_sizes(model)
rows = []
for dtype in ("float32", "float16"):
    training = estimate_training_usage(total_size, dtype)
    div = 2 if dtype == "float16" else 1
    rows.append([dtype, convert_bytes(largest_layer[0] / div), convert_bytes(total_size / div),
                 convert_bytes(max(training.values()))])
print(create_ascii_table(["dtype", "Largest Layer", "Total Size", "Training using Adam"], rows, "local"))
"""

# Runs the fitcheck CLI in-process and records which heavy modules were imported.
_PROBE_SNIPPET = """
import json, runpy, sys
out = sys.argv[1]
sys.argv = ["fitcheck", *sys.argv[2:]]
try:
    runpy.run_module("fitcheck.cli.main", run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 2
except BaseException as exc:
    code = f"{type(exc).__name__}: {exc}"
heavy = ("torch", "transformers", "accelerate", "peft", "rich", "yaml", "importlib.metadata")
with open(out, "w") as fh:
    json.dump({"exit": code, **{m: m in sys.modules for m in heavy}}, fh)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def time_command(argv: Sequence[str], repeat: int) -> tuple[list[float], subprocess.CompletedProcess[str]]:
    """Wall times of ``repeat`` fresh runs of a command, and the last run's result."""
    times: list[float] = []
    result: subprocess.CompletedProcess[str] | None = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = subprocess.run(list(argv), capture_output=True, text=True, env=_env(), cwd=ROOT, check=False)
        times.append(time.perf_counter() - start)
    assert result is not None
    return times, result


def modules_imported_by_fitcheck(model: str = MODEL_ID) -> dict[str, object]:
    """Which of torch/transformers/accelerate/peft (and rich, PyYAML, importlib.metadata, which a ``--json`` answer
    from config.json does not need) ``fitcheck estimate`` imported for ``model``.

    Returns:
        ``{"exit": <exit code or error>, "torch": bool, "transformers": bool, ...}``.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "modules.json"
        argv = [sys.executable, "-c", _PROBE_SNIPPET, str(out), *fitcheck_command(model)[3:]]
        subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=ROOT, check=False)
        if not out.exists():
            raise RuntimeError("the probe did not report (fitcheck estimate crashed before exit)")
        data: dict[str, object] = json.loads(out.read_text())
        return data


def _json_or_none(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and "fits" in data else None


def main(argv: Sequence[str] | None = None) -> int:
    """Time both tools, print the table and the torch-free check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    cfg_dir = catalog_config_dir()
    fc_times, fc = time_command(fitcheck_command(), args.repeat)
    ac_times, ac = time_command([sys.executable, "-c", _ACCELERATE_SNIPPET, str(cfg_dir)], args.repeat)
    print(f"model: {MODEL_ID} (config.json: {cfg_dir / 'config.json'}); {args.repeat} fresh runs each\n")
    print(f"{'command':<42}{'min s':>8}{'median s':>10}  exit")
    print(f"{'fitcheck estimate (bf16 full FT, --json)':<42}{min(fc_times):>8.2f}"
          f"{statistics.median(fc_times):>10.2f}  {fc.returncode}")  # fmt: skip
    print(f"{'accelerate estimate-memory (local config)':<42}{min(ac_times):>8.2f}"
          f"{statistics.median(ac_times):>10.2f}  {ac.returncode}")  # fmt: skip
    report = _json_or_none(fc.stdout) if fc.returncode in (0, 1) else None
    if report is None:
        print("\nfitcheck failed (no JSON report):\n" + fc.stderr[-2000:])
    else:
        gib = 1024**3
        print(f"\nfitcheck: peak_allocated {report['peak_allocated_bytes'] / gib:.1f} GiB, "
              f"device_used {report['device_used_bytes'] / gib:.1f} GiB, fits={report['fits']}")  # fmt: skip
    if ac.returncode != 0:
        print("\naccelerate failed:\n" + ac.stderr[-2000:])
    else:
        print("\naccelerate:\n" + ac.stdout)
    mods = modules_imported_by_fitcheck()
    print(f"`fitcheck estimate` on a known family (exit {mods.pop('exit')}) imported: "
          + ", ".join(f"{m}={'yes' if v else 'no'}" for m, v in mods.items()))  # fmt: skip
    return 0 if not mods["torch"] and report is not None and ac.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
