"""benchmarks/gpu_truth.py: the real-step harness, exercised on CPU here; its CUDA path where a GPU exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmark_module import load_benchmark

pytest.importorskip("transformers")
pytest.importorskip("peft")

gpu_truth = load_benchmark("gpu_truth")

FULL = "llama1b bf16 full adamw_torch"
QLORA = "llama1b QLoRA nf4 dq ckpt"


def _row(name: str) -> Any:
    return next(r for r in gpu_truth.ROWS if r.name == name)


def test_every_row_is_read_by_the_estimate_cli_and_estimated() -> None:
    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core.estimator import estimate

    names = [r.name for r in gpu_truth.ROWS]
    assert len(names) == len(set(names))
    quick = gpu_truth.select("cuda", True, [])
    assert 6 <= len(quick) <= 12  # the --quick subset must stay small enough for one 10-minute device command
    assert {r.name for r in gpu_truth.select("cpu", False, [])} == {r.name for r in gpu_truth.ROWS if r.cpu}
    for row in gpu_truth.ROWS:
        for device in ("cuda", "cpu"):
            values = gpu_truth.parse_values(["--model_name_or_path", row.model, *row.argv(device)])
            assert values["optim"] == row.optim
            expected = (2, 64) if device == "cpu" else (row.batch, row.seq)
            assert (int(values["per_device_train_batch_size"]), int(values["max_seq_length"])) == expected
            spec, _ = spec_from_values({**values, "device_type": device}, {})
            assert estimate(spec).peak_allocated_bytes > 0, row.name
        if row.layers:
            assert gpu_truth.row_config(row, "cuda")["num_hidden_layers"] == row.layers


def test_tiny_config_keeps_the_architecture() -> None:
    from fitcheck.catalog.models import find_catalog_config

    found = find_catalog_config("meta-llama/Llama-3.2-1B")
    assert found is not None
    tiny = gpu_truth.tiny_config(found[0])
    assert (tiny["hidden_size"], tiny["num_attention_heads"], tiny["num_key_value_heads"]) == (128, 4, 2)  # GQA
    assert tiny["vocab_size"] == 512 and tiny["bos_token_id"] < 512
    assert tiny["tie_word_embeddings"] is True and tiny["model_type"] == "llama"
    assert gpu_truth.row_config(_row(FULL), "cpu")["num_hidden_layers"] == 2


@pytest.mark.slow
def test_cpu_qlora_row_in_process_has_both_numbers() -> None:
    result = gpu_truth.run_row(_row(QLORA), "cpu")
    assert result["status"] == "ok", result.get("traceback", result.get("error"))
    measured, est = result["measured"], result["estimate"]
    assert measured["max_allocated"] > 0 and est["peak_allocated_bytes"] > 0
    assert measured["max_reserved"] is None and measured["used_peak"] is None  # no allocator on CPU
    err = result["error_pct"]["allocated"]
    assert isinstance(err, float) and abs(err) < 30, err  # a sane error, not a tuned bound
    assert result["trainable_params"] == est["trainable_params"] > 0  # LoRA adapters only
    assert any("lora" in name.lower() for name in est["components"])
    json.dumps(result)  # the row goes into the data file as is


@pytest.mark.slow
def test_cpu_worker_output_matches_the_tracer(capsys: pytest.CaptureFixture[str]) -> None:
    from fitcheck.torch_adapters.tracer import trace_step

    assert gpu_truth.main(["--worker", FULL, "--device", "cpu"]) == 0  # what each row's subprocess runs
    row = gpu_truth.worker_result(_row(FULL), "noise\n" + capsys.readouterr().out, "", 0)
    assert row["name"] == FULL and row["status"] == "ok", row.get("traceback", row.get("error"))
    assert row["environment"]["torch"] and row["error_pct"]["allocated"] is not None
    # an independent measurement of the same step (the tracer's real-tensor recorder, 2 steps, no clipping)
    real = trace_step(gpu_truth.row_config(_row(FULL), "cpu"), seq_len=64, micro_batch=2, dtype="bfloat16",
                      optimizer="adamw_torch", fake=False)
    assert abs(row["measured"]["max_allocated"] - real.peak) <= 0.01 * real.peak


def test_dead_worker_is_a_crash_row() -> None:
    result = gpu_truth.worker_result(_row(FULL), "", "Segmentation fault", -11)
    assert result["status"] == "crash" and "Segmentation fault" in result["error"]


def test_worker_timeout_is_recorded_not_raised() -> None:
    result = gpu_truth.run_in_subprocess(_row(FULL), "cpu", timeout=0.2)
    assert result["status"] == "timeout" and result["name"] == FULL


def test_table_summary_json_and_resume(tmp_path: Path) -> None:
    ok = {"name": "a", "status": "ok", "trainable_params": 10,
          "environment": {"gpu_name": "NVIDIA H100 80GB HBM3", "torch": "x"},
          "measured": {"max_allocated": 100 * 2**20, "max_reserved": 120 * 2**20, "used_peak": 130 * 2**20},
          "estimate": {"peak_allocated_bytes": 110 * 2**20, "peak_reserved_bytes": 120 * 2**20,
                       "device_used_bytes": 117 * 2**20, "peak_phase": "start of backward", "fits": True,
                       "trainable_params": 10},
          "error_pct": {"allocated": 10.0, "reserved": 0.0, "used": -10.0}}
    oom = {"name": "b", "status": "oom", "error": "OutOfMemoryError: CUDA out of memory",
           "measured": {"max_allocated": 5}, "estimate": {"fits": False, "trainable_params": 1}}
    late = {"name": "c", "status": "skipped", "error": "time budget"}
    unestimated = {"name": "d", "status": "ok", "trainable_params": 3, "measured": {"max_allocated": 7},
                   "estimate_error": "NotModelledError: x", "error_pct": {"allocated": None}}
    results = [ok, oom, late, unestimated]
    table = gpu_truth.format_table(results)
    assert "+10.00%" in table and "-10.00%" in table and "oom" in table and "time budget" in table
    assert "NotModelledError" in table
    summ = gpu_truth.summary(results)
    assert summ["median_abs_err_allocated_pct"] == 10.0 and summ["oom_rows_predicted_not_fit"] == "1/1"
    assert summ["trainable_params_mismatch"] == []
    path = gpu_truth.output_path(str(tmp_path), "cuda", results)
    assert path.name == "gpu_truth_nvidia_h100_80gb_hbm3.json"
    gpu_truth.write_json(path, "cuda", results, ["--quick"])
    doc = json.loads(path.read_text())
    assert doc["environment"]["gpu_name"] == "NVIDIA H100 80GB HBM3" and len(doc["rows"]) == 4
    assert set(gpu_truth._done_rows(str(path))) == {"a", "b", "d"}  # --resume reruns only what did not run


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_row_measures_allocator_and_device(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    assert gpu_truth.main(["--device", "cuda", "--rows", FULL, "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "ok", row.get("traceback", row.get("error"))
    m = row["measured"]
    assert 0 < m["max_allocated"] <= m["max_reserved"] <= m["used_peak"]
    assert row["environment"]["gpu_name"] and row["environment"]["used_at_init"] > 0
    assert all(abs(e) < 30 for e in row["error_pct"].values()), row["error_pct"]


def test_resume_reuses_finished_rows_without_running_them(tmp_path: Path) -> None:
    rows = gpu_truth.select("cpu", False, [])
    earlier = tmp_path / "earlier.json"
    done = [{"name": r.name, "status": "ok", "measured": {"max_allocated": 1}} for r in rows]
    gpu_truth.write_json(earlier, "cpu", done, [])
    out = tmp_path / "now.json"
    assert gpu_truth.main(["--device", "cpu", "--resume", str(earlier), "--out", str(out)]) == 0
    assert [r["name"] for r in json.loads(out.read_text())["rows"]] == [r.name for r in rows]


def test_length_and_allocator_rows_reach_the_estimate_and_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``lengths`` row is estimated with ``--seq_lengths`` (its longest as ``--max_seq_length``) and an
    ``alloc_conf`` row with ``--cuda_alloc_conf``; the worker process runs under that ``PYTORCH_CUDA_ALLOC_CONF``."""
    row = _row("llama1b bf16 full fused lengths split128")
    values = gpu_truth.parse_values(["--model_name_or_path", row.model, *row.argv("cuda")])
    assert values["seq_lengths"] == ",".join(map(str, row.lengths))
    assert int(values["max_seq_length"]) == max(row.lengths)
    assert values["cuda_alloc_conf"] == row.alloc_conf == "max_split_size_mb:128"
    seen: dict[str, Any] = {}

    def fake_run(cmd: list[str], **kw: Any) -> Any:
        seen.update(kw["env"])
        raise gpu_truth.subprocess.TimeoutExpired(cmd, 1)

    monkeypatch.setattr(gpu_truth.subprocess, "run", fake_run)
    assert gpu_truth.run_in_subprocess(row, "cuda", 1)["status"] == "timeout"
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def test_steps_of_other_lengths_run_in_order_and_keep_each_steps_counters(tmp_path: Path) -> None:
    """``train_steps(lengths=...)``: one real step per length, in order, nothing reset (CPU: live-tensor peak)."""
    step = load_benchmark("gpu_truth_step")
    row = _row("llama1b bf16 full fused lengths")
    config = gpu_truth.row_config(row, "cpu")
    values = gpu_truth.parse_values(row.argv("cpu"))
    model = step.build_model(config, values, "cpu", tmp_path)
    out = step.train_steps(model, step.make_optimizer(model, "adamw_torch", tmp_path), values, "cpu",
                           lengths=(16, 64, 32))
    assert [s["seq"] for s in out["per_step"]] == [16, 64, 32]
    peaks = [s["max_allocated"] for s in out["per_step"]]
    assert peaks[0] < peaks[1] == peaks[2] == out["max_allocated"]  # the longest step sets the run's peak


def test_trainer_gpu_cases_are_estimated_with_their_deepspeed_configs(tmp_path: Path) -> None:
    """Every ``trainer_gpu.py`` case's flags (and DeepSpeed config file) are read by the estimate CLI."""
    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core.estimator import estimate

    trainer_gpu = load_benchmark("trainer_gpu")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(gpu_truth.row_config(_row(FULL), "cpu")))
    stages = set()
    for case, (ds, _, _) in trainer_gpu.CASES.items():
        values = gpu_truth.parse_values(trainer_gpu.estimate_argv(tmp_path / "model", case, tmp_path))
        spec, _ = spec_from_values(values, {})
        assert estimate(spec).peak_allocated_bytes > 0, case
        stages.add(spec.sharding.zero_stage if ds else None)
    assert stages == {None, 2, 3}
