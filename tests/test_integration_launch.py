"""``fitcheck launch`` (stub launcher, no real accelerate process) and the ``python -m fitcheck.run`` hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from fitcheck.integrations import accelerate_launch as al

from fitcheck.cli import launch
from fitcheck.spec import Strategy

ROOT = Path(__file__).resolve().parents[1]
YAML = "examples/launch/accelerate_deepspeed_zero3.yaml"
SCRIPT = "examples/launch/train.py"
SCRIPT_ARGS = ["--model_name_or_path", "meta-llama/Llama-3.1-8B", "--per_device_train_batch_size", "8",
               "--max_seq_length", "4096", "--bf16", "--gradient_checkpointing", "--output_dir", "/tmp/out",
               "--my_own_flag", "x"]
ENV = {"HOME": "/nonexistent-home", "HF_HOME": "/nonexistent-hf-home"}


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the yaml names its DeepSpeed JSON relative to the working directory, as accelerate does


class StubLauncher:
    def __init__(self, code: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.code = code

    def __call__(self, cmd: Sequence[str]) -> int:
        self.calls.append(list(cmd))
        return self.code


def test_check_only_reports_per_gpu_memory_with_the_yamls_zero_stage_and_processes(
        capsys: pytest.CaptureFixture[str]) -> None:
    stub = StubLauncher()
    argv = ["--check-only", "--json", "--config_file", YAML, SCRIPT, *SCRIPT_ARGS]
    code = launch.main(argv, launcher=stub, env=ENV)
    out = json.loads(capsys.readouterr().out)
    assert stub.calls == []  # --check-only never launches
    assert code == (0 if out["fits"] else 1)
    assert out["strategy"] == "deepspeed" and out["num_processes"] == 8
    assert out["micro_batch"] == 8 and out["seq_len"] == 4096
    assert "buffers.zero3_gathered_params" in out["components"]  # ZeRO-3 only
    report = al.launch_report(al.split_argv(argv), ENV)
    ds = report.spec.sharding.deepspeed
    assert report.spec.sharding.strategy is Strategy.DEEPSPEED and ds is not None and ds.stage == 3
    # per GPU: the bf16 weights are sharded over the 8 ranks (ZeRO-3)
    assert out["components"]["weights.trainable"] == 8_030_261_248 * 2 // 8


def test_explicit_accelerate_flags_win_over_the_yaml() -> None:
    plan = al.split_argv(["--config_file", YAML, "--num_processes", "4", SCRIPT, *SCRIPT_ARGS])
    report = al.launch_report(plan, ENV)
    assert report.spec.sharding.num_processes == 4
    assert report.spec.sharding.deepspeed is not None and report.spec.sharding.deepspeed.stage == 3


def test_accelerate_parallelism_flags_reach_the_estimate() -> None:
    flags = ["--use_fsdp", "--fsdp_version", "2", "--num_processes", "8", "--use_parallelism_config",
             "--parallelism_config_dp_shard_size", "2", "--parallelism_config_cp_size", "4"]
    report = al.launch_report(al.split_argv([*flags, SCRIPT, *SCRIPT_ARGS]), ENV)
    par = report.spec.sharding.parallelism
    assert par is not None and (par.dp_shard, par.cp) == (2, 4)
    ignored = al.launch_report(al.split_argv([*[f for f in flags if f != "--use_parallelism_config"], SCRIPT,
                                              *SCRIPT_ARGS]), ENV)
    assert ignored.spec.sharding.parallelism is None
    assert "parallelism-flags-ignored" in {f.code for f in ignored.findings}


def test_launch_hands_the_exact_argv_to_accelerate(capsys: pytest.CaptureFixture[str]) -> None:
    stub = StubLauncher(code=7)
    accelerate_argv = ["--config_file", YAML, "--num_processes", "8", SCRIPT, *SCRIPT_ARGS, "--json"]
    code = launch.main(["--gpu", "H100-80GB", *accelerate_argv], launcher=stub, env=ENV)
    assert code == 7  # the child's exit code
    (cmd,) = stub.calls
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert cmd[3:] == accelerate_argv  # untouched, the script's own --json included
    assert "per-GPU memory" in capsys.readouterr().out


def test_fitcheck_flags_among_accelerate_flags_are_taken_out() -> None:
    plan = al.split_argv(["--config_file", YAML, "--check-only", "--num_processes", "2", SCRIPT, "--strict"])
    assert plan.check_only and not plan.strict  # --strict after the script belongs to the script
    assert plan.accelerate_argv == ["--config_file", YAML, "--num_processes", "2", SCRIPT, "--strict"]


def test_strict_refuses_a_run_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    stub = StubLauncher()
    code = launch.main(["--strict", "--gpu", "RTX4090-24GB", "--num_processes", "1", SCRIPT, *SCRIPT_ARGS],
                       launcher=stub, env=ENV)
    assert code == 1 and stub.calls == []
    assert "not launching" in capsys.readouterr().err


def test_bad_input_is_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.main(["--check-only", "--no_such_accelerate_flag", SCRIPT], env=ENV) == 2
    assert "accelerate launch" in capsys.readouterr().err
    assert launch.main(["--check-only", SCRIPT, "--bf16"], env=ENV) == 2  # no model anywhere
    assert "--model_name_or_path" in capsys.readouterr().err
    assert launch.main(["--check-only"], env=ENV) == 2
    assert launch.main(["--check-only", "--use_deepspeed", "--use_fsdp", SCRIPT, *SCRIPT_ARGS], env=ENV) == 2


def test_exec_through_a_stub_launcher_process(tmp_path: Path) -> None:
    """The real exec path: $FITCHECK_ACCELERATE_LAUNCHER stands in for `accelerate launch`."""
    stub = tmp_path / "stub.py"
    log = tmp_path / "argv.json"
    stub.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(log)!r}, 'w'))\nsys.exit(3)\n")
    env = {**os.environ, **ENV, "FITCHECK_ACCELERATE_LAUNCHER": f"{sys.executable} {stub}"}
    argv = ["--num_processes", "2", "--multi_gpu", SCRIPT, *SCRIPT_ARGS]
    proc = subprocess.run([sys.executable, "-m", "fitcheck.cli.main", "launch", "--gpu", "A100-80GB", *argv],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert json.loads(log.read_text()) == argv


def test_run_hook_adds_the_callback_to_every_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    from fitcheck.integrations import run as run_hook
    from fitcheck.integrations.trainer import FitcheckCallback

    opts, rest = run_hook.callback_options(["--strict", "--max_seq_length=64", "train.py", "--strict"],
                                           {"FITCHECK_RECORD": "r.json"})
    assert opts == {"strict": True, "max_seq_length": 64, "record_path": "r.json"} and rest == ["train.py", "--strict"]
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, transformers\n"
        "cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])\n"
        "model = transformers.AutoModelForCausalLM.from_config(cfg)\n"
        "args = transformers.TrainingArguments(output_dir=sys.argv[2], use_cpu=True, report_to='none')\n"
        "trainer = transformers.Trainer(model, args)\n"  # positional arguments, no callbacks
        "RESULT = trainer.callback_handler.callbacks\n"
    )
    monkeypatch.setattr(transformers.Trainer, "__init__", transformers.Trainer.__init__)  # restored afterwards
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    import runpy

    captured: dict[str, object] = {}
    real_run_path = runpy.run_path
    monkeypatch.setattr(runpy, "run_path",
                        lambda path, run_name: captured.update(real_run_path(path, run_name=run_name)))
    assert run_hook.main(["--max_seq_length", "32", str(script), str(ROOT / "examples" / "tiny-llama"),
                          str(tmp_path)]) == 0
    callbacks = captured["RESULT"]
    assert isinstance(callbacks, list)
    ours = [c for c in callbacks if isinstance(c, FitcheckCallback)]
    assert len(ours) == 1 and ours[0].report is not None and ours[0].report.spec.batch.seq_len == 32
    run_hook.install()  # idempotent: a second install does not wrap twice
    assert getattr(transformers.Trainer.__init__, "_fitcheck_wrapped", False)
