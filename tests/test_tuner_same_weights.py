"""Issue 21: after tune_micro_batch, training ends with the weights of an untuned run at the tuned size.

Run A: a Trainer (plain, LoRA, checkpointed, SFT) is tuned under a simulated budget (tests/tuner_budget.py) that
puts the largest micro-batch at a quarter of the per-GPU batch (the next size's trial runs out of memory part-way),
then trains. Run B: a fresh Trainer built at
the size found trains the same number of steps. Both start from the same seed; attention dropout is on, so the
trials' use of torch's RNG matters, and the data are shuffled by the Trainer's sampler. The final parameters
must be equal bit for bit.

Before the fix, ``set_trainer_micro_batch`` wrote the accumulation into accelerate's
``GradientAccumulationPlugin`` (which transformers 5.23 keeps at ``num_steps=1``), so ``accelerator.backward``
divided each loss by the accumulation a second time: run A's final weights differed from run B's by up to
1.7e-5.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import tuner_budget  # noqa: E402
from fitcheck.integrations.tuner import tune_micro_batch  # noqa: E402
from tuner_budget import CONFIGS, SEQ, budget_for, build_trainer, real_peak  # noqa: E402

STEPS = 3


def _weights(trainer: Any) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[2], CONFIGS[3], CONFIGS[4]],
                         ids=["Trainer", "LoRA", "checkpointing", "SFTTrainer"])
def test_tuned_run_trains_to_the_weights_of_an_untuned_run(config: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tuner_budget.WIDTHS, "attention_dropout", 0.2)
    out = str(tmp_path)
    per_gpu = config.micro * config.accum  # 16 in each config; the budget lets per_gpu / 4 train, not more
    micro = per_gpu // 4
    budget = (real_peak(config, out, micro) + real_peak(config, out, 2 * micro)) // 2
    tuned = build_trainer(config, out, max_steps=STEPS)
    with budget_for(tuned.model, budget):
        result = tune_micro_batch(tuned, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
    assert (result.micro_batch, result.grad_accum) == (micro, 4), result.table()
    assert any(not t.fits for t in result.trials)  # a trial ran out of memory part-way: that path restores too
    tuned.train()
    untuned = build_trainer(config, out, micro=micro, accum=4, max_steps=STEPS)
    untuned.train()
    a, b = _weights(tuned), _weights(untuned)
    differ = [n for n in a if not torch.equal(a[n], b[n])]
    assert not differ, (differ[:3], max((a[n] - b[n]).abs().max().item() for n in differ))
    assert tuned.state.global_step == untuned.state.global_step == STEPS
