"""Every example runs (CPU, tiny model from config, no downloads) and says what its README promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(*argv: str, timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout)


def test_every_example_is_covered_here() -> None:
    # _tiny.py is the examples' shared helper module (tiny config path, random-token dataset), not an example.
    scripts = {p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.py") if not p.name.startswith("_")}
    assert scripts == {"train_with_callback.py", "qlora.py", "launch/train.py"}


@pytest.mark.slow
def test_train_with_callback(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    proc = _run("examples/train_with_callback.py", "--record", str(record))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "preflight: fits" in proc.stdout and "fitcheck: step 2: predicted" in proc.stdout
    data = json.loads(record.read_text())
    assert data["measured"]["live_tensor_peak"] > 0 and abs(data["relative_error"]) < 0.05


@pytest.mark.slow
def test_qlora(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    proc = _run("examples/qlora.py", env={**ENV, "FITCHECK_RECORD": str(record)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Llama-3.1-8B QLoRA on RTX4090-24GB at seq 2048" in proc.stdout
    data = json.loads(record.read_text())
    assert "quantized" in data["regime"] and data["measured"]["step"] == 2


def test_launch_check_only_with_the_deepspeed_pair() -> None:
    proc = _run("-m", "fitcheck.cli.main", "launch", "--check-only", "--json",
                "--config_file", "examples/launch/accelerate_deepspeed_zero3.yaml", "examples/launch/train.py",
                "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--per_device_train_batch_size", "8",
                "--max_seq_length", "4096", "--bf16", "--gradient_checkpointing", "--output_dir", "/tmp/out")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["strategy"] == "deepspeed" and out["num_processes"] == 8
    assert proc.returncode == (0 if out["fits"] else 1)


@pytest.mark.slow
def test_launch_example_script_trains_one_step(tmp_path: Path) -> None:
    proc = _run("examples/launch/train.py", "--model_name_or_path", "examples/tiny-llama", "--output_dir",
                str(tmp_path), "--max_steps", "1", "--per_device_train_batch_size", "2", "--max_seq_length", "64",
                "--use_cpu", "--report_to", "none", "--save_strategy", "no")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_zero_code_hook_on_the_launch_script(tmp_path: Path) -> None:
    proc = _run("-m", "fitcheck.run", "--max_seq_length", "64", "examples/launch/train.py",
                "--model_name_or_path", "examples/tiny-llama", "--output_dir", str(tmp_path), "--max_steps", "2",
                "--per_device_train_batch_size", "2", "--max_seq_length", "64", "--use_cpu", "--report_to", "none",
                "--save_strategy", "no")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fitcheck: step 2: predicted" in proc.stdout
