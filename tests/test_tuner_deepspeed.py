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
