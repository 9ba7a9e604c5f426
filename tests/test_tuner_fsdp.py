"""tune_micro_batch on an FSDP2 or FSDP1 Trainer (accelerate's FSDP state set on the CPU as on a GPU; the rest real).

FSDP1 trials were refused before session 7 (``tuner._refuse_sharded``); they run on the same session
(fitcheck.integrations.tuner_fsdp, where the FSDP1 differences are argued) and are checked here only (one gloo
process; no GPU was lent that session).

The tuner's FSDP2 trials (fitcheck.integrations.tuner_fsdp) were run on an H100 (benchmarks/tuner_fsdp_gpu.py,
benchmarks/data/tuner_fsdp_gpu_h100.json: a real CUDA out-of-memory at 32 × 1 survived, 16 × 2 chosen); GPU
training is not bitwise reproducible there, so the promise "the same weights as an untuned run at the tuned size"
is checked here, on the CPU, where it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = Path(__file__).resolve().parent / "fsdp_trainer_cpu.py"


def _run(mode: str, port: int, micro: int = 8, tmp: Path | None = None, **env: str) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    full.update(env)
    if tmp is not None:
        full["FITCHECK_TEST_OUT"] = str(tmp)
    proc = subprocess.run([sys.executable, str(SCRIPT), mode, str(port), str(micro)], capture_output=True,
                          text=True, timeout=300, env=full, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("FSDP_CPU_RESULT "):
            return dict(json.loads(line[len("FSDP_CPU_RESULT "):]))
    raise AssertionError(f"no result (exit {proc.returncode}): {proc.stderr[-3000:]}")


@pytest.mark.slow
def test_tuned_fsdp2_trainer_survives_an_oom_mid_step_and_trains_like_an_untuned_one(
        tmp_path: Path, free_port: int) -> None:
    """An OOM inside backward (FSDP2 mid-iteration: the hardest case; one inside forward was checked by hand with
    ``FITCHECK_TEST_OOM_IN=forward``, same result)."""
    tuned = _run("tuned", free_port, tmp=tmp_path, FITCHECK_TEST_OOM_AT="8", FITCHECK_TEST_OOM_IN="backward")
    assert tuned["fsdp_enabled"]
    assert [t[:2] for t in tuned["trials"]] == [[8, False], [4, True]]  # the OOM at 8, then 4 fits
    assert tuned["batch"] == [4, 2]
    # the Trainer handles accumulation itself: accelerate's num_steps stays 1 (it was set to 2, halving gradients)
    assert tuned["accelerate_num_steps"] == 1
    # FSDP2 left mid-step by the OOM is reset (else its bf16 unsharded copies stay registered as the parameters)
    assert tuned["dtypes"] == ["torch.float32"]
    plain = _run("plain", free_port, micro=4, tmp=tmp_path)
    assert plain["batch"] == [4, 2] and plain["sha"] == tuned["sha"]


@pytest.fixture(scope="module")
def fsdp1_plain_4x2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An untuned FSDP1 run at 4 × 2 (the size the FSDP1 tests below must land on)."""
    from benchmarks.gloo_rank import free_port

    port = int(free_port())
    return _run("plain", port, micro=4, tmp=tmp_path_factory.mktemp("fsdp1-plain"), FITCHECK_TEST_FSDP_VERSION="1")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_tuned_fsdp1_trainer_survives_an_oom_mid_step_and_trains_like_an_untuned_one(
        tmp_path: Path, free_port: int, where: str, fsdp1_plain_4x2: dict[str, Any]) -> None:
    """FSDP1 (a wrapper, flat parameters): the first trial wraps the model for good, as train() would; an OOM
    inside forward or backward leaves FSDP1 mid-iteration (before the reset: "expected to be in states
    [TrainingState.IDLE] but current state is TrainingState.FORWARD_BACKWARD" in the next step)."""
    tuned = _run("tuned", free_port, tmp=tmp_path, FITCHECK_TEST_OOM_AT="8", FITCHECK_TEST_OOM_IN=where,
                 FITCHECK_TEST_FSDP_VERSION="1")
    assert tuned["fsdp_enabled"]
    assert [t[:2] for t in tuned["trials"]] == [[8, False], [4, True]]
    assert tuned["batch"] == [4, 2] and tuned["accelerate_num_steps"] == 1
    assert tuned["dtypes"] == ["torch.float32"]  # accelerate's upcast of the bf16 flat parameters, once
    assert fsdp1_plain_4x2["batch"] == [4, 2] and fsdp1_plain_4x2["sha"] == tuned["sha"]


@pytest.mark.slow
def test_fsdp1_trials_land_on_the_true_maximum_under_a_budget_in_two_trials(
        tmp_path: Path, free_port: int, fsdp1_plain_4x2: dict[str, Any]) -> None:
    """No injected error: a CPU budget between the measured peaks at 4 (3,015,940 B) and 8 (3,679,748 B). The
    estimate predicts 4, the trial one size up runs over: 2 trials, 4 × 2 set, weights as the untuned 4 × 2 run.
    Also ``use_orig_params: false`` (flat parameters seen by the optimizer), whose names differ: hashed apart."""
    tuned = _run("tuned", free_port, tmp=tmp_path, FITCHECK_TEST_BUDGET="3300000", FITCHECK_TEST_FSDP_VERSION="1")
    assert [t[:2] for t in tuned["trials"]] == [[4, True], [8, False]]
    assert tuned["batch"] == [4, 2] and tuned["sha"] == fsdp1_plain_4x2["sha"]
    flat = {"FITCHECK_TEST_FSDP_VERSION": "1", "FITCHECK_TEST_FSDP_CONFIG": '{"use_orig_params": false}'}
    tuned_flat = _run("tuned", free_port, tmp=tmp_path, FITCHECK_TEST_OOM_AT="8", **flat)
    plain_flat = _run("plain", free_port, micro=4, tmp=tmp_path, **flat)
    assert [t[:2] for t in tuned_flat["trials"]] == [[8, False], [4, True]]
    assert tuned_flat["sha"] == plain_flat["sha"] != tuned["sha"]
