"""Pinned answers at shapes off the envelope's grids, per phase, during backward included (issue 20).

``benchmarks/pinned_probes.py`` draws such shapes at random and prints the table; these tests keep the cases it
found and a few shape-varying probes of pinned kinds: the formula answer must say ``pinned: true`` and be within
2 % of fitcheck's own fake-tensor trace at that shape on the activation and logits bytes of every phase (end of
forward, start of backward, during backward), or say ``pinned: false``.
"""

from __future__ import annotations

import pytest

from fitcheck.catalog import find_catalog_config
from fitcheck.core import estimate
from fitcheck.report import Phase
from fitcheck.torch_adapters.differential import PHASES, Cell, cell_spec, phase_errors

pytest.importorskip("transformers")


def _errors(cell: Cell, model: str) -> tuple[bool, dict[Phase, float]]:
    """(pinned, formula-vs-trace error per phase) of a cell on a catalog model, traced at its own micro-batch."""
    from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs
    from fitcheck.torch_adapters.trace_batch import BatchTraces
    from fitcheck.torch_adapters.trace_result import components_from_trace

    found = find_catalog_config(model)
    assert found is not None, model
    spec = cell_spec(cell, dict(found[0]))
    traced = BatchTraces(spec.model.config, activation_trace_kwargs(spec), skip_first=True).result(cell.batch)
    return estimate(spec).pinned, phase_errors(spec, components_from_trace(traced))


# Range-checked pinned kinds at widths, sequences and micro-batches none of the grids ran (the widths lie between
# the two the range was checked at; the sequences and micro-batches are off the grid's points).
SHAPE_PROBES = [
    (Cell("llama", "lora", True, "sdpa", "bf16", 1536, 3), "meta-llama/Llama-2-13b-hf"),
    (Cell("qwen2", "full", True, "sdpa", "bf16", 3008, 2), "Qwen/Qwen2.5-14B"),
    (Cell("mistral", "qlora", True, "sdpa", "bf16", 2880, 5), "mistralai/Mistral-7B-v0.3"),
    (Cell("qwen3", "qlora", True, "sdpa", "bf16", 1344, 3), "Qwen/Qwen3-14B"),
    (Cell("llama", "full", True, "sdpa", "autocast", 6080, 2), "meta-llama/Llama-3.3-70B-Instruct"),
]


@pytest.mark.parametrize("cell,model", SHAPE_PROBES, ids=[c.label for c, _ in SHAPE_PROBES])
def test_pinned_kind_within_two_percent_at_an_off_grid_shape(cell: Cell, model: str) -> None:
    pinned, errors = _errors(cell, model)
    assert pinned, cell.label
    assert set(errors) == set(PHASES)
    for phase, err in errors.items():
        assert abs(err) <= 0.02, (cell.label, phase.value, errors)


def test_tied_embedding_sum_comes_after_its_output_gradient_is_freed() -> None:
    # Qwen3-1.7B ties its embedding: at the end of backward the new embedding gradient and the head's buffered one
    # are summed after the embedding's output gradient (b x s x h) was freed. The formula counted all three:
    # +2.53 % during backward at 6 x 1280 (benchmarks/pinned_probes.py, seed 1), exact now.
    _, errors = _errors(Cell("qwen3", "full", True, "sdpa", "fp32", 1280, 6), "Qwen/Qwen3-1.7B")
    assert abs(errors[Phase.BACKWARD]) <= 0.001, errors


@pytest.mark.parametrize("batch,seq", [(1, 512), (8, 512)])
def test_qwen3_qlora_during_backward(batch: int, seq: int) -> None:
    # Qwen3 QLoRA (bf16 load, k-bit prep, checkpointing): the Llama QLoRA recipe plus the q/k norms' fp32 inputs
    # and rsqrt in the recomputed top layer. Was +26.5 % during backward at 1 x 512 on Qwen3-8B (+46.5 % on 32B).
    _, errors = _errors(Cell("qwen3", "qlora", True, "sdpa", "bf16", seq, batch), "Qwen/Qwen3-8B")
    for phase, err in errors.items():
        assert abs(err) <= 0.001, (phase.value, errors)


@pytest.mark.parametrize("method,batch", [("lora", 6), ("qlora", 4)])
def test_fp32_lora_top_layer_forward_above_small_vocab_logits(method: str, batch: int) -> None:
    # Llama-2-70B (I = 28672, vocab 32000), fp32 activations, checkpointing: the end-of-forward peak is inside the
    # top layer's no-grad MLP forward (up_proj's LoRA sum), not at the logits: -6.44 % before (probes, seed 1)
    pinned, errors = _errors(Cell("llama", method, True, "sdpa", "fp32", 960, batch), "meta-llama/Llama-2-70b-hf")
    assert pinned
    for phase, err in errors.items():
        assert abs(err) <= 0.001, (phase.value, errors)


# Pinned by a single grid cell before the eager kinds were range-checked, and off by more than 2 % (probes).
NOT_PINNED_NOW = [
    (Cell("llama", "qlora", True, "eager", "autocast", 6528, 3), "meta-llama/Meta-Llama-3-70B"),  # was -32.4 %
    (Cell("qwen2", "qlora", True, "eager", "autocast", 15040, 6), "Qwen/Qwen2.5-7B"),  # was -47.6 %
]
# (llama/qlora/nockpt/eager/fp32 at Llama-3.1-8B 1 x 10816, -3.6 % once, left this list when the top layer's 4-bit
# backward moment closed it: its range rows are within 0.04 % from 512 to 32768 tokens, micro-batch 1 and 8, widths
# 4096 and 8192; tests/test_qlora_unrecomputed_base.py checks the moment against the trace.)


@pytest.mark.parametrize("cell,model", NOT_PINNED_NOW, ids=[c.label for c, _ in NOT_PINNED_NOW])
def test_eager_kinds_off_at_long_sequences_are_not_pinned(cell: Cell, model: str) -> None:
    found = find_catalog_config(model)
    assert found is not None
    report = estimate(cell_spec(cell, dict(found[0])))
    assert not report.pinned
    assert any(f.code == "not-pinned" and "envelope_ranges" in f.message for f in report.findings)


# Session 22's probes (benchmarks/pinned_probes.py seeds 2201-2204): the moments they found, on a tiny Llama where
# each is the peak of its phase (fake-tensor trace of the real transformers + peft + bitsandbytes model, 2 layers)
_TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 1024,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
         "max_position_embeddings": 512, "tie_word_embeddings": False}


@pytest.mark.parametrize("cell,lora,phase", [
    # LLM.int8: down_proj's MatMul8bitFp backward dequantizes its whole weight (Qwen2.5-32B 1 x 960: -2.52 %)
    (Cell("llama", "int8", True, "sdpa", "bf16", 32, 1), {}, Phase.BACKWARD),
    # LoRA on a bf16 model under bf16 autocast: every layer's adapter casts held (Phi-4-mini r32: -2.27 %)
    (Cell("llama", "lora", False, "sdpa", "bf16amp", 32, 1), {"r": 64}, Phase.BACKWARD),
    # QLoRA on peft's q/v targets: the top layer's no-grad MLP forward (Llama-2-70b 3 x 2304: -2.90 %)
    (Cell("llama", "qlora", True, "sdpa", "bf16", 64, 1), {"target_modules": ("q_proj", "v_proj")},
     Phase.FORWARD_END),
    # LoRA with dropout on a bf16 model: down_proj's fp32 cast and dropout in the top layer (Llama-2-70b: -4.62 %)
    (Cell("llama", "lora", True, "sdpa", "bf16", 64, 1), {}, Phase.FORWARD_END),
], ids=["int8-down-backward", "bf16amp-adapter-casts", "qv-top-mlp-forward", "bf16-down-dropout-forward"])
def test_session22_probe_moments(cell: Cell, lora: dict[str, object], phase: Phase) -> None:
    import dataclasses

    from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs
    from fitcheck.torch_adapters.trace_result import components_from_trace
    from fitcheck.torch_adapters.tracer import trace_step

    if cell.method == "int8":
        pytest.importorskip("bitsandbytes")
    spec = cell_spec(cell, dict(_TINY))
    if lora:
        assert spec.lora is not None
        spec = dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, **lora))  # type: ignore[arg-type]
    errors = phase_errors(spec, components_from_trace(trace_step(spec.model.config, **activation_trace_kwargs(spec))))
    assert abs(errors[phase]) <= 0.02, errors  # main: -1.4 %, -99.9 %, -70.1 %, -74.7 %
