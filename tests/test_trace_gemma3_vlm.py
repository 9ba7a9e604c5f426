"""Issue 21: ``--trace`` on a Gemma-3 image-text model (a composite config: the text layers sit in
``text_config``; SigLIP initialises with rejection-sampled ``trunc_normal_``) traces the text step instead of
failing with "no layer count", and where it cannot trace (images on a family other than Qwen2.5-VL) the
report's fix says what runs instead. Each test failed before the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fitcheck.catalog import find_catalog_config
from fitcheck.cli.main import main
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_build import config_layers, reduced_config


def _gemma3(**text: Any) -> dict[str, Any]:
    found = find_catalog_config("google/gemma-3-4b-it")
    assert found is not None
    return dict(found[0], text_config={**found[0]["text_config"], **text})


def _tiny() -> dict[str, Any]:
    cfg = _gemma3(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, vocab_size=300)
    cfg["vision_config"] = {**cfg["vision_config"], "hidden_size": 32, "intermediate_size": 64,
                            "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 56}
    cfg.update(mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298)
    return cfg


def test_layers_of_a_composite_config_are_the_text_configs() -> None:
    cfg = _gemma3()
    assert config_layers(cfg) == 34  # was ConfigError("no layer count")
    two = reduced_config(cfg, 2)
    assert two["text_config"]["num_hidden_layers"] == 2 and "num_hidden_layers" not in two
    assert two["vision_config"]["num_hidden_layers"] == 27  # the tower keeps its depth


def test_text_step_fake_equals_real() -> None:
    """The traced text step of a Gemma-3 image-text model equals the real CPU step (the fake-mode init of
    SigLIP's weights changes no byte)."""
    args: dict[str, Any] = {"seq_len": 32, "micro_batch": 2, "dtype": "float32", "task": "image-text-to-text"}
    fake = trace_step(_tiny(), fake=True, **args)
    real = trace_step(_tiny(), fake=False, **args)
    assert {p: b.total for p, b in fake.phases.items()} == {p: b.total for p, b in real.phases.items()}


def test_trace_flag_traces_and_the_printed_fix_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_tiny()))
    base = ["estimate", "--model_name_or_path", str(tmp_path), "--max_seq_length", "64",
            "--per_device_train_batch_size", "2", "--json"]
    # with images the formula answers, and its fix names a command that runs
    assert main([*base, "--image_tokens", "16", "--no_trace"]) == 0
    report = json.loads(capsys.readouterr().out)
    hints = [f["hint"] for f in report["findings"] if f["code"] in ("activations-not-pinned", "backward-not-pinned")]
    assert hints and all("--trace --image_tokens 0" in h for h in hints)
    assert main([*base, "--trace", "--image_tokens", "0"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert "activations.traced" in traced["components"] and traced["pinned"]
    assert not any(f["code"] == "activations-not-pinned" for f in traced["findings"])
