"""Pure-Python parameter inventory and offline model resolution (no torch needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fitcheck.catalog.models import find_catalog_config
from fitcheck.errors import ConfigError, UnsupportedModelError
from fitcheck.readers.model_config import hf_hub_cache, inventory_from_config, load_inventory
from fitcheck.spec import Dtype, Kind, Role

ENV: dict[str, str] = {"HOME": "/nonexistent-home-for-tests"}
REPO = Path(__file__).resolve().parents[1]

# Totals measured with from_config on the meta device (shared notes 04-measured-feasibility.md).
KNOWN_TOTALS = {
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen/Qwen2-7B": 7_615_616_512,
    "google/gemma-2-9b": 9_241_705_984,
}


def _catalog(model_id: str) -> dict[str, object]:
    found = find_catalog_config(model_id)
    assert found is not None
    return found[0]


@pytest.mark.parametrize(("model_id", "total"), KNOWN_TOTALS.items())
def test_known_totals(model_id: str, total: int) -> None:
    inv = load_inventory(model_id, env=ENV)
    assert inv.total_params == total
    assert inv.counted_by == "pure-python"


def test_llama3_8b_entries() -> None:
    inv = load_inventory("meta-llama/Meta-Llama-3-8B", env=ENV)
    by_name = {p.name: p for p in inv.params}
    q = by_name["model.layers.*.self_attn.q_proj.weight"]
    assert (q.shape, q.repeat, q.kind, q.role, q.module) == (
        (4096, 4096),
        32,
        Kind.LINEAR,
        Role.ATTENTION,
        "q_proj",
    )
    assert by_name["model.layers.*.self_attn.k_proj.weight"].shape == (1024, 4096)  # 8 KV heads x 128
    assert by_name["lm_head.weight"].role is Role.LM_HEAD  # untied
    assert inv.by_role()[Role.EMBEDDING] == 128256 * 4096
    s = inv.shape
    assert (s.num_kv_heads, s.head_dim, s.intermediate_size, s.vocab_size) == (8, 128, 14336, 128256)
    assert s.config_dtype is Dtype.BFLOAT16 and s.no_split_module == "LlamaDecoderLayer"
    assert s.mlp_activation == "swiglu" and s.norm == "rmsnorm" and not s.tied_embeddings


def test_tied_embeddings_are_stored_once() -> None:
    inv = load_inventory("google/gemma-2-9b", env=ENV)
    assert inv.shape.tied_embeddings
    assert not any(p.name.startswith("lm_head") for p in inv.params)
    assert inv.shape.config_dtype is Dtype.FLOAT32  # the base gemma-2 files are float32
    assert inv.shape.sliding_window == 4096
    norms = [p.name for p in inv.params if p.role is Role.NORM]
    assert "model.layers.*.pre_feedforward_layernorm.weight" in norms


def test_qwen2_has_qkv_bias_only() -> None:
    inv = load_inventory("Qwen/Qwen2.5-7B", env=ENV)
    biases = {p.name for p in inv.params if p.kind is Kind.BIAS}
    assert biases == {f"model.layers.*.self_attn.{x}_proj.bias" for x in "qkv"}
    assert inv.shape.sliding_window is None  # use_sliding_window is false


def test_mixtral_fused_experts_and_router() -> None:
    inv = load_inventory("mistralai/Mixtral-8x7B-v0.1", env=ENV)
    by_name = {p.name: p for p in inv.params}
    gate_up = by_name["model.layers.*.mlp.experts.gate_up_proj"]
    assert (gate_up.shape, gate_up.kind, gate_up.role) == ((8, 28672, 4096), Kind.FUSED_EXPERTS, Role.EXPERTS)
    assert (gate_up.in_features, gate_up.out_features) == (4096, 28672)
    down = by_name["model.layers.*.mlp.experts.down_proj"]
    assert down.shape == (8, 4096, 14336) and (down.in_features, down.out_features) == (14336, 4096)
    router = by_name["model.layers.*.mlp.gate.weight"]
    assert (router.shape, router.kind, router.role) == ((8, 4096), Kind.OTHER, Role.ROUTER)
    assert (inv.shape.num_experts, inv.shape.experts_per_token) == (8, 2)


def test_gpt2_conv1d_and_positions() -> None:
    inv = load_inventory("gpt2", env=ENV)
    by_name = {p.name: p for p in inv.params}
    c_attn = by_name["transformer.h.*.attn.c_attn.weight"]
    assert c_attn.shape == (768, 2304) and (c_attn.in_features, c_attn.out_features) == (768, 2304)
    assert by_name["transformer.wpe.weight"].role is Role.POSITION
    assert inv.total_params == 124_439_808
    assert inv.shape.config_dtype is None and inv.shape.mlp_activation == "gelu"


def test_bert_is_masked_lm() -> None:
    inv = load_inventory("bert-base-uncased", env=ENV)
    assert not inv.shape.causal_lm
    assert inv.shape.architecture == "BertForMaskedLM"
    assert inv.total_params == 109_514_298


def test_falcon_and_phi_specifics() -> None:
    falcon = load_inventory("tiiuae/falcon-7b", env=ENV)
    assert falcon.shape.num_kv_heads == 1 and falcon.shape.parallel_attn  # multi_query
    qkv = next(p for p in falcon.params if p.name.endswith("query_key_value.weight"))
    assert qkv.shape == (4544 + 2 * 64, 4544)
    phi = load_inventory("microsoft/phi-2", env=ENV)
    assert phi.shape.partial_rotary_factor == 0.4 and phi.shape.parallel_attn
    assert any(p.name == "lm_head.bias" for p in phi.params)


# ---- resolution order --------------------------------------------------------------------------------------


def _write_config(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _small_llama(layers: int) -> dict[str, object]:
    cfg = dict(_catalog("meta-llama/Meta-Llama-3-8B"))
    cfg["num_hidden_layers"] = layers
    return cfg


def test_directory_then_file(tmp_path: Path) -> None:
    path = _write_config(tmp_path / "model", _small_llama(2))
    by_dir = load_inventory(str(tmp_path / "model"), env=ENV)
    by_file = load_inventory(str(path), env=ENV)
    assert by_dir.shape.num_layers == by_file.shape.num_layers == 2
    assert "local directory" in by_dir.source and "local file" in by_file.source


def test_local_directory_wins_over_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_config(tmp_path / "meta-llama" / "Meta-Llama-3-8B", _small_llama(3))
    monkeypatch.chdir(tmp_path)
    assert load_inventory("meta-llama/Meta-Llama-3-8B", env=ENV).shape.num_layers == 3


def _fake_cache(root: Path, model_id: str, config: dict[str, object], rev: str = "abc123") -> None:
    repo = root / ("models--" + model_id.replace("/", "--"))
    _write_config(repo / "snapshots" / rev, config)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev, encoding="utf-8")


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"])
def test_hf_cache_locations(tmp_path: Path, variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "cachebase"
    hub = {
        "HF_HUB_CACHE": base,
        "HF_HOME": base / "hub",
        "XDG_CACHE_HOME": base / "huggingface" / "hub",
        "HOME": base / ".cache" / "huggingface" / "hub",
    }[variable]
    env = {variable: str(base)}
    assert hf_hub_cache(env) == hub
    _fake_cache(hub, "meta-llama/Meta-Llama-3-8B", _small_llama(4))
    inv = load_inventory("meta-llama/Meta-Llama-3-8B", env=env)
    assert inv.shape.num_layers == 4  # the cache wins over the built-in catalog
    assert "Hugging Face cache" in inv.source


def test_hf_cache_precedence_and_tilde(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": "~/hubcache", "HF_HOME": str(tmp_path / "other"), "HOME": str(tmp_path)}
    assert hf_hub_cache(env) == tmp_path / "hubcache"
    _fake_cache(tmp_path / "hubcache", "acme/tiny", _small_llama(1))
    assert load_inventory("acme/tiny", env=env).shape.num_layers == 1


def test_cache_snapshot_named_by_refs_main(tmp_path: Path) -> None:
    _fake_cache(tmp_path, "acme/tiny", _small_llama(5), rev="old")
    _fake_cache(tmp_path, "acme/tiny", _small_llama(6), rev="new")
    env = {"HF_HUB_CACHE": str(tmp_path)}
    assert load_inventory("acme/tiny", env=env).shape.num_layers == 6
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("old", encoding="utf-8")
    assert load_inventory("acme/tiny", env=env).shape.num_layers == 5


def test_catalog_case_insensitive() -> None:
    inv = load_inventory("META-LLAMA/META-LLAMA-3-8B", env=ENV)
    assert inv.total_params == KNOWN_TOTALS["meta-llama/Meta-Llama-3-8B"]
    assert inv.source.startswith("built-in catalog meta-llama/Meta-Llama-3-8B")
    assert inv.model_id == "META-LLAMA/META-LLAMA-3-8B"


def test_unknown_model_says_how_to_pass_a_config(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError) as err:
        load_inventory("acme/does-not-exist", env={"HF_HUB_CACHE": str(tmp_path)})
    message = str(err.value)
    assert "acme/does-not-exist" in message and "config.json" in message and "directory" in message


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match=r"without a config\.json"):
        load_inventory(str(tmp_path), env=ENV)


def test_malformed_config_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config\.json is not valid JSON"):
        load_inventory(str(bad), env=ENV)
    bad.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_inventory(str(bad), env=ENV)
    bad.write_text('{"hidden_size": 8}', encoding="utf-8")
    with pytest.raises(ConfigError, match="model_type"):
        load_inventory(str(bad), env=ENV)


def test_wrong_value_type_names_file_and_key(tmp_path: Path) -> None:
    cfg = _small_llama(2)
    cfg["hidden_size"] = "4096"
    path = _write_config(tmp_path, cfg)
    with pytest.raises(ConfigError) as err:
        load_inventory(str(path), env=ENV)
    assert str(path) in str(err.value) and "'hidden_size'" in str(err.value)


def test_remote_code_only_config_is_refused(tmp_path: Path) -> None:
    path = _write_config(
        tmp_path,
        {"model_type": "acme_secret", "auto_map": {"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"}},
    )
    with pytest.raises(UnsupportedModelError) as err:
        load_inventory(str(path), env=ENV)
    assert "acme_secret" in str(err.value)


def test_inventory_from_config_refuses_unknown_family() -> None:
    with pytest.raises(UnsupportedModelError, match="no pure-Python inventory"):
        inventory_from_config({"model_type": "gpt_neox"}, "x", "y")


def test_defaults_follow_the_config_classes() -> None:
    # Absent keys take the transformers config class default (configuration_*.py), not a generic one.
    mistral = inventory_from_config({"model_type": "mistral"}, "m", "s")
    assert mistral.shape.num_kv_heads == 8 and mistral.shape.sliding_window == 4096
    qwen = inventory_from_config({"model_type": "qwen2", "num_key_value_heads": None}, "q", "s")
    assert qwen.shape.num_kv_heads == 32  # explicit null -> num_attention_heads (32)
    gemma = inventory_from_config(
        {"model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8}, "g", "s"
    )
    assert gemma.shape.head_dim == 256 and gemma.shape.tied_embeddings


# ---- the pure path needs no torch ------------------------------------------------------------------------


def test_pure_path_does_not_import_torch() -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from fitcheck.readers.model_config import load_inventory
        from fitcheck.catalog.gpus import lookup_gpu
        t = time.perf_counter()
        inv = load_inventory("meta-llama/Meta-Llama-3-70B", env={})
        elapsed = time.perf_counter() - t
        lookup_gpu("h100")
        heavy = sorted(m for m in ("torch", "transformers", "accelerate", "peft") if m in sys.modules)
        print(inv.total_params, heavy, elapsed)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO, check=True
    ).stdout.split()
    assert out[0] == "70553706496"
    assert out[1] == "[]"
    assert float(out[2]) < 0.5  # measured ~1 ms on the 2-core dev machine


def test_pure_inventory_is_fast() -> None:
    load_inventory("meta-llama/Meta-Llama-3-70B", env=ENV)  # warm the catalog index
    start = time.perf_counter()
    for _ in range(20):
        load_inventory("meta-llama/Meta-Llama-3-70B", env=ENV)
    assert (time.perf_counter() - start) / 20 < 0.05


def test_quantization_config_is_carried() -> None:
    quant = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    inv = inventory_from_config({**_small_llama(1), "quantization_config": quant}, "q", "test")
    assert inv.quantization_config == quant
    assert inv.total_params == inventory_from_config(_small_llama(1), "p", "test").total_params
