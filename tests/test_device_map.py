"""The device_map="auto" check: placement from the libraries' own code on a meta model, trainable params flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from fitcheck.errors import ConfigError
from fitcheck.families import traits_of_type
from fitcheck.findings import Severity
from fitcheck.spec import (
    Dtype,
    LoraSpec,
    MixedPrecision,
    ModelInventory,
    ModelShape,
    PrecisionSpec,
    QuantSpec,
    ShardingSpec,
    Strategy,
    TrainingSpec,
)
from fitcheck.torch_adapters import device_map as dm
from fitcheck.torch_adapters import device_map_check as check
from fitcheck.torch_adapters.live_model import live_device_map_findings

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3
LLAMA3_8B = ROOT / "fitcheck" / "catalog" / "models" / "meta-llama" / "Meta-Llama-3-8B" / "config.json"
TINY = ROOT / "examples" / "tiny-llama" / "config.json"


def _inventory(path: Path, model_id: str) -> ModelInventory:
    cfg = json.loads(path.read_text())
    shape = ModelShape(
        family="llama", traits=traits_of_type("llama"), architecture="LlamaForCausalLM", hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg["num_key_value_heads"], head_dim=cfg.get("head_dim", 128),
        intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
    )
    return ModelInventory(model_id=model_id, shape=shape, params=(), config=cfg)


@pytest.fixture(scope="module")
def llama8b() -> ModelInventory:
    return _inventory(LLAMA3_8B, "meta-llama/Meta-Llama-3-8B")


def _spec(inv: ModelInventory, load: Dtype, **kw: object) -> TrainingSpec:
    return TrainingSpec(model=inv, precision=PrecisionSpec(load_dtype=load, mixed_precision=MixedPrecision.BF16),
                        **kw)  # type: ignore[arg-type]


def test_llama3_8b_full_ft_on_24gib_flags_trainable_modules_on_cpu(llama8b: ModelInventory) -> None:
    """The issue's case: full fine-tune, bf16 autocast, weights loaded in fp32 (the transformers 4.x default,
    or --dtype float32), device_map='auto', max_memory {0: 24GiB, cpu: 200GiB}."""
    spec = _spec(llama8b, Dtype.FLOAT32)
    placement = dm.predict_placement(spec, "auto", {"0": 24 * GIB, "cpu": 200 * GIB})
    on_cpu = [k for k, v in placement.device_map.items() if v == "cpu"]
    assert "lm_head" in on_cpu and "model.norm" in on_cpu
    assert placement.device_map["model.embed_tokens"] == 0
    # every parameter of the offloaded modules is trainable in a full fine-tune: count them from the inventory
    layer = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096  # attn + mlp + 2 norms
    offloaded_layers = [k for k in on_cpu if k.startswith("model.layers.")]
    expected = len(offloaded_layers) * layer + 4096 + 128256 * 4096  # + final norm + lm_head
    assert placement.offloaded_trainable_params == expected
    assert placement.trainable_params == 8_030_261_248
    findings = check.device_map_findings(spec, "auto", {"0": 24 * GIB, "cpu": 200 * GIB})
    (f,) = [f for f in findings if f.code == "trainable-offloaded"]
    assert f.severity is Severity.ERROR
    assert f"{expected:,}" in f.message and "lm_head" in f.message and "model.layers." in f.message
    assert "max_memory" in f.hint and "ZeRO-3" in f.hint


def test_bf16_weights_fit_24gib_but_not_12gib(llama8b: ModelInventory) -> None:
    """transformers 5 loads Llama-3-8B in bf16 ("auto"): 14.96 GiB of weights fit in 24 GiB, so nothing is
    offloaded there (the training states not fitting is the estimate's does-not-fit, not a placement issue)."""
    spec = _spec(llama8b, Dtype.BFLOAT16)
    assert not check.device_map_findings(spec, "auto", "0=24GiB,cpu=200GiB")
    codes = [f.code for f in check.device_map_findings(spec, "auto", "0=12GiB,cpu=200GiB")]
    assert codes == ["trainable-offloaded"]


def test_lora_counts_only_adapters_of_offloaded_hosts(llama8b: ModelInventory) -> None:
    lora = LoraSpec(r=16, target_modules=("all-linear",))
    placement = dm.predict_placement(_spec(llama8b, Dtype.BFLOAT16, lora=lora), "auto", {"0": 8 * GIB})
    assert placement.trainable_params == 41_943_040  # r*(in+out) over every linear but lm_head (peft, measured)
    n_off = sum(1 for k in placement.offloaded_modules if k.startswith("model.layers."))
    assert n_off > 0
    assert placement.offloaded_trainable_params == n_off * 41_943_040 // 32


def test_qlora_offload_is_refused_by_bitsandbytes(llama8b: ModelInventory) -> None:
    spec = _spec(llama8b, Dtype.BFLOAT16, lora=LoraSpec(r=16, target_modules=("q_proj", "v_proj")),
                 quant=QuantSpec(bits=4, compute_dtype=Dtype.BFLOAT16))
    roomy = dm.predict_placement(spec, "auto", {"0": 24 * GIB})
    assert set(roomy.device_map.values()) == {0} and roomy.quantizer_error is None
    tight = check.device_map_findings(spec, "auto", {"0": 3 * GIB})
    assert {"trainable-offloaded", "quantized-offload-refused"} <= {f.code for f in tight}


def test_multi_device_map_on_several_processes_is_refused(llama8b: ModelInventory) -> None:
    spec = _spec(llama8b, Dtype.BFLOAT16, sharding=ShardingSpec(strategy=Strategy.DDP, num_processes=2))
    codes = {f.code for f in check.device_map_findings(spec, "auto", {"0": 10 * GIB, "1": 10 * GIB})}
    assert "device-map-distributed" in codes


def test_accelerate_fallback_path_matches_transformers_5(
    llama8b: ModelInventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 4.x used accelerate's own functions; without transformers 5's copies the fallback runs."""
    spec = _spec(llama8b, Dtype.FLOAT32)
    v5 = dm.predict_placement(spec, "auto", {"0": 24 * GIB, "cpu": 200 * GIB})
    import transformers.integrations.accelerate as hf_acc

    monkeypatch.delattr(hf_acc, "infer_auto_device_map")
    v4 = dm.predict_placement(spec, "auto", {"0": 24 * GIB, "cpu": 200 * GIB})
    assert v4.offloaded_modules == v5.offloaded_modules
    assert v4.offloaded_trainable_params == v5.offloaded_trainable_params


def test_no_max_memory_uses_the_gpu_with_transformers_90_percent(llama8b: ModelInventory) -> None:
    from fitcheck.spec import HardwareSpec

    spec = _spec(llama8b, Dtype.FLOAT32, hardware=HardwareSpec(gpu_memory_bytes=24 * GIB))
    placement = dm.predict_placement(spec, "auto", None)
    assert placement.max_memory[0] == int(24 * GIB * 0.9)
    assert placement.offloaded_modules


def test_parse_max_memory_and_errors() -> None:
    assert dm.parse_max_memory("0=24GiB,cpu=200GiB") == {0: 24 * GIB, "cpu": 200 * GIB}
    assert dm.parse_max_memory({"1": "10GB"}) == {1: 10 * 1000**3}
    with pytest.raises(ConfigError, match="max_memory"):
        dm.parse_max_memory("0:24GiB")
    with pytest.raises(ConfigError, match="gpu0"):
        dm.parse_max_memory({"gpu0": 1})


def test_summarize_modules_collapses_layer_runs() -> None:
    names = [f"model.layers.{i}" for i in (3, 4, 5, 9)] + ["model.norm", "lm_head"]
    assert check.summarize_modules(names) == "model.layers.{3-5,9}, model.norm, lm_head"
    assert check.summarize_modules(["model.layers.7"]) == "model.layers.7"


def test_unbuildable_config_is_a_warning_not_a_crash() -> None:
    inv = _inventory(TINY, "tiny")
    broken = ModelInventory(model_id="x", shape=inv.shape, params=(), config={"model_type": "no-such-model"})
    (f,) = check.device_map_findings(_spec(broken, Dtype.FLOAT32), "auto", {"0": GIB})
    assert f.code == "device-map-not-checked" and f.severity is Severity.WARNING


def test_live_model_offloaded_trainable_params_are_flagged() -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY.parent))
    assert not live_device_map_findings(model)  # all on CPU: CPU training, not offloading
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                           "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    layer1 = sum(p.numel() for p in model.model.layers[1].parameters())
    expected = layer1 + model.model.norm.weight.numel() + model.lm_head.weight.numel()
    (f,) = live_device_map_findings(model)
    assert f.code == "trainable-offloaded" and f"{expected:,}" in f.message
    for p in model.parameters():  # frozen model: nothing trainable is offloaded
        p.requires_grad_(False)
    assert [f.code for f in live_device_map_findings(model, num_processes=2)] == ["device-map-distributed"]
    del torch
