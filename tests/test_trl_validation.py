"""Issue 21: TRL fields are checked as TRL checks them. A setting TRL 1.16's config class refuses (an unknown field,
a generation batch GRPOConfig rejects, a zero count) or that its trainer raises on (an unknown DPO loss type) is
refused with exit 2; non-finite numbers too. Each case failed (exit 0) before the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fitcheck.cli.main import main
from fitcheck.readers.trl_settings import DPO_LOSS_TYPES

trl = pytest.importorskip("trl")

EST = ["estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--no_trace", "--json"]
TA = {"output_dir": "unused", "report_to": [], "use_cpu": True}


@pytest.mark.parametrize(
    ("flags", "config", "kwargs"),
    [
        (["--trainer", "grpo", "--num_generations", "0", "--max_prompt_length", "64"], "GRPOConfig",
         {"num_generations": 0}),
        (["--trainer", "grpo", "--per_device_train_batch_size", "3", "--num_generations", "4",
          "--max_prompt_length", "64"], "GRPOConfig", {"per_device_train_batch_size": 3, "num_generations": 4}),
        # refused by GRPOConfig's own checks, which fitcheck's model answers "maybe" for (trl is then imported)
        (["--trainer", "grpo", "--generation_batch_size", "16", "--steps_per_generation", "2", "--max_prompt_length",
          "64"], "GRPOConfig", {"generation_batch_size": 16, "steps_per_generation": 2}),
        (["--trainer", "grpo", "--num_generations", "1", "--max_prompt_length", "64"], "GRPOConfig",
         {"num_generations": 1}),
        (["--trainer", "sft", "--num_generations", "4"], "SFTConfig", {"num_generations": 4}),
        (["--trainer", "reward", "--packing"], "RewardConfig", {"packing": True}),
        (["--trainer", "kto", "--num_generations", "2", "--max_prompt_length", "64"], "KTOConfig",
         {"num_generations": 2}),
    ],
)
def test_what_the_trl_config_refuses_exits_2(
    capsys: pytest.CaptureFixture[str], flags: list[str], config: str, kwargs: dict[str, object]
) -> None:
    with pytest.raises((ValueError, TypeError, ZeroDivisionError)) as refused:
        getattr(trl, config)(**TA, **kwargs)  # TRL's own class refuses it
    code = main([*EST, *flags])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err  # a message, or the report with its grpo-batch-refused error
    if "refuses these settings" in err:  # in TRL's own words (shortened in the middle when long)
        assert str(refused.value)[:20] in err and str(refused.value)[-20:] in err, err


@pytest.mark.parametrize(
    "flags",
    [
        ["--trainer", "dpo", "--beta", "nan", "--max_prompt_length", "64"],
        ["--trainer", "grpo", "--beta", "inf", "--max_prompt_length", "64"],
        ["--trainer", "grpo", "--steps_per_generation", "0", "--max_prompt_length", "64"],
        ["--trainer", "dpo", "--loss_type", "no_such_loss", "--max_prompt_length", "64"],
    ],
)
def test_values_trl_accepts_but_cannot_train_exit_2(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    code = main([*EST, *flags])
    err = capsys.readouterr().err
    assert code == 2 and flags[3] in err


def test_runs_trl_accepts_still_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--trainer", "sft", "--packing"], ["--trainer", "dpo", "--loss_type", "ipo", "--max_prompt_length",
                                                     "64"],
                  ["--trainer", "grpo", "--per_device_train_batch_size", "2", "--num_generations", "8",
                   "--num_processes", "4", "--max_prompt_length", "64"]):  # 2 x 4 processes = 8 per generation
        assert main([*EST, *flags]) in (0, 1), flags
        capsys.readouterr()


def test_dpo_loss_types_are_the_trainers_branches() -> None:
    source = Path(trl.trainer.dpo_trainer.__file__).read_text()
    branches = re.findall(r'(?:if|elif) loss_type == "([a-z_]+)"', source)
    assert set(branches) == set(DPO_LOSS_TYPES)
