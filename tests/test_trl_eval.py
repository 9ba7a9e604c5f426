"""Evaluation of TRL 1.16's DPO, GRPO and reward trainers, and GRPO's batch rules (issue 13).

The byte counts are pinned against the real trainers' ``evaluate()`` in ``benchmarks/trl_truth.py``
(``TRL_EVAL_CASES``; the slow tests in ``tests/test_trl_truth.py`` run a sample). Here: the CLI models the
evaluation phase for every trainer, flags it when it is above training, and GRPO's batch rules match the
installed ``GRPOConfig``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from tiny_models import family_config, spec_from_config

from fitcheck.advice import max_micro_batch
from fitcheck.cli.main import main
from fitcheck.core.estimator import estimate
from fitcheck.core.trainers import grpo_batch_error, grpo_valid_micro_batch
from fitcheck.report import Phase
from fitcheck.spec import DeviceType, HardwareSpec, ShardingSpec, Strategy, TrainerKind, TrainerSpec

MODEL = ["estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--per_device_train_batch_size", "2",
         "--gpu", "H100-80GB"]


def run_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main([*MODEL, *extra, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("trainer", [
    ("--trainer", "dpo", "--max_prompt_length", "256", "--max_completion_length", "256"),
    # --no_trace: the formula's evaluation phase; the default path would also replay the GRPO run at the largest
    # micro-batch's boundary (tracer_grpo), minutes on this 2-core machine that this test does not read
    ("--trainer", "grpo", "--max_prompt_length", "256", "--max_completion_length", "256", "--num_generations", "2",
     "--no_trace"),
    ("--trainer", "reward", "--max_length", "512"),
])
def test_evaluation_phase_for_dpo_grpo_reward(capsys: pytest.CaptureFixture[str], trainer: tuple[str, ...]) -> None:
    code, base = run_json(capsys, *trainer)
    assert code == 0 and "evaluation" not in base["phases"]
    _, small = run_json(capsys, *trainer, "--per_device_eval_batch_size", "2")
    _, big = run_json(capsys, *trainer, "--per_device_eval_batch_size", "128")
    assert 0 < small["phases"]["evaluation"] < big["phases"]["evaluation"]
    # 128 rows no_grad > 2 rows with backward (Qwen2.5-0.5B is tied: its training step holds the two
    # vocab x hidden embedding gradients since the tied-embedding fix, so 64 rows no longer exceed it for GRPO)
    assert "evaluation-peak" in {f["code"] for f in big["findings"]}
    assert "evaluation-peak" not in {f["code"] for f in small["findings"]}


def test_dpo_compute_metrics_logits_and_reference(capsys: pytest.CaptureFixture[str]) -> None:
    # the formula's evaluation phase (--no_trace): core/trainers/evaluation.py builds it from the state components
    # and trl_eval_forward on both paths (the default path replaces only the training step's activations, and
    # test_evaluation_phase_for_dpo_grpo_reward runs the DPO evaluation on it); the default path would trace and
    # replay the DPO run twice here (the precomputed-reference run is another step)
    args = ("--trainer", "dpo", "--max_prompt_length", "256", "--max_completion_length", "256",
            "--per_device_eval_batch_size", "8", "--no_trace")
    _, loss_only = run_json(capsys, *args)
    _, metrics = run_json(capsys, *args, "--prediction_loss_only", "false", "--eval_accumulation_steps", "2")
    # the metrics forward builds [16 rows, 512, 151936] bf16 logits; 2 steps of them are held
    assert metrics["phases"]["evaluation"] - loss_only["phases"]["evaluation"] >= 2 * 16 * 512 * 151936 * 2 * 0.99
    _, pre = run_json(capsys, *args, "--precompute_ref_log_probs", "true")
    assert pre["phases"]["evaluation"] < loss_only["phases"]["evaluation"]  # no reference copy, no reference pass


_LLAMA = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "vocab_size": 2000, "max_position_embeddings": 1024, "tie_word_embeddings": False}


def _spec(micro: int, accum: int = 1, procs: int = 1, **fields: Any) -> Any:
    """A GRPO run of a tiny Llama on a 1 GiB GPU (so the micro-batch search ends early)."""
    spec = spec_from_config(family_config("llama", _LLAMA), seq=32, batch=micro, grad_accum=accum,
                            device=DeviceType.CUDA, checkpointing=True)
    t = TrainerSpec(kind=TrainerKind.GRPO, prompt_length=16, completion_length=16, **fields)
    sharding = ShardingSpec(strategy=Strategy.DDP, num_processes=procs) if procs > 1 else spec.sharding
    return dataclasses.replace(spec, trainer=t, sharding=sharding,
                               hardware=HardwareSpec(gpu_memory_bytes=2**30, device_type=DeviceType.CUDA))


@pytest.mark.parametrize(("micro", "accum", "procs", "fields"), [
    (2, 1, 1, {"num_generations": 8}),  # refused: generation batch 2
    (4, 2, 1, {"num_generations": 8}),
    (3, 1, 2, {"num_generations": 2}),
    (3, 1, 2, {"num_generations": 4}),  # refused: 6 sequences over 2 processes
    (4, 1, 1, {"num_generations": 4, "generation_batch_size": 12}),
    (8, 1, 1, {"num_generations": 4, "generation_batch_size": 12}),  # refused: 12 not a multiple of 8
    (2, 4, 1, {"num_generations": 4, "steps_per_generation": 2}),
    (4, 1, 1, {"num_generations": 4, "eval_batch_size": 6}),  # refused: evaluation batch 6
    (4, 1, 1, {"num_generations": 4, "eval_batch_size": 8}),
    (2, 1, 1, {"num_generations": 4, "eval_batch_size": 6}),  # refused twice: GRPOConfig names the evaluation first
])
def test_grpo_batch_rules_match_grpoconfig(tmp_path: Any, micro: int, accum: int, procs: int,
                                           fields: dict[str, Any]) -> None:
    trl = pytest.importorskip("trl")
    spec = _spec(micro, accum, procs, **fields)
    kwargs: dict[str, Any] = {
        "output_dir": str(tmp_path), "use_cpu": True, "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum, "num_generations": fields["num_generations"],
    }
    for key in ("generation_batch_size", "steps_per_generation"):
        if key in fields:
            kwargs[key] = fields[key]
    if "eval_batch_size" in fields:
        kwargs.update(per_device_eval_batch_size=fields["eval_batch_size"], eval_strategy="steps", do_eval=True)
    config_cls = trl.GRPOConfig
    world = property(lambda self: procs)  # GRPOConfig reads self.world_size (TrainingArguments property)
    patched = type("GRPOConfigN", (config_cls,), {"world_size": world})
    try:
        patched(**kwargs)
        raised = ""
    except ValueError as exc:
        raised = str(exc)
    refusal = grpo_batch_error(spec)
    assert (refusal is not None) is bool(raised)
    assert _check_named(refusal or "") == _check_named(raised), (refusal, raised)  # the check GRPOConfig fails first


def _check_named(message: str) -> str:
    """Which of GRPOConfig's batch checks a refusal names (GRPOConfig's wording and GrpoBatch.refusal's)."""
    for check, words in (("eval", "eval batch size"), ("global", "the global batch size"),
                         ("generations", "divisible by num_generations")):
        if words in message:
            return check
    return message


def test_max_micro_batch_respects_num_generations() -> None:
    spec = _spec(2, 1, 1, num_generations=6)
    report_fn = estimate
    best = max_micro_batch(spec, report_fn)
    assert best > 0 and grpo_batch_error(spec, best) is None and best % 6 == 0
    assert grpo_valid_micro_batch(spec, 13) == 12 and grpo_valid_micro_batch(spec, 5) == 0
    assert estimate(dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, micro_batch=best))).fits
    assert Phase.GENERATION in estimate(spec).phase_totals()


@pytest.mark.parametrize(("flags", "share", "host"), [
    ((), 1, False),
    (("--zero_stage", "2", "--num_processes", "4"), 1, False),  # prepare_deepspeed: stage 0 for the reference
    (("--zero_stage", "3", "--num_processes", "4"), 4, False),  # ZeRO-3 kept: the reference is sharded too
    (("--fsdp", "full_shard", "--num_processes", "4"), 4, False),  # prepare_fsdp with the run's plugin
    (("--zero_stage", "3", "--num_processes", "4", "--offload_param", "cpu"), 4, True),
])
def test_reference_copy_sharded_as_trl_prepares_it(capsys: pytest.CaptureFixture[str], flags: tuple[str, ...],
                                                   share: int, host: bool) -> None:
    # the reference copy is a state component of the formula (core/trainers/steps.py), the same on the default
    # path (it replaces only the activations): --no_trace, as test_trl_cli's reference-copy test; the default path
    # would trace and replay a DPO run (and its ZeRO / FSDP rewrite) per case
    _, j = run_json(capsys, "--trainer", "dpo", "--dtype", "bfloat16", *flags, "--no_trace")
    ref = next(c for c in j["component_detail"] if c["name"] == "reference_model.weights")
    full = 494_032_768 * 2  # Qwen2.5-0.5B in bf16 (--dtype: model_init_kwargs={"dtype": "bfloat16"})
    per_node = 4 if host else 1
    assert ref["bytes_by_phase"]["end of forward"] == -(-full // share) * per_node
    assert (ref["location"] == "host") is host


def test_kto_defaults_match_installed_trl_and_step(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    trl = pytest.importorskip("trl")
    from fitcheck.integrations.trl_live import trainer_kind_of

    from fitcheck.core.trainers import TRAINERS

    config = trl.KTOConfig(output_dir=str(tmp_path), use_cpu=True)
    for key, value in TRAINERS[TrainerKind.KTO].defaults.items():
        assert getattr(config, key) == value, key
    assert trainer_kind_of(config) is TrainerKind.KTO
    # the formula's answer (--no_trace): the components and the KTO-below-DPO order are the formula's; the KTO
    # replay is checked against the real trainer in test_kto_replay.py
    args = ("--trainer", "kto", "--max_prompt_length", "256", "--max_completion_length", "256", "--no_trace")
    code, kto = run_json(capsys, *args)
    _, dpo = run_json(capsys, "--trainer", "dpo", *args[2:])
    assert code == 0 and kto["trainer"] == "kto" and "reference_model.weights" in kto["components"]
    assert kto["peak_allocated_bytes"] < dpo["peak_allocated_bytes"]  # one completion per row, DPO runs two
    _, peft = run_json(capsys, *args, "--use_peft")
    assert "reference_model.weights" not in peft["components"]


@pytest.mark.parametrize("name", ["orpo", "cpo"])
def test_orpo_cpo_refused_with_the_reason(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert main([*MODEL, "--trainer", name]) == 2
    err = capsys.readouterr().err
    assert "not modelled" in err and "full-vocabulary logits" in err and "Traceback" not in err


@pytest.mark.parametrize(("flags", "expected"), [
    (("--fsdp", "full_shard", "--num_processes", "8"), True),  # FSDP2 (default): one unit, gathered whole
    (("--fsdp", "full_shard", "--num_processes", "8", "--use_peft"), False),  # no reference copy
    (("--zero_stage", "3", "--num_processes", "8"), False),  # DeepSpeed ZeRO-3 gathers per module
])
def test_fsdp2_reference_gathered_whole_finding(capsys: pytest.CaptureFixture[str], flags: tuple[str, ...],
                                                expected: bool) -> None:
    _, j = run_json(capsys, "--trainer", "dpo", "--dtype", "bfloat16", *flags)
    found = [f for f in j["findings"] if f["code"] == "fsdp2-reference-gathered-whole"]
    assert bool(found) is expected
    if found:  # the whole bf16 copy minus this GPU's shard
        from fitcheck.units import format_bytes

        full = 494_032_768 * 2  # Qwen2.5-0.5B in bf16
        assert format_bytes(full - -(-full // 8)) in found[0]["message"]
