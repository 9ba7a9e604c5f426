"""``fitcheck estimate --config_file`` counts processes and picks the device as ``accelerate launch`` (1.15) does,
the same as ``fitcheck launch``: MULTI_CPU / NO go to the simple launcher (one process unless an mpirun hostfile
is set), ``use_cpu`` makes the script train on the CPU. Each case failed before (MULTI_CPU counted 2 GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from fitcheck.integrations import accelerate_launch as al

from fitcheck.cli.estimate import spec_from_values
from fitcheck.spec import DeviceType

ENV = {"HOME": "/nonexistent-home", "HF_HOME": "/nonexistent-hf-home"}
MODEL = {"model_name_or_path": "meta-llama/Llama-3.2-1B", "per_device_train_batch_size": 2}


def _yaml(tmp_path: Path, distributed_type: str, *extra: str) -> str:
    path = tmp_path / "accelerate.yaml"
    path.write_text("\n".join([
        "compute_environment: LOCAL_MACHINE", f"distributed_type: '{distributed_type}'", "num_processes: 2",
        "num_machines: 1", "machine_rank: 0", "mixed_precision: 'no'", *extra, ""]))
    return str(path)


@pytest.mark.parametrize(("dist", "extra", "processes", "device"), [
    ("MULTI_CPU", ("use_cpu: true",), 1, DeviceType.CPU),  # what `accelerate config` writes for MULTI_CPU
    ("MULTI_CPU", (), 1, DeviceType.CUDA),  # no use_cpu: ACCELERATE_USE_CPU is False for the one process
    ("MULTI_CPU", ("use_cpu: true", "mpirun_config:", "  mpirun_hostfile: /tmp/hosts"), 2, DeviceType.CPU),
    ("NO", (), 1, DeviceType.CUDA),
    ("MULTI_GPU", (), 2, DeviceType.CUDA),
    ("MULTI_GPU", ("use_cpu: true",), 2, DeviceType.CPU),
], ids=["multi-cpu use_cpu", "multi-cpu", "multi-cpu mpirun", "no", "multi-gpu", "multi-gpu use_cpu"])
def test_estimate_agrees_with_launch(tmp_path: Path, dist: str, extra: tuple[str, ...], processes: int,
                                     device: DeviceType) -> None:
    yaml = _yaml(tmp_path, dist, *extra)
    spec = spec_from_values({**MODEL, "config_file": yaml}, env=ENV)[0]
    launched = al.launch_report(al.split_argv(["--config_file", yaml, "train.py", "--model_name_or_path",
                                               MODEL["model_name_or_path"], "--per_device_train_batch_size", "2"]),
                                ENV).spec  # type: ignore[attr-defined]
    assert (spec.sharding.num_processes, spec.hardware.device_type) == (processes, device)
    assert (launched.sharding.num_processes, launched.hardware.device_type) == (processes, device)


def test_a_count_accelerate_will_not_start_is_said(tmp_path: Path) -> None:
    spec = spec_from_values({**MODEL, "config_file": _yaml(tmp_path, "MULTI_CPU", "use_cpu: true"),
                             "num_processes": 4}, env=ENV)[0]
    said = [f for f in spec.findings if f.code == "accelerate-one-process"]
    assert spec.sharding.num_processes == 1 and said and "not 4" in said[0].message
