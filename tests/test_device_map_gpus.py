"""Multi-GPU ``device_map="auto"`` (issue 12): one estimate per GPU, the busiest decides.

The placement is accelerate's own (``predict_placement``); the per-GPU split must conserve the model (every
weight byte on exactly one GPU, every layer on one GPU), put the logits on the head's GPU only, and report the
busiest GPU as the headline with ``device_map_gpus`` in the JSON.
"""

from __future__ import annotations

import json

import pytest

from fitcheck.cli.main import main

BASE = ["estimate", "--model_name_or_path", "meta-llama/Llama-3.2-1B", "--dtype", "bfloat16",
        "--per_device_train_batch_size", "2", "--max_seq_length", "512", "--gradient_checkpointing",
        "--use_peft", "--lora_target_modules", "all-linear", "--device_map", "auto", "--json"]


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, object]]:
    code = main([*BASE, *extra])
    return code, json.loads(capsys.readouterr().out)


def test_two_gpus_conserve_weights_and_put_logits_on_the_head_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("accelerate")
    code, single = _run(capsys, "--max_memory", "0=40GiB,cpu=100GiB")
    assert "device_map_gpus" not in single  # one GPU: the ordinary estimate
    code, out = _run(capsys, "--max_memory", "0=1500MiB,1=6GiB,cpu=100GiB")
    gpus = out["device_map_gpus"]
    assert isinstance(gpus, list) and len(gpus) == 2
    whole = single["components"]
    assert isinstance(whole, dict)
    whole_weights = sum(v for k, v in whole.items() if k.startswith(("weights", "adapters")))
    assert sum(g["weights_bytes"] for g in gpus) == whole_weights
    spans = [g["layers"] for g in gpus]
    assert spans[0][0] == 0 and spans[-1][1] == 15 and spans[0][1] + 1 == spans[1][0]  # 16 layers, contiguous
    assert [g["holds_head"] for g in gpus] == [True, False]  # tied embeddings: the head runs on the embedding GPU
    assert gpus[1]["budget_bytes"] == gpus[0]["budget_bytes"] != 6 * 2**30  # the card: max_memory bounds weights only
    top = max(gpus, key=lambda g: g["device_used_bytes"] / g["budget_bytes"])
    assert out["peak_allocated_bytes"] == top["peak_allocated_bytes"]
    assert out["fits"] == all(g["fits"] for g in gpus)
    assert code == (0 if out["fits"] else 1)
    assert "device-map-per-gpu" in {f["code"] for f in out["findings"]}  # type: ignore[union-attr]
