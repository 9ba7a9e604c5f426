"""Vision-language models (issue 12): Qwen2.5-VL inventory, peft's all-linear rule, vision activations.

peft 0.21.2 ``_maybe_include_all_linear_layers`` excludes only the output embedding: the vision blocks and the
merger (projector) get adapters too. The inventory is ``AutoModelForImageTextToText.from_config`` on the meta
device; the trainable count must equal peft's on that same model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.cli.main import main

VL = Path("/work/shared/catalog/Qwen/Qwen2.5-VL-7B-Instruct/config.json")
pytestmark = pytest.mark.skipif(not VL.is_file(), reason="shared catalog not present")


def _estimate(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, object]]:
    code = main(["estimate", "--model_name_or_path", str(VL), "--use_peft", "--gradient_checkpointing",
                 "--per_device_train_batch_size", "1", "--max_seq_length", "1024", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "k_proj", "v_proj", "o_proj"]])
def test_vlm_lora_trainable_equals_peft(targets: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from fitcheck.torch_adapters.meta_device import build_meta_model

    code, out = _estimate(capsys, "--lora_r", "16", "--lora_alpha", "32", "--lora_target_modules", *targets,
                          "--image_tokens", "1024")
    assert code in (0, 1)
    model = build_meta_model(json.loads(VL.read_text()), "image-text-to-text")
    total = sum(p.numel() for p in model.parameters())
    lora_targets: str | list[str] = "all-linear" if targets == ["all-linear"] else targets
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=lora_targets))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    vision = sum(p.numel() for n, p in peft_model.named_parameters() if p.requires_grad and "visual" in n)
    assert out["trainable_params"] == trainable
    assert out["total_params"] == total + trainable
    comps = out["components"]
    assert isinstance(comps, dict)
    assert (comps.get("activations.vision", 0) > 0) == (vision > 0)  # all-linear reaches the tower


def test_vision_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model_name_or_path", "meta-llama/Llama-3.2-1B", "--image_tokens", "256"]) == 2
    assert main(["estimate", "--model_name_or_path", "meta-llama/Llama-3.2-1B", "--task",
                 "image-text-to-text"]) == 2
    _code, out = _estimate(capsys, "--lora_target_modules", "all-linear")
    assert "vision-tokens-not-given" in {f["code"] for f in out["findings"]}  # type: ignore[union-attr]
