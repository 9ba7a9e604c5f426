"""The built-in model catalog: coverage of issue 2's list, provenance files, case-insensitive ids, aliases."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from fitcheck.catalog.models import ALIASES, catalog_ids, catalog_source_text, find_catalog_config

# Issue 2: "The catalog covers at least: Llama-2 7B/13B/70B, Llama-3 and 3.1 8B/70B (+3.1 405B),
# Llama-3.2 1B/3B, Mistral-7B v0.1 and v0.3, Mixtral-8x7B, Qwen2 and Qwen2.5 0.5B-72B, Gemma 2B/7B,
# Gemma-2 2B/9B/27B, Phi-2, Phi-3-mini, GPT-2 (all sizes), BERT base/large, Falcon-7B, BLOOMZ-7b1".
REQUIRED = [
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-13b-hf",
    "meta-llama/Llama-2-70b-hf",
    "meta-llama/Meta-Llama-3-8B",
    "meta-llama/Meta-Llama-3-70B",
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B",
    "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B",
    "mistralai/Mistral-7B-v0.1",
    "mistralai/Mistral-7B-v0.3",
    "mistralai/Mixtral-8x7B-v0.1",
    "Qwen/Qwen2-0.5B",
    "Qwen/Qwen2-1.5B",
    "Qwen/Qwen2-7B",
    "Qwen/Qwen2-72B",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-1.5B",
    "Qwen/Qwen2.5-3B",
    "Qwen/Qwen2.5-7B",
    "Qwen/Qwen2.5-14B",
    "Qwen/Qwen2.5-32B",
    "Qwen/Qwen2.5-72B",
    "google/gemma-2b",
    "google/gemma-7b",
    "google/gemma-2-2b",
    "google/gemma-2-9b",
    "google/gemma-2-27b",
    "microsoft/phi-2",
    "microsoft/Phi-3-mini-4k-instruct",
    "openai-community/gpt2",
    "openai-community/gpt2-medium",
    "openai-community/gpt2-large",
    "openai-community/gpt2-xl",
    "google-bert/bert-base-uncased",
    "google-bert/bert-large-uncased",
    "tiiuae/falcon-7b",
    "bigscience/bloomz-7b1",
]
# Issue 12: the current models found in shared/catalog/ (SOURCES.md "Additions"). Llama-4-Scout is left out:
# its reconstructed file has attn_temperature_tuning 4 (an int), which transformers 5.23 refuses to load.
ADDED_2025 = [
    "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "Qwen/Qwen2.5-VL-7B-Instruct",
    "openai/gpt-oss-20b", "openai/gpt-oss-120b",
    "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "microsoft/Phi-4-mini-instruct", "microsoft/phi-4",
    "google/gemma-3-1b-it", "google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it",
    "mistralai/Mistral-Nemo-Base-2407", "mistralai/Mistral-Small-24B-Instruct-2501",
    "meta-llama/Llama-3.3-70B-Instruct", "allenai/OLMo-2-1124-7B",
]
# Issue 18: the family added by walking ARCHITECTURE.md's "A model family" recipe. Its provenance is its own
# source.txt (a public copy of the Hub file), not shared/catalog/, so the shared-copy check below leaves it out.
ADDED_FAMILY_RECIPE = ["ibm-granite/granite-3.3-8b-instruct"]

# the project keeps shared/ beside the repository (on developer machines and in CI)
SHARED = Path(__file__).resolve().parents[2] / "shared" / "catalog"


def test_catalog_covers_issue_list_exactly() -> None:
    assert sorted(catalog_ids(), key=str.lower) == sorted(REQUIRED + ADDED_2025 + ADDED_FAMILY_RECIPE, key=str.lower)


@pytest.mark.parametrize("model_id", REQUIRED + ADDED_2025 + ADDED_FAMILY_RECIPE)
def test_every_entry_has_config_and_provenance(model_id: str) -> None:
    found = find_catalog_config(model_id)
    assert found is not None
    config, source = found
    assert isinstance(config.get("model_type"), str)
    assert source.startswith(f"built-in catalog {model_id} (")
    text = catalog_source_text(model_id)
    status = next(line for line in text.splitlines() if line.startswith("status: "))
    assert status in ("status: VERBATIM", "status: RECONSTRUCTED")
    assert f"Model id: {model_id}" in text


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/ is not beside this checkout")
@pytest.mark.parametrize("model_id", REQUIRED + ADDED_2025)
def test_config_is_a_verbatim_copy_of_the_shared_catalog(model_id: str) -> None:
    org, name = model_id.split("/")
    packaged = resources.files("fitcheck.catalog").joinpath("models", org, name, "config.json").read_bytes()
    assert packaged == (SHARED / org / name / "config.json").read_bytes()


def test_reconstructed_entries_carry_their_section() -> None:
    text = catalog_source_text("meta-llama/Llama-3.1-405B")
    assert "status: RECONSTRUCTED" in text
    assert "### R1." in text and "KV-head doubt" in text


@pytest.mark.parametrize(
    ("typed", "official"),
    [
        ("META-LLAMA/meta-llama-3-8b", "meta-llama/Meta-Llama-3-8B"),
        ("qwen/qwen2.5-7b", "Qwen/Qwen2.5-7B"),
        ("Google/Gemma-2-9B", "google/gemma-2-9b"),
        ("gpt2", "openai-community/gpt2"),
        ("gpt2-xl", "openai-community/gpt2-xl"),
        ("bert-base-uncased", "google-bert/bert-base-uncased"),
        ("tiiuae/falcon-7b", "tiiuae/falcon-7b"),
        ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-405B", "meta-llama/Llama-3.1-405B"),
    ],
)
def test_case_insensitive_ids_and_aliases(typed: str, official: str) -> None:
    found = find_catalog_config(typed)
    assert found is not None
    assert found[1].startswith(f"built-in catalog {official} ")


def test_unknown_id_is_none_and_bare_names_are_not_guessed() -> None:
    assert find_catalog_config("meta-llama/Llama-4-Behemoth") is None
    assert find_catalog_config("falcon-7b") is None  # never a Hub id: may be a local folder name
    assert find_catalog_config("") is None


def test_aliases_point_at_catalog_entries() -> None:
    ids = {i.lower() for i in catalog_ids()}
    for alias, target in ALIASES.items():
        assert alias == alias.lower()
        assert target.lower() in ids


def test_find_returns_a_fresh_copy() -> None:
    first = find_catalog_config("gpt2")
    assert first is not None
    first[0]["n_layer"] = 999
    again = find_catalog_config("gpt2")
    assert again is not None and again[0]["n_layer"] == 12


def test_package_data_is_valid_json() -> None:
    root = resources.files("fitcheck.catalog").joinpath("models")
    for model_id in catalog_ids():
        org, name = model_id.split("/")
        json.loads(root.joinpath(org, name, "config.json").read_text(encoding="utf-8"))
