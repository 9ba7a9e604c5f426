"""device_map plans weights only: bf16 Llama-3-8B fits a 24 GiB budget whole; fp32 spills trainable layers to CPU."""

from __future__ import annotations

import json

import pytest

from fitcheck.cli.main import main

BASE = [
    "estimate",
    "--model_name_or_path",
    "meta-llama/Meta-Llama-3-8B",
    "--bf16",
    "--optim",
    "adamw_torch",
    "--per_device_train_batch_size",
    "2",
    "--max_seq_length",
    "1024",
    "--gpu",
    "H100-80GB",
    "--device_map",
    "auto",
    "--max_memory",
    "0=24GiB,cpu=200GiB",
    "--json",
]


def codes(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, str]:
    main([*BASE, *extra])
    return {f["code"]: f["message"] for f in json.loads(capsys.readouterr().out)["findings"]}


def test_bf16_weights_fit_the_budget_so_nothing_is_offloaded_but_the_step_would_oom(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # accelerate's infer_auto_device_map keeps all 14.96 GiB of bf16 weights on GPU 0 under a 24 GiB max_memory
    found = codes(capsys, "--dtype", "bfloat16", "--gpu", "RTX4090-24GB")
    assert "trainable-offloaded" not in found
    assert "device-map-plans-weights-only" in found
    # on a 141 GB card the same placement leaves room for the step: no device_map finding at all (on the 80 GB
    # card the step is near the budget, and its whole run replayed through the allocator does not fit)
    found = codes(capsys, "--dtype", "bfloat16", "--gpu", "H200-141GB")
    assert not {"trainable-offloaded", "device-map-plans-weights-only"} & set(found)


def test_fp32_load_puts_trainable_layers_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    # float32 (transformers 4.x default load dtype): 29.9 GiB of weights do not fit 24 GiB; the last layers and
    # lm_head go to CPU, all of them trainable in a full fine-tune.
    found = codes(capsys, "--dtype", "float32")
    assert "trainable-offloaded" in found
    message = found["trainable-offloaded"]
    assert "lm_head" in message and "model.layers." in message
    assert "device-map-plans-weights-only" not in found
