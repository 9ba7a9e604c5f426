"""``fitcheck launch`` against accelerate 1.15's own launch logic (issue 11): processes started, CPU flags, and
which script flags are really not TrainingArguments/TRL names. Each test failed before the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from fitcheck.integrations import accelerate_launch as al

from fitcheck.spec import DeviceType

ENV = {"HOME": "/nonexistent-home", "HF_HOME": "/nonexistent-hf-home"}
MODEL = ["--model_name_or_path", "meta-llama/Llama-3.2-1B", "--per_device_train_batch_size", "2"]


def _yaml(tmp_path: Path, distributed_type: str, *extra: str) -> str:
    path = tmp_path / "accelerate.yaml"
    path.write_text("\n".join([
        "compute_environment: LOCAL_MACHINE", f"distributed_type: '{distributed_type}'", "num_processes: 2",
        "num_machines: 1", "machine_rank: 0", "mixed_precision: 'no'", *extra, ""]))
    return str(path)


def _report(argv: list[str]) -> object:
    return al.launch_report(al.split_argv(argv), ENV)


def test_multi_cpu_with_two_processes_starts_one_process(tmp_path: Path) -> None:
    # accelerate 1.15 launch_command: MULTI_CPU goes to simple_launcher (one process without --mpirun_hostfile)
    report = _report(["--config_file", _yaml(tmp_path, "MULTI_CPU"), "train.py", *MODEL])
    assert report.spec.sharding.num_processes == 1  # type: ignore[attr-defined]
    multi_gpu = _report(["--config_file", _yaml(tmp_path, "MULTI_GPU"), "train.py", *MODEL])
    assert multi_gpu.spec.sharding.num_processes == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize(("yaml_extra", "flags", "script_flags"), [
    (("use_cpu: true",), [], []),
    ((), ["--cpu"], []),
    ((), [], ["--use_cpu"]),
], ids=["yaml use_cpu", "accelerate --cpu", "script --use_cpu"])
def test_cpu_flags_make_a_cpu_run(tmp_path: Path, yaml_extra: tuple[str, ...], flags: list[str],
                                  script_flags: list[str]) -> None:
    yaml = _yaml(tmp_path, "NO", *yaml_extra)
    report = _report(["--config_file", yaml, *flags, "train.py", *MODEL, *script_flags])
    assert report.spec.hardware.device_type is DeviceType.CPU  # type: ignore[attr-defined]


def test_only_real_unknowns_are_listed_as_not_trainingarguments_names(tmp_path: Path) -> None:
    argv = ["--config_file", _yaml(tmp_path, "NO"), "train.py", *MODEL, "--output_dir", "/tmp/o", "--max_steps",
            "3", "--logging_steps", "1", "--dataset_name", "x", "--my_own_flag", "y"]
    report = _report(argv)
    passed = [f.message for f in report.findings if f.code == "script-flags-passed-over"]  # type: ignore[attr-defined]
    assert len(passed) == 1 and "--my_own_flag" in passed[0]
    for name in ("--output_dir", "--max_steps", "--logging_steps", "--dataset_name"):
        assert name not in passed[0]
