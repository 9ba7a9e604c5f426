"""``fitcheck launch`` with TRL scripts: the trainer and TRL's config flags read with TRL's own parser.

The scripts are written as TRL's own examples are (``TrlParser((ScriptArguments, XConfig, ModelConfig))``); they
are never imported or run (each would leave a marker file if it were). The command lines are real
``accelerate launch`` ones, parsed by accelerate's and TRL's parsers; the launcher is a stub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("trl")

from fitcheck.cli import launch
from fitcheck.cli.main import main

ENV = {"HOME": "/nonexistent-home", "HF_HOME": "/nonexistent-hf-home"}
MODEL = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B"]


def _script(tmp_path: Path, config: str, name: str = "train.py") -> str:
    marker = tmp_path / "executed"
    body = f'''open({str(marker)!r}, "w").write("the script ran")  # fitcheck must never run this
from trl import ModelConfig, ScriptArguments, TrlParser, {config}

if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, {config}, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
'''
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def _launch(capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> tuple[int, dict[str, Any]]:
    calls: list[list[str]] = []
    code = launch.main(["--check-only", "--json", "--gpu", "H100-80GB", *argv], launcher=calls.append, env=ENV)
    captured = capsys.readouterr()
    assert calls == [] and "Traceback" not in captured.err
    return code, (json.loads(captured.out) if captured.out.strip() else {})


def _components(j: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {c["name"]: c["bytes_by_phase"] for c in j["component_detail"]}


def test_dpo_script_with_peft_under_zero3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = _script(tmp_path, "DPOConfig")
    args = ["--use_deepspeed", "--zero_stage", "3", "--num_processes", "4", script, *MODEL,
            "--dataset_name", "trl-lib/ultrafeedback_binarized", "--per_device_train_batch_size", "2",
            "--max_length", "1024", "--learning_rate", "5e-7", "--output_dir", "/tmp/dpo", "--no_remove_unused_columns"]
    environ = dict(os.environ)
    code, full = _launch(capsys, args)
    assert code in (0, 1) and full["trainer"] == "dpo"
    ref = _components(full)["reference_model.weights"]["end of forward"]
    # ZeRO-3 shards the reference too (prepare_deepspeed); fp32: the script passes ModelConfig.dtype, whose
    # default is "float32" (trl/trainer/model_config.py), to create_model_from_path
    assert ref == -(-494_032_768 * 4 // 4)
    _, peft = _launch(capsys, [*args, "--use_peft", "--lora_r", "32", "--lora_alpha", "16"])
    assert peft["trainer"] == "dpo" and "reference_model.weights" not in _components(peft)
    assert any(name.startswith("adapters") or "lora" in name for name in _components(peft))
    added = {k for k in set(os.environ) - set(environ) if not k.startswith("TORCHINDUCTOR")}  # torch's own cache dir
    assert not added and not (tmp_path / "executed").exists()  # no ACCELERATE_*/TrainingArguments side effects


def test_grpo_script_matches_estimate_with_the_same_fields(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    script = _script(tmp_path, "GRPOConfig")
    fields = ["--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "256",
              "--beta", "0.04"]
    code, j = _launch(capsys, ["--max_prompt_length", "128", script, *MODEL, *fields, "--output_dir", "/tmp/g"])
    assert code in (0, 1) and j["trainer"] == "grpo"
    assert j["phases"]["generation"] > 0 and "reference_model.weights" in _components(j)
    main(["estimate", *MODEL, "--gpu", "H100-80GB", "--trainer", "grpo", "--max_prompt_length", "128", *fields,
          "--json"])
    est = json.loads(capsys.readouterr().out)
    assert j["peak_allocated_bytes"] == est["peak_allocated_bytes"] and j["phases"] == est["phases"]


def test_sft_script_packing_and_evaluation_from_config_yaml(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    script = _script(tmp_path, "SFTConfig")
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("packing: true\nper_device_eval_batch_size: 16\neval_strategy: steps\nmax_length: 2048\n"
                   "env:\n  FITCHECK_TEST_SHOULD_NOT_BE_SET: '1'\n")
    code, j = _launch(capsys, [script, *MODEL, "--config", str(cfg), "--per_device_train_batch_size", "4"])
    assert code in (0, 1) and j["trainer"] == "sft"
    assert j["phases"]["evaluation"] > 0 and "FITCHECK_TEST_SHOULD_NOT_BE_SET" not in os.environ
    _, no_eval = _launch(capsys, [script, *MODEL, "--per_device_train_batch_size", "4"])
    assert "evaluation" not in no_eval["phases"]


def test_trainer_choice_and_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    both = _script(tmp_path, "SFTConfig, DPOConfig", "both.py")
    assert _launch(capsys, [both, *MODEL])[0] == 2  # two TRL configs: say which
    code, j = _launch(capsys, ["--trainer", "dpo", both, *MODEL])
    assert code in (0, 1) and j["trainer"] == "dpo"
    orpo = _script(tmp_path, "ORPOConfig", "orpo.py")
    assert _launch(capsys, [orpo, *MODEL])[0] == 2  # a TRL trainer fitcheck does not model
    grpo = _script(tmp_path, "GRPOConfig", "grpo.py")
    assert _launch(capsys, ["--max_prompt_length", "64", grpo, *MODEL, "--num_generations", "many"])[0] == 2
    assert _launch(capsys, [grpo, *MODEL])[0] == 2  # no prompt length (TRL 1.16 has no field for it)
    assert not (tmp_path / "executed").exists()
