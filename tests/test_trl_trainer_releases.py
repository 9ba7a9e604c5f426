"""``--trainer dpo`` / ``reward`` by TRL release: the release rules, and real old trainers' recorded peaks.

The real peaks are recorded (``benchmarks/trl_trainer_releases.py --record`` in side venvs with TRL 0.20.0, 0.22.2,
0.24.0, 1.4.0 and 1.6.0, and the installed 1.16.0); CI runs no old TRL.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from benchmark_module import load_benchmark

from fitcheck.cli.main import main
from fitcheck.core.estimator import estimate
from fitcheck.core.states import DpoLoss, dpo_loss, dpo_release_modelled, reward_step_modelled, trl_config_defaults
from fitcheck.spec import Strategy, TrainerKind

load_benchmark("trl_truth")  # the harness trl_trainer_releases imports by name
load_benchmark("trl_sft_releases")  # its spec_at_recorded_stack, shared
releases = load_benchmark("trl_trainer_releases")
OLD = ("0.20.0", "0.22.2", "0.24.0", "1.4.0", "1.6.0")


def test_release_rules_read_at_the_tags() -> None:
    assert dpo_loss((0, 18, 2)) is DpoLoss.UNCHECKED and dpo_loss((1, 14, 0)) is DpoLoss.UNCHECKED
    assert dpo_loss((0, 19, 0)) is DpoLoss.CONCATENATED_FORWARD and dpo_loss((0, 28, 0)) is DpoLoss.CONCATENATED_FORWARD
    assert dpo_loss((0, 29, 0)) is DpoLoss.SHIFTED_COPIES and dpo_loss((1, 5, 1)) is DpoLoss.SHIFTED_COPIES
    assert dpo_loss((1, 6, 0)) is DpoLoss.SHIFTED_VIEWS and dpo_loss((1, 13, 0)) is DpoLoss.SHIFTED_VIEWS
    assert dpo_loss((1, 15, 0)) is DpoLoss.FUSED_HEAD and dpo_loss(None) is DpoLoss.FUSED_HEAD
    assert not reward_step_modelled((0, 23, 1)) and reward_step_modelled((0, 24, 0)) and reward_step_modelled(None)
    assert trl_config_defaults(TrainerKind.DPO, (0, 21, 0)) == {"gradient_checkpointing": False, "bf16": True}
    assert trl_config_defaults(TrainerKind.REWARD, (0, 18, 0)) == {"gradient_checkpointing": False, "bf16": False}
    assert trl_config_defaults(TrainerKind.GRPO, (1, 9, 0))["max_completion_length"] == 256
    assert trl_config_defaults(TrainerKind.GRPO, None)["max_completion_length"] == 512


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _peak(rows: dict[str, int]) -> int:
    return max(rows.values())


def test_recorded_real_dpo_and_reward_peaks() -> None:
    """Real DPOTrainer / RewardTrainer steps of TRL 0.20 - 1.6 (recorded) vs the formula at that stack: every DPO phase
    window and every peak within 2 % (the LoRA rows' forward, -1.5 .. -2.0 %, is the plain LoRA step's gap on that
    stack, as in tests/test_trl_sft_releases.py; the full rows within 0.1 %), the reward peaks within 2 % (0.24's
    backward: one bf16 hidden state more, -1.2 %).
    Before the release rules, TRL 1.16's fused head answered +50 .. +166 % on these DPO rows."""
    recorded = releases.recorded()
    assert set(OLD) | {"1.16.0"} <= set(recorded)
    for release in OLD:
        data = recorded[release]
        for case in releases.CASES:
            real = data["rows"].get(case.name)
            if case.trainer not in (TrainerKind.DPO, TrainerKind.REWARD) or real is None or "error" in real:
                continue
            report = estimate(releases.spec_at_recorded_stack(case, data["versions"]))
            trl_unmodelled = any(f.code == "versions-not-modelled" and f.message.startswith("trl ")
                                 for f in report.findings)
            if case.trainer is TrainerKind.REWARD and not reward_step_modelled(_release(release)):
                assert trl_unmodelled, (release, case.name)
                continue
            assert not trl_unmodelled, (release, case.name)
            est = releases.estimated_phases(report)
            assert report.peak_allocated_bytes == pytest.approx(_peak(real), rel=0.02), (release, case.name)
            if case.trainer is TrainerKind.DPO:
                for phase in real:
                    assert est[phase] == pytest.approx(real[phase], rel=0.02), (release, case.name, phase)
    # what the checked layout does not cover stays unmodelled: DeepSpeed's 16-bit module (no fp32 outputs); the
    # release's evaluation step is flagged (not-modelled unpins)
    spec = releases.spec_at_recorded_stack(releases.CASES[0], recorded["0.24.0"]["versions"])
    zero = dataclasses.replace(spec, sharding=dataclasses.replace(spec.sharding, strategy=Strategy.DEEPSPEED))
    assert not dpo_release_modelled(zero) and dpo_release_modelled(spec)
    evaluated = dataclasses.replace(spec, trainer=dataclasses.replace(spec.trainer, eval_batch_size=2))
    assert any(f.code == "not-modelled" for f in estimate(evaluated).findings)


MODEL = ["estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--per_device_train_batch_size", "2",
         "--gpu", "H100-80GB", "--max_length", "512", "--no_trace", "--json",
         "--dtype", "bfloat16"]  # the same load at every release (TRL's own default moves: test_trl_load_dtype.py)


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main([*MODEL, *extra]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_cli_dpo_follows_the_stack_release(capsys: pytest.CaptureFixture[str]) -> None:
    old = _run(capsys, "--trainer", "dpo", "--stack", "trl=0.24")
    assert any(f["code"] == "versions-modelled" and "concatenated_forward" in f["message"] for f in old["findings"])
    assert not any(f["code"] == "versions-not-modelled" for f in old["findings"])
    assert "logits.fused_head" not in {c["name"] for c in old["component_detail"]}
    new = _run(capsys, "--trainer", "dpo", "--stack", "trl=1.16")
    assert old["peak_allocated_bytes"] > new["peak_allocated_bytes"]  # the full fp32 logits of policy and reference
    helper = _run(capsys, "--trainer", "dpo", "--stack", "trl=1.14")
    assert not helper["pinned"] and any(f["code"] == "versions-not-modelled" for f in helper["findings"])
    early = _run(capsys, "--trainer", "grpo", "--max_prompt_length", "128", "--num_generations", "2",
                 "--stack", "trl=0.20")
    assert any("TRL 0.20 GRPOConfig defaults" in a and "gradient_checkpointing false" in a
               and "max_completion_length 256" in a for a in early["assumptions"])
