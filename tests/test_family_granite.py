"""IBM Granite 3.x (``model_type`` granite), added by walking ARCHITECTURE.md's "A model family" recipe (issue 18).

(a) The pure inventory equals transformers 5.23 ``from_config`` on the meta device, name by name (the catalog
entry is also in tests/test_inventory_meta.py; here the options the catalog does not exercise). (b) The
activation formulas equal a fake-tensor trace of ``GraniteForCausalLM`` at the real widths of
granite-3.3-8b-instruct with 2 layers, at the end of forward, the start of backward and during backward, for a
full fine-tune and LoRA. (c) What makes Granite more than a Llama clone: the embedding scaled outside its module
keeps one more tensor under LoRA + checkpointing, in the trace and in the formula.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fitcheck.catalog.models import find_catalog_config
from fitcheck.core import estimate
from fitcheck.families import traits_of_type
from fitcheck.readers.model_config import inventory_from_config
from fitcheck.report import Phase
from fitcheck.spec import ModelInventory, ParamEntry, TrainingSpec
from fitcheck.torch_adapters import differential
from fitcheck.torch_adapters.differential import Cell, cell_spec
from fitcheck.torch_adapters.meta_device import meta_inventory
from fitcheck.torch_adapters.tracer_depth import trace_components

GRANITE = "ibm-granite/granite-3.3-8b-instruct"
PHASES = (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD)


def _key(p: ParamEntry) -> tuple[object, ...]:
    return (p.name, p.shape, p.repeat, p.kind, p.role, p.module, p.in_features, p.out_features)


def _same(pure: ModelInventory, meta: ModelInventory) -> None:
    assert pure.counted_by == "pure-python" and meta.counted_by == "meta"
    assert sorted(map(_key, pure.params), key=str) == sorted(map(_key, meta.params), key=str)
    assert pure.total_params == meta.total_params
    assert dataclasses.asdict(pure.shape) == dataclasses.asdict(meta.shape)


def _catalog() -> dict[str, Any]:
    found = find_catalog_config(GRANITE)
    assert found is not None
    return dict(found[0])


SMALL = {"model_type": "granite", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "vocab_size": 100}


@pytest.mark.parametrize(
    "config",
    [
        _catalog(),
        SMALL,  # GraniteConfig defaults: no kv key (= heads), untied, no biases
        {**SMALL, "num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
        {**SMALL, "num_key_value_heads": 1, "head_dim": 32},  # GraniteAttention reads head_dim when present
    ],
    ids=["catalog", "defaults", "biases-tied", "head-dim"],
)
def test_pure_inventory_equals_meta_name_by_name(config: dict[str, Any]) -> None:
    _same(inventory_from_config(config, "granite", "test"), meta_inventory(config, "granite", "test"))


def test_catalog_count_is_the_published_count() -> None:
    # safetensors count of ibm-granite/granite-3.3-8b-instruct (catalog source.txt); tied: embedding counted once
    assert inventory_from_config(_catalog(), GRANITE, "test").total_params == 8_170_864_640


def test_granite_is_registered_with_its_own_trait() -> None:
    assert traits_of_type("granite").embedding_scaled_outside
    assert not traits_of_type("llama").embedding_scaled_outside
    assert traits_of_type("granite").activations_pinned


def _two_layers(model_type: str = "granite") -> dict[str, Any]:
    config = {**_catalog(), "num_hidden_layers": 2}
    if model_type != "granite":  # the same widths built as LlamaForCausalLM
        config.update(model_type=model_type, architectures=["LlamaForCausalLM"])
    return config


def _spec(cell: Cell, config: dict[str, Any]) -> TrainingSpec:
    assert differential.FAMILY_MODELS[cell.family] == GRANITE  # the grid's model of the family
    return cell_spec(cell, config)


def _device(spec: TrainingSpec, traced: bool) -> dict[Phase, int]:
    report = estimate(spec, activations=trace_components(spec)) if traced else estimate(spec)
    return {p: sum(c.at(p) for c in report.components if c.location.value == "device") for p in PHASES}


# (method, checkpointing, attention, precision): 2 layers, 1 x 256 tokens, plain AdamW on CPU
CELLS = [
    ("full", False, "sdpa", "bf16"),
    ("full", True, "eager", "fp32"),
    ("full", True, "sdpa", "autocast"),
    ("lora", False, "sdpa", "bf16"),
    ("lora", False, "eager", "fp32"),
    ("lora", True, "sdpa", "bf16"),
    ("lora", True, "eager", "fp32"),
]


@pytest.mark.parametrize("cell", CELLS, ids=["/".join(map(str, c)) for c in CELLS])
def test_formula_equals_trace_at_real_width(cell: tuple[str, bool, str, str]) -> None:
    method, ckpt, attn, precision = cell
    spec = _spec(Cell("granite", method, ckpt, attn, precision, 256, 1), _two_layers())
    formula, traced = _device(spec, traced=False), _device(spec, traced=True)
    for phase in PHASES:
        assert abs(formula[phase] - traced[phase]) <= 0.01 * traced[phase], (cell, phase, formula, traced)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_scaled_embedding_leaf_under_lora_checkpointing(precision: str) -> None:
    # enable_input_require_grads makes the embedding module's output a leaf; Granite multiplies it into a new
    # tensor, so its AccumulateGrad node keeps it alive: one b x s x h tensor more than Llama at the same widths
    cell = Cell("granite", "lora", True, "sdpa", precision, 256, 1)
    granite = _spec(cell, _two_layers())
    llama = _spec(cell, _two_layers("llama"))
    leaf = (2 if precision == "bf16" else 4) * 256 * 4096
    for side in (True, False):  # the trace, then the formula
        g, ll = _device(granite, side), _device(llama, side)
        assert g[Phase.FORWARD_END] - ll[Phase.FORWARD_END] == leaf, side
        assert g[Phase.BACKWARD_START] - ll[Phase.BACKWARD_START] == leaf, side


def test_tied_embedding_backward_holds_two_more_gradients() -> None:
    # A trained tied embedding (Granite, Llama-3.2, Gemma): the LM head's weight gradient waits in the autograd
    # input buffer of the shared weight, the embedding's backward makes another vocab x hidden gradient and the
    # buffer adds them into a third. Before the fix the formula missed 2 x 402 MB here (-14 % during backward).
    spec = _spec(Cell("granite", "full", False, "sdpa", "bf16", 256, 1), _two_layers())
    formula, traced = _device(spec, traced=False), _device(spec, traced=True)
    assert abs(formula[Phase.BACKWARD] - traced[Phase.BACKWARD]) <= 0.001 * traced[Phase.BACKWARD]
