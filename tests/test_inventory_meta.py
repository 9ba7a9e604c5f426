"""The pure-Python inventory equals ``from_config`` on the meta device, for every catalog entry and for the
family options the catalog does not exercise (biases, tying, fused/unfused attention, MoE sizes).

Acceptance criterion of issue 2: "Tests prove the pure-Python count equals the meta count for every catalog
entry". Entries are compared as multisets of (name, shape, repeat, kind, role, module, in/out features), and
the ModelShape numbers must agree too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fitcheck.catalog.models import catalog_ids, find_catalog_config
from fitcheck.errors import UnsupportedModelError
from fitcheck.readers.model_config import inventory_from_config, load_inventory
from fitcheck.spec import Kind, ModelInventory, ParamEntry, Role
from fitcheck.torch_adapters.meta_device import build_meta_model, meta_inventory

ENV: dict[str, str] = {"HOME": "/nonexistent-home-for-tests"}


def _key(p: ParamEntry) -> tuple[object, ...]:
    return (p.name, p.shape, p.repeat, p.kind, p.role, p.module, p.in_features, p.out_features)


def _assert_same(pure: ModelInventory, meta: ModelInventory) -> None:
    assert pure.total_params == meta.total_params
    only_pure = sorted(set(map(_key, pure.params)) - set(map(_key, meta.params)), key=str)
    only_meta = sorted(set(map(_key, meta.params)) - set(map(_key, pure.params)), key=str)
    assert not only_pure and not only_meta, f"pure only: {only_pure}\nmeta only: {only_meta}"
    assert sorted(map(_key, pure.params), key=str) == sorted(map(_key, meta.params), key=str)
    assert dataclasses.asdict(pure.shape) == dataclasses.asdict(meta.shape)


# Catalog entries that stay on the meta path (no pure mirror): image-text models, whose vision tower and
# projector the task-head work models (issue 12); their text part is a pure family (gemma3_text, qwen2).
META_ONLY = frozenset({
    "google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it", "Qwen/Qwen2.5-VL-7B-Instruct",
})
PURE_IDS = [m for m in catalog_ids() if m not in META_ONLY]


@pytest.fixture(scope="module")
def catalog_pairs() -> dict[str, tuple[ModelInventory, ModelInventory]]:
    """Both inventories for all catalog models, built once (meta: ~0.1 s per model after imports)."""
    pairs = {}
    for model_id in PURE_IDS:
        found = find_catalog_config(model_id)
        assert found is not None
        config, source = found
        pairs[model_id] = (
            inventory_from_config(config, model_id, source),
            meta_inventory(config, model_id, source),
        )
    return pairs


def _published_meta_count(model_id: str) -> int | None:
    """The meta-device count the shared catalog published for an entry (source.txt), if it gives one."""
    import re

    from fitcheck.catalog.models import catalog_source_text

    found = re.search(r"Meta-device params \(published\): ([\d,]+)", catalog_source_text(model_id))
    return int(found.group(1).replace(",", "")) if found else None


@pytest.mark.parametrize("model_id", [m for m in PURE_IDS if _published_meta_count(m) is not None])
def test_new_catalog_entries_match_the_published_meta_count(
    model_id: str, catalog_pairs: dict[str, tuple[ModelInventory, ModelInventory]]
) -> None:
    # shared/catalog/SOURCES.md: counted with transformers 5.23 from_config on meta, tied tensors once
    assert catalog_pairs[model_id][0].total_params == _published_meta_count(model_id)


def test_meta_only_catalog_entries_are_counted_on_meta() -> None:
    for model_id in sorted(META_ONLY):
        found = find_catalog_config(model_id)
        assert found is not None
        with pytest.raises(UnsupportedModelError):
            inventory_from_config(found[0], model_id, found[1])
        inv = meta_inventory(found[0], model_id, found[1])
        assert inv.counted_by == "meta"
        if found[0]["model_type"] == "gemma3":  # Gemma3ForConditionalGeneration: vision tower + LM, as published
            assert inv.total_params == _published_meta_count(model_id)


@pytest.mark.parametrize("model_id", PURE_IDS)
def test_pure_equals_meta_for_every_catalog_entry(
    model_id: str, catalog_pairs: dict[str, tuple[ModelInventory, ModelInventory]]
) -> None:
    pure, meta = catalog_pairs[model_id]
    assert pure.counted_by == "pure-python" and meta.counted_by == "meta"
    _assert_same(pure, meta)


def test_known_totals_on_meta(catalog_pairs: dict[str, tuple[ModelInventory, ModelInventory]]) -> None:
    # Shared notes 04-measured-feasibility.md.
    assert catalog_pairs["meta-llama/Meta-Llama-3-8B"][1].total_params == 8_030_261_248
    assert catalog_pairs["meta-llama/Meta-Llama-3-70B"][1].total_params == 70_553_706_496
    assert catalog_pairs["mistralai/Mixtral-8x7B-v0.1"][1].total_params == 46_702_792_704
    assert catalog_pairs["Qwen/Qwen2-7B"][1].total_params == 7_615_616_512
    assert catalog_pairs["google/gemma-2-9b"][1].total_params == 9_241_705_984


def test_meta_matches_transformers_no_split_modules() -> None:
    for model_id in ("meta-llama/Llama-3.2-1B", "openai-community/gpt2", "google-bert/bert-base-uncased"):
        found = find_catalog_config(model_id)
        assert found is not None
        model = build_meta_model(found[0])
        pure = inventory_from_config(found[0], model_id, "")
        assert pure.shape.no_split_module in model._no_split_modules
        assert pure.total_params == sum(p.numel() for p in model.parameters())


# Small configs that exercise family options the catalog does not (each built in milliseconds).
VARIANTS: dict[str, dict[str, object]] = {
    "llama-biases-tied": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
    "llama-head-dim": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "head_dim": 32,
        "vocab_size": 100,
    },
    "mistral-no-kv-key": {
        "model_type": "mistral",
        "hidden_size": 128,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "vocab_size": 100,
    },
    "mixtral-4x": {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "tie_word_embeddings": True,
    },
    "qwen2-tied-window": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "tie_word_embeddings": True,
        "use_sliding_window": True,
        "sliding_window": 32,
        "max_window_layers": 1,
    },
    "gemma-no-head-dim": {
        "model_type": "gemma",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 100,
        "attention_bias": True,
    },
    "gemma2-untied": {
        "model_type": "gemma2",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 100,
        "tie_word_embeddings": False,
        "sliding_window": None,
    },
    "phi3-gqa-tied": {
        "model_type": "phi3",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "tie_word_embeddings": True,
        "sliding_window": 16,
        "pad_token_id": None,
        "eos_token_id": None,
    },
    "phi-qk-layernorm-tied": {
        "model_type": "phi",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "qk_layernorm": True,
        "tie_word_embeddings": True,
    },
    "gpt2-untied-inner": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 32,
        "n_inner": 80,
        "vocab_size": 100,
        "tie_word_embeddings": False,
        "activation_function": "relu",
    },
    "bert-untied": {
        "model_type": "bert",
        "architectures": ["BertForMaskedLM"],
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "max_position_embeddings": 40,
        "type_vocab_size": 3,
        "tie_word_embeddings": False,
    },
    "falcon-new-arch": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_kv_heads": 2,
        "new_decoder_architecture": True,
        "vocab_size": 100,
        "bias": True,
        "ffn_hidden_size": 96,
    },
    "falcon-sequential-mha": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "multi_query": False,
        "parallel_attn": False,
        "vocab_size": 100,
        "alibi": True,
        "tie_word_embeddings": False,
    },
    "bloom-untied": {
        "model_type": "bloom",
        "hidden_size": 64,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 100,
        "tie_word_embeddings": False,
        "seq_length": 64,
    },
    # 2025 families (fitcheck/families/)
    "qwen3-bias-tied": {
        "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 100,
        "attention_bias": True, "tie_word_embeddings": True,
    },
    "qwen3-no-head-dim": {
        "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 100,
    },
    "qwen3-moe-small": {
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 40,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
        "num_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": True,
    },
    "gemma3-text-untied": {
        "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 100,
        "tie_word_embeddings": False, "sliding_window": 16,
    },
    "olmo2-gqa": {
        "model_type": "olmo2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "attention_bias": True,
    },
    "gpt-oss-small": {
        "model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
        "num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": ["sliding_attention", "full_attention"],
    },
    "deepseek-v3-no-q-lora-all-moe": {
        "model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0, "q_lora_rank": None,
        "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "n_shared_experts": 2,
    },
    "deepseek-v3-one-dense": {
        "model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    },
}


@pytest.mark.parametrize("name", VARIANTS)
def test_pure_equals_meta_for_family_options(name: str) -> None:
    config = VARIANTS[name]
    _assert_same(inventory_from_config(config, name, "test"), meta_inventory(config, name, "test"))


def test_variant_options_change_the_inventory() -> None:
    # Guards against VARIANTS silently exercising nothing: each option adds or removes the expected tensors.
    llama = inventory_from_config(VARIANTS["llama-biases-tied"], "x", "")
    assert sum(p.kind is Kind.BIAS for p in llama.params) == 7 and llama.shape.tied_embeddings
    bert = inventory_from_config(VARIANTS["bert-untied"], "x", "")
    assert {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"} <= {p.name for p in bert.params}
    falcon = inventory_from_config(VARIANTS["falcon-new-arch"], "x", "")
    assert falcon.shape.num_kv_heads == 2 and any("ln_mlp" in p.name for p in falcon.params)
    phi = inventory_from_config(VARIANTS["phi-qk-layernorm-tied"], "x", "")
    assert any(p.name.endswith("q_layernorm.bias") for p in phi.params)
    assert any(p.name == "lm_head.bias" for p in phi.params) and not any(
        p.name == "lm_head.weight" for p in phi.params
    )


def test_load_inventory_uses_meta_for_other_architectures(tmp_path: Path) -> None:
    config = {
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "max_position_embeddings": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    inv = load_inventory(str(tmp_path), env=ENV, meta_fallback=meta_inventory)
    assert inv.counted_by == "meta"
    assert inv.shape.num_layers == 3 and inv.shape.no_split_module == "GPTNeoXLayer"
    qkv = next(p for p in inv.params if p.name.endswith("attention.query_key_value.weight"))
    assert (qkv.repeat, qkv.kind, qkv.role, qkv.shape) == (3, Kind.LINEAR, Role.ATTENTION, (192, 64))
    with pytest.raises(UnsupportedModelError, match="meta-device path is disabled"):
        load_inventory(str(tmp_path), env=ENV)


def test_remote_code_is_never_run(tmp_path: Path) -> None:
    config: Mapping[str, object] = {
        "model_type": "acme_secret",
        "auto_map": {
            "AutoConfig": "configuration_acme.AcmeConfig",
            "AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM",
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "modeling_acme.py").write_text("raise SystemExit('remote code ran')\n", encoding="utf-8")
    with pytest.raises(UnsupportedModelError, match="remote code"):
        load_inventory(str(tmp_path), env=ENV, meta_fallback=meta_inventory)


def test_heterogeneous_layers_are_not_collapsed() -> None:
    # Qwen2-MoE with a dense layer among sparse ones: same names, different shapes across layers.
    config = {
        "model_type": "qwen2_moe",
        "hidden_size": 32,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 50,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mlp_only_layers": [1],
        "decoder_sparse_step": 1,
    }
    inv = meta_inventory(config, "tiny-moe", "test")
    model = build_meta_model(config)
    mlp_names = {p.name for p in inv.params if ".mlp." in p.name}
    assert "model.layers.1.mlp.gate_proj.weight" in mlp_names  # the dense layer keeps its index
    assert inv.total_params == sum(p.numel() for p in model.parameters())
    assert inv.shape.num_experts == 4


def test_quantization_config_is_carried_not_applied() -> None:
    quant = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    plain = {
        "model_type": "gpt_neox",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
    }
    with_quant = meta_inventory({**plain, "quantization_config": quant}, "q", "test")
    assert with_quant.quantization_config == quant
    assert with_quant.total_params == meta_inventory(plain, "p", "test").total_params
