"""tune_micro_batch under a REAL DeepSpeed 0.19.8 engine (CPU, one gloo process): benchmarks/tuner_deepspeed.py.

Each stage runs in its own process (DeepSpeed initialises torch.distributed): true maximum by a scan of real
DeepSpeed training runs under a simulated GPU, then the tuner on a fresh Trainer, ``train()``, and an untuned run
at the size found.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from tuner_deepspeed import MAX_STEPS, measure


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_tuner_on_a_real_deepspeed_engine_finds_the_max_without_training(stage: int) -> None:
    r = measure(stage)
    assert r["micro"] == r["true"], r["trials"]
    if r["predicted"] == r["true"]:
        assert len(r["trials"]) <= 2, r["trials"]
    assert all(fits == (m <= r["true"]) for m, _, fits in r["trials"])
    assert r["micro"] * r["accum"] == 16  # the global batch is kept
    # train()'s engine ran with the chosen size, and DeepSpeed's three keys agree with it
    assert r["engine_batch"] == r["config_batch"] == [r["micro"], r["accum"], r["micro"] * r["accum"]]
    assert r["steps"] == r["global_step"] == MAX_STEPS
    # the training that follows starts from the bits an untuned run starts from, ends on the same bits, and
    # the trial engines left nothing behind (same peak as the untuned run)
    assert r["start_equal"] and r["end_equal"]
    assert r["peak_tuned"] == r["peak_untuned"]
    if stage == 2:
        nothing = r["nothing_fits"]
        assert nothing["raised"] and nothing["trials"] >= 1 and nothing["args_kept"] and nothing["config_kept"]
        assert nothing["hooks_kept"]


@pytest.mark.slow
def test_two_deepspeed_ranks_agree_and_set_the_world_batch(tmp_path: Path, free_port: int) -> None:
    """torch.distributed.run, 2 CPU processes (gloo), ZeRO-2, the same simulated budget on both ranks."""
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "rank"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port),
           str(root / "benchmarks" / "tuner_deepspeed_ddp_worker.py"), str(out), "1215008"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads((tmp_path / f"rank.{r}").read_text()) for r in (0, 1)]
    assert rows[0] == rows[1]  # same size, same trials, same engine batch on both ranks
    micro, accum, trials, engine_batch, steps, world = rows[0]
    assert world == 2 and micro * accum == 16 and len(trials) <= 3
    assert engine_batch == [micro, accum, micro * accum * world]  # DeepSpeed's train_batch_size counts the world
    assert steps == MAX_STEPS
