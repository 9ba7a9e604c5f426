"""Issue 19: the whole-run allocator replay and the near-budget replay describe TRL's SFTTrainer run.

Before, a TRL run near the budget got only the ``reserved-near-budget`` warning ("the replay composes the plain
Trainer's run only"), and the replay, where forced, composed the plain Trainer's step: full-vocabulary logits
that SFTTrainer (TRL 1.16's fused LM head) never allocates. Now the SFT step is traced as the trainer runs it
(``torch_adapters/tracer_trl.py``) and replayed; the other TRL trainers keep the warning, naming what the replay
leaves out. The replay against the real SFTTrainer on CPU is ``benchmarks/trl_replay.py`` (and the slow test
below). Each fast test failed on main.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from tiny_models import WIDE_VOCAB_LLAMA

from fitcheck.cli import spec_from_values
from fitcheck.core import estimate
from fitcheck.spec import TrainerSpec, TrainingSpec

TINY = WIDE_VOCAB_LLAMA  # the full-vocabulary logits would dominate the plain step


def _spec(tmp_path: Path, gpu_memory: str, **values: object) -> TrainingSpec:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    flags = {"model_name_or_path": str(tmp_path), "bf16": True, "gradient_checkpointing": True,
             "per_device_train_batch_size": 4, "max_seq_length": 256, "gpu_memory": gpu_memory, "trainer": "sft",
             "dtype": "auto",  # config.json's dtype, not TRL's float32 load of a model given by name
             **values}
    return spec_from_values(flags, {})[0]


def _codes(report: Any) -> list[str]:
    return [f.code for f in report.findings]


def test_sft_near_budget_replays_the_sft_run(tmp_path: Path) -> None:
    """SFT, 4 x 256, checkpointed, H100-like CUDA: the formula needs 895 MiB (fits 910 MiB with the published 11 %
    gap); the SFT run replayed leaves 156 MiB reserved (gap 0.48 of the step's own bytes): 923 MiB, does not
    fit. The replayed step is SFT's (its allocated peak within 1 % of the formula's 118.8 MiB), not the plain
    Trainer's (420.9 MiB allocated: its fp32 logits)."""
    from fitcheck.torch_adapters import PinnedPath, replay_whole_run
    from fitcheck.torch_adapters.verdict_replay import in_band

    spec = _spec(tmp_path, "910MiB")
    formula = estimate(spec)
    assert formula.fits and in_band(formula)
    path = PinnedPath("auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = path(spec)
        (replay,) = path.near_budget.replays.values()
        plain = replay_whole_run(dataclasses.replace(spec, trainer=TrainerSpec()))
    assert "reserved-near-budget-replayed" in _codes(report) and "reserved-near-budget" not in _codes(report)
    assert not report.fits and report.device_used_bytes > formula.device_used_bytes
    assert replay.peak_allocated == pytest.approx(formula.peak_allocated_bytes, rel=0.01)
    assert plain.peak_allocated > 3 * replay.peak_allocated


def test_other_trl_trainers_keep_the_warning_naming_the_part(tmp_path: Path) -> None:
    """SFT padding-free is not replayed: the warning names the flattened row (DPO is replayed since session 15:
    tests/test_dpo_replay.py; KTO and GRPO without vLLM since session 16: tests/test_kto_replay.py,
    tests/test_grpo_replay.py; the reward trainer since session 18: tests/test_reward_step.py)."""
    from fitcheck.torch_adapters import PinnedPath, not_replayed

    assert not_replayed(_spec(tmp_path, "80GiB", trainer="reward")) == ""
    free = _spec(tmp_path, "80GiB", padding_free=True)
    for spec, part in ((free, "padding-free"),):
        used = estimate(spec).device_used_bytes
        near = dataclasses.replace(spec, hardware=dataclasses.replace(spec.hardware, gpu_memory_bytes=used + 2**20))
        path = PinnedPath("auto")
        report = path(near)
        (note,) = [f for f in report.findings if f.code == "reserved-near-budget"]
        assert part in note.message and "SFTTrainer" in note.message
        assert not path.near_budget.replays


def test_sft_headline_far_from_budget_is_replayed(tmp_path: Path) -> None:
    """Issue 19: the default path does not trace a TRL run (``run_scope.traceable``) and answered its reserved with
    the published 11 % however far from the budget (-4.5 .. -10.5 % off the eight real TRL runs on the H200,
    ``benchmarks/data/trl_gpu_nvidia_h200.json``). The headline now gets SFT's whole run replayed (failed on main:
    the formula's reserved); the largest micro-batch's probes keep the formula."""
    from fitcheck.torch_adapters import PinnedPath, replay_whole_run

    spec = _spec(tmp_path, "80GiB")
    formula = estimate(spec)
    path = PinnedPath("auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = path(spec)
        replay = replay_whole_run(spec)
    assert "reserved-replayed" in _codes(report) and not any(c.name == "activations.traced" for c in report.components)
    assert report.peak_reserved_bytes == estimate(spec, replayed=replay.measured(True)).peak_reserved_bytes
    assert report.peak_reserved_bytes > formula.peak_reserved_bytes  # SFT's gap 0.48 of the step's bytes, not 0.11
    assert report.peak_allocated_bytes == formula.peak_allocated_bytes
    bigger = dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, micro_batch=8))
    assert path.following(report)(bigger).peak_reserved_bytes == estimate(bigger).peak_reserved_bytes


def test_sft_run_scope(tmp_path: Path) -> None:
    from fitcheck.torch_adapters import not_replayed, plain_trainer_run, replayed_run

    sft = _spec(tmp_path, "80GiB")
    assert replayed_run(sft) and not plain_trainer_run(sft) and not_replayed(sft) == ""
    liger = _spec(tmp_path, "80GiB", use_liger_kernel=True)
    assert not replayed_run(liger) and "Liger" in not_replayed(liger)


@pytest.mark.slow
def test_replay_matches_the_real_sft_trainer_on_cpu() -> None:
    """The SFT LoRA run replayed (three steps, CPU) vs the real SFTTrainer's live tensors over the same three steps,
    at 2 x 64 (benchmarks/trl_replay.py's 2 x 128 row: 39,061,040 vs 39,071,300 B, -0.03 %; the plain step
    replayed: 15,199,608 B)."""
    from benchmark_module import load_benchmark

    bench = load_benchmark("trl_replay")
    lora = next(c for c in bench.SFT_CASES if c.name == "sft LoRA")
    case = dataclasses.replace(lora, length=64)  # half the benchmark's row: CI time
    replay = bench.replay_peaks(bench.case_spec(case))
    real = bench.measure_run(case)
    assert replay["peak"] == pytest.approx(real["peak"], rel=0.002)
    assert replay["last_step"] == pytest.approx(real["last_step"], rel=0.002)
