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
                 "--per_device_train_batch_size", "1", "--max_seq_length", "1024", "--json", "--no_trace", *extra])
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
    # with checkpointing even a frozen tower keeps its block inputs (enable_input_require_grads hooks patch_embed)
    assert comps.get("activations.vision", 0) > 0
    findings = out["findings"]
    assert isinstance(findings, list)
    msg = next(f["message"] for f in findings if f["code"] == "vision-tower-counted")
    assert ("frozen" in msg) == (vision == 0)  # all-linear reaches the tower


def test_vision_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model_name_or_path", "meta-llama/Llama-3.2-1B", "--image_tokens", "256"]) == 2
    assert main(["estimate", "--model_name_or_path", "meta-llama/Llama-3.2-1B", "--task",
                 "image-text-to-text"]) == 2
    _code, out = _estimate(capsys, "--lora_target_modules", "all-linear")
    assert "vision-tokens-not-given" in {f["code"] for f in out["findings"]}  # type: ignore[union-attr]


# A tiny Qwen2.5-VL (real classes, random weights) for the traced checks: 2 text layers, 2 vision blocks (one
# windowed, one full attention), a vocabulary large enough that the forward peak is at the LM head (as at real
# widths) and not inside the tower.
def _tiny_config() -> dict[str, object]:
    cfg = json.loads(VL.read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=2, vocab_size=32000, bos_token_id=1, eos_token_id=2, vision_start_token_id=500,
               vision_end_token_id=501, vision_token_id=502, image_token_id=503, video_token_id=504,
               max_window_layers=2, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    cfg["vision_config"] = dict(cfg["vision_config"], depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                out_hidden_size=64, fullatt_block_indexes=[1])
    return cfg


def _tiny_spec(cfg: dict[str, object], image_tokens: int, lora: object, ckpt: bool) -> object:
    import dataclasses

    from fitcheck.readers import with_task
    from fitcheck.spec import (
        ActivationSpec,
        BatchSpec,
        DeviceType,
        Dtype,
        HardwareSpec,
        MixedPrecision,
        OptimizerSpec,
        PrecisionSpec,
        TrainingSpec,
    )
    from fitcheck.torch_adapters.meta_device import meta_inventory

    inv = with_task(meta_inventory(cfg, "tiny-vl", "test", "image-text-to-text"), "image-text-to-text", 0)
    inv = dataclasses.replace(inv, shape=dataclasses.replace(inv.shape, image_tokens=image_tokens))
    return TrainingSpec(model=inv, precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.NO),
                        optimizer=OptimizerSpec("adamw_torch"), batch=BatchSpec(micro_batch=2, seq_len=48),
                        activations=ActivationSpec(checkpointing=ckpt),
                        hardware=HardwareSpec(device_type=DeviceType.CPU), lora=lora)  # type: ignore[arg-type]


def test_composite_config_text_widths() -> None:
    """The meta inventory's shape is the language model's (text_config), not the vision tower's depth."""
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters.meta_device import meta_inventory
    from fitcheck.torch_adapters.tracer_build import hf_config

    cfg = json.loads(VL.read_text())
    text = hf_config(cfg, "sdpa").text_config
    shape = meta_inventory(cfg, "vl", "test", "image-text-to-text").shape
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.intermediate_size) == (
        text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads, text.intermediate_size)
    assert shape.head_dim == text.hidden_size // text.num_attention_heads
    names = {p.name for p in meta_inventory(cfg, "vl", "test", "image-text-to-text").params}
    assert "lm_head.weight" in names  # untied head present (tie_word_embeddings false)


def test_image_grid_and_refusals() -> None:
    from fitcheck.errors import ConfigError, UnsupportedModelError
    from fitcheck.torch_adapters.trace_inputs_vlm import check_traceable, image_grid

    cfg = json.loads(VL.read_text())
    assert image_grid(cfg, 4096) == (64, 64)
    assert image_grid(cfg, 2048) == (32, 64)
    with pytest.raises(ConfigError, match="multiple of 4"):
        image_grid(cfg, 1026)
    with pytest.raises(UnsupportedModelError, match="qwen2_5_vl"):
        check_traceable({**cfg, "model_type": "gemma3"}, 256)
    check_traceable({**cfg, "model_type": "gemma3"}, 0)  # no images: nothing to feed


def test_vlm_traced_on_request_only() -> None:
    """Automatic tracing skips VLMs (minutes per estimate); --trace traces Qwen2.5-VL fed images."""
    from fitcheck.torch_adapters.pinned_path import PinnedPath, traceable

    spec = _tiny_spec(_tiny_config(), 64, None, False)
    assert not traceable(spec)  # type: ignore[arg-type]
    assert not PinnedPath("auto", can_trace=True).wants_trace(spec)  # type: ignore[arg-type]
    assert PinnedPath("always", can_trace=True).wants_trace(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "ckpt"), [("full", False), ("all-linear", True), ("text-attn", True),
                                              ("all-linear", False)])
def test_vision_formula_equals_trace_with_images(method: str, ckpt: bool) -> None:
    """activations.vision = (trace fed images) - (same step, text only), to the byte, at the end of forward."""
    pytest.importorskip("transformers")
    from fitcheck.core import estimate
    from fitcheck.report import Phase
    from fitcheck.spec import LoraSpec
    from fitcheck.torch_adapters.trace_arguments import trace_kwargs
    from fitcheck.torch_adapters.tracer import trace_step

    lora = {"full": None, "all-linear": LoraSpec(r=4, alpha=8, target_modules=("all-linear",)),
            "text-attn": LoraSpec(r=4, alpha=8, target_modules=("q_proj", "v_proj"))}[method]
    cfg = _tiny_config()
    spec = _tiny_spec(cfg, 128, lora, ckpt)
    with_images = trace_step(cfg, **trace_kwargs(spec))  # type: ignore[arg-type]
    text_only = trace_step(cfg, **trace_kwargs(_tiny_spec(cfg, 0, lora, ckpt)))  # type: ignore[arg-type]
    traced = (with_images.phases[Phase.FORWARD_END].get("activations")
              - text_only.phases[Phase.FORWARD_END].get("activations"))
    vision = {c.name: c for c in estimate(spec).components}["activations.vision"]  # type: ignore[arg-type]
    assert vision.at(Phase.FORWARD_END) == traced
    pixels = 2 * 128 * 3 * 2 * 14 * 14 * 4  # float32 pixel_values, traced as an input
    assert with_images.phases[Phase.FORWARD_END].get("inputs") - text_only.phases[Phase.FORWARD_END].get(
        "inputs") >= pixels


@pytest.mark.slow
def test_fake_trace_fed_images_equals_real_step() -> None:
    """The constants trick (trace_inputs_vlm) changes no byte: the fake trace equals a real CPU step."""
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters.tracer import trace_step

    cfg = _tiny_config()
    for ckpt in (False, True):
        kw = {"seq_len": 48, "micro_batch": 2, "task": "image-text-to-text", "image_tokens": 128,
              "checkpointing": ckpt}
        fake = trace_step(cfg, fake=True, **kw)  # type: ignore[arg-type]
        real = trace_step(cfg, fake=False, **kw)  # type: ignore[arg-type]
        assert {p: b.total for p, b in fake.phases.items()} == {p: b.total for p, b in real.phases.items()}
