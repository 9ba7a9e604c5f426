"""``fitcheck estimate --trainer sft|dpo|grpo|reward`` and TRL 1.16's config fields as flags."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from fitcheck.cli.main import main
from fitcheck.core.trainers import TRAINERS
from fitcheck.spec import TrainerKind

MODEL = ["estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--per_device_train_batch_size", "2",
         "--gpu", "H100-80GB"]


def run_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main([*MODEL, *extra, "--json"])
    return code, json.loads(capsys.readouterr().out)


def components(j: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {c["name"]: c["bytes_by_phase"] for c in j["component_detail"]}


def test_defaults_table_matches_installed_trl(tmp_path: Any) -> None:
    trl = pytest.importorskip("trl")
    configs = {TrainerKind.SFT: trl.SFTConfig, TrainerKind.DPO: trl.DPOConfig, TrainerKind.GRPO: trl.GRPOConfig,
               TrainerKind.REWARD: trl.RewardConfig}
    for kind, cls in configs.items():
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        for key, value in TRAINERS[kind].defaults.items():
            if key == "bf16":  # None in the dataclass, resolved in __post_init__ (trl/trainer/base_config.py)
                kwargs = {"use_cpu": True, "output_dir": str(tmp_path)}
                assert cls(**kwargs).bf16 is value, kind
            else:
                assert fields[key] == value, (kind, key)


def test_sft_uses_fused_head_and_trl_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    # the formula's components; --no_trace: the largest micro-batch's boundary would replay the SFT run at ~60 x
    # 512 (minutes on a CPU), which tests/test_trl_replay.py checks at a tiny width
    code, j = run_json(capsys, "--trainer", "sft", "--max_length", "512", "--no_trace")
    assert code == 0 and j["trainer"] == "sft"
    comps = components(j)
    assert "logits.fused_head" in comps and "logits.loss" not in comps
    assert any("gradient_checkpointing true" in a for a in j["assumptions"])
    _, off = run_json(capsys, "--trainer", "sft", "--max_length", "512", "--gradient_checkpointing", "false",
                      "--no_trace")
    assert off["peak_allocated_bytes"] > j["peak_allocated_bytes"]  # TRL's default (on) is what was estimated


def test_dpo_reference_copy_depends_on_peft_and_precompute(capsys: pytest.CaptureFixture[str]) -> None:
    # the formula's components (--no_trace): the default path would also replay the DPO run at the largest
    # micro-batch's boundary (verdict_replay), 90 s of traces on this 2-core machine that this test does not read
    args = ("--trainer", "dpo", "--max_prompt_length", "256", "--max_completion_length", "256", "--no_trace")
    _, j = run_json(capsys, *args)
    ref = components(j)["reference_model.weights"]
    # an fp32 copy of every parameter: TRL 1.16 loads the policy and its reference by name in float32
    # (create_model_from_path; tests/test_trl_load_dtype.py)
    assert ref["end of forward"] == j["total_params"] * 4
    assert j["micro_batch"] == 2 and j["seq_len"] == 512
    _, pre = run_json(capsys, *args, "--precompute_ref_log_probs")
    assert "reference_model.weights" not in components(pre)
    _, lora = run_json(capsys, *args, "--use_peft", "--lora_r", "16", "--lora_target_modules", "all-linear")
    assert "reference_model.weights" not in components(lora)  # adapters disabled = the reference


def test_grpo_generation_phase_and_vllm_colocate(capsys: pytest.CaptureFixture[str]) -> None:
    # the formula's components (--no_trace): the default path now also replays the GRPO run at the largest
    # micro-batch's boundary (tracer_grpo), minutes of traces on this 2-core machine that this test does not read
    args = ("--trainer", "grpo", "--max_prompt_length", "512", "--max_completion_length", "256",
            "--num_generations", "2", "--no_trace")
    _, j = run_json(capsys, *args)
    assert j["phases"]["generation"] > 0 and "generation.kv_cache" in components(j)
    assert "reference_model.weights" not in components(j)  # beta 0.0 by default
    _, beta = run_json(capsys, *args, "--beta", "0.04")
    assert "reference_model.weights" in components(beta)
    _, vllm = run_json(capsys, *args, "--use_vllm", "--vllm_gpu_memory_utilization", "0.25")
    share = components(vllm)["generation.vllm_colocate"]["end of forward"]
    assert share == int(j["budget_bytes"] * 0.25)
    assert vllm["device_used_bytes"] - j["device_used_bytes"] == pytest.approx(share, rel=0.01)
    _, server = run_json(capsys, *args, "--use_vllm", "--vllm_mode", "server")
    assert "generation.vllm_colocate" not in components(server) and "generation" not in server["phases"]


def test_reward_has_no_vocabulary_logits(capsys: pytest.CaptureFixture[str]) -> None:
    _, j = run_json(capsys, "--trainer", "reward", "--max_length", "512", "--dtype", "bfloat16")
    _, plain = run_json(capsys, "--max_length", "512", "--gradient_checkpointing", "--bf16", "--dtype", "bfloat16")
    assert j["trainer"] == "reward" and j["peak_allocated_bytes"] < plain["peak_allocated_bytes"]


def test_cpu_device_type_with_every_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (("--trainer", "sft"), ("--trainer", "dpo"), ("--trainer", "reward"),
                  ("--trainer", "grpo", "--max_prompt_length", "64", "--max_completion_length", "64",
                   "--num_generations", "2")):  # GRPOConfig refuses a generation batch of 2 with 8 generations
        code, j = run_json(capsys, *extra, "--device_type", "cpu")
        assert code == 0 and j["trainer"] == extra[1]


def test_evaluation_phase_plain_trainer_and_sft(capsys: pytest.CaptureFixture[str]) -> None:
    # the formula's evaluation phase (--no_trace: no replay of the largest micro-batch's boundary per call)
    base = ("--max_seq_length", "1024", "--bf16", "--gradient_checkpointing", "--no_trace")
    _, plain = run_json(capsys, *base)
    assert "evaluation" not in plain["phases"]
    _, loss_only = run_json(capsys, *base, "--per_device_eval_batch_size", "8")
    assert loss_only["phases"]["evaluation"] > 0
    _, gathered = run_json(capsys, *base, "--per_device_eval_batch_size", "8", "--prediction_loss_only", "false")
    assert "eval-logits-accumulate" in {f["code"] for f in gathered["findings"]}
    _, windowed = run_json(capsys, *base, "--per_device_eval_batch_size", "8", "--prediction_loss_only", "false",
                           "--eval_accumulation_steps", "4")
    assert "eval-logits-accumulate" not in {f["code"] for f in windowed["findings"]}
    assert windowed["phases"]["evaluation"] > loss_only["phases"]["evaluation"]  # 3 steps' logits held
    _, sft = run_json(capsys, "--trainer", "sft", "--max_length", "1024", "--per_device_eval_batch_size", "8",
                      "--no_trace")
    assert sft["phases"]["evaluation"] < loss_only["phases"]["evaluation"]  # fused head: no full logits


@pytest.mark.parametrize(
    "extra",
    [
        ("--packing",),  # a TRL field without --trainer
        ("--trainer", "grpo"),  # no prompt length
        ("--eval_accumulation_steps", "2"),  # without an evaluation batch
        ("--per_device_eval_batch_size", "0"),
        ("--trainer", "grpo", "--max_prompt_length", "64", "--vllm_mode", "remote"),
        ("--trainer", "grpo", "--max_prompt_length", "x"),
        ("--trainer", "grpo", "--max_prompt_length", "64", "--use_vllm", "--vllm_gpu_memory_utilization", "1.5"),
        ("--trainer", "sft", "--loss", "cce"),  # TRL's own chunked head computes the loss: --loss would never run
        ("--trainer", "dpo", "--loss", "liger-flce"),
    ],
)
def test_bad_trl_flags_exit_2(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]) -> None:
    assert main([*MODEL, *extra]) == 2
    assert "Traceback" not in capsys.readouterr().err
