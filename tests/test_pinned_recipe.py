"""Pinned means checked with this recipe (issue 20): what the range rows did not run is not pinned, and no pinned
answer carries a note saying part of the run is not modelled.

- Reentrant checkpointing (``gradient_checkpointing_kwargs={"use_reentrant": True}``; LLaMA-Factory's default)
  keeps a recomputed layer's graph until its backward ends (torch 2.13 ``utils/checkpoint.py``
  ``CheckpointFunction.backward``); the range rows ran non-reentrant. Off-grid probes traced reentrant were
  -6.7 % (Qwen2.5-7B full bf16 3 x 2200) and +9.9 % (8-bit LoRA 2 x 1536) off during backward while the answer
  said ``pinned: true``. Before session 19 the default path traced every reentrant run non-reentrant too
  (``tracer.trace_kwargs`` passed ``use_reentrant`` only for bitsandbytes < 0.43.2): the 8-bit probe was -67 %.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest

from fitcheck.catalog import find_catalog_config
from fitcheck.core import estimate
from fitcheck.spec import DeviceType, HardwareSpec, TrainingSpec

pytest.importorskip("torch")  # the grid's specs (cell_spec) live in the torch adapters

from fitcheck.torch_adapters import FAMILY_MODELS, Cell, cell_spec


def _spec(model: str, cell: Cell, *, reentrant: bool = False) -> TrainingSpec:
    found = find_catalog_config(model)
    assert found is not None
    spec = cell_spec(cell, dict(found[0]))
    return dataclasses.replace(spec, activations=dataclasses.replace(spec.activations, use_reentrant=reentrant))


@pytest.mark.parametrize("cell,model", [
    (Cell("llama", "qlora", True, "sdpa", "bf16", 1536, 2), "meta-llama/Llama-3.1-8B"),
    (Cell("qwen2", "full", True, "sdpa", "bf16", 2200, 3), "Qwen/Qwen2.5-7B"),
    (Cell("qwen2", "int8", True, "sdpa", "bf16", 1536, 2), "Qwen/Qwen2.5-7B"),
])
def test_reentrant_checkpointing_is_not_pinned(cell: Cell, model: str) -> None:
    assert estimate(_spec(model, cell)).pinned  # the same run, non-reentrant: inside its checked range
    report = estimate(_spec(model, cell, reentrant=True))
    assert report.pinned is False
    why = [f.message for f in report.findings if f.code == "not-pinned"]
    assert why and "reentrant checkpointing" in why[0]


def test_the_trace_runs_reentrant_checkpointing_as_the_run_asks() -> None:
    from fitcheck.torch_adapters import activation_trace_kwargs

    cell = Cell("llama", "lora", True, "sdpa", "bf16", 1024, 1)
    assert activation_trace_kwargs(_spec("meta-llama/Llama-3.2-1B", cell, reentrant=True))["use_reentrant"] is True
    assert activation_trace_kwargs(_spec("meta-llama/Llama-3.2-1B", cell))["use_reentrant"] is False
    no_ckpt = dataclasses.replace(cell, ckpt=False)  # the flag means nothing without checkpointing
    assert activation_trace_kwargs(_spec("meta-llama/Llama-3.2-1B", no_ckpt, reentrant=True))["use_reentrant"] is False


_NOT_MODELLED = re.compile(r"not modell?ed|not pinned|not-pinned|unchecked", re.IGNORECASE)


def test_no_pinned_answer_says_part_of_it_is_not_modelled() -> None:
    """Each method of the grid on each family's catalog model, checkpointing, attention, precision and device
    (CPU, CUDA) turned in turn, at a shape inside the ranges: a ``pinned: true`` answer has no finding (code or
    text) saying "not modelled" / "not pinned" (issue 20: phi-2 DoRA said "DoRA on phi is not modelled" with
    ``pinned: true``). ``/tmp`` runs of every kind x every catalog model, CPU (9752 answers) and CUDA with
    reentrant checkpointing too (7314), found none either (session 19)."""
    pinned = 0
    methods = ("full", "lora", "qlora", "dora", "qlora_noprep", "freeze", "int8")
    for i, (family, method) in enumerate(itertools.product(FAMILY_MODELS, methods)):
        if i % 2:  # half the pairs (building a spec costs ~0.1 s): every family, every method, 53 answers
            continue
        precision = ("bf16", "autocast", "fp32", "bf16amp")[i // 2 % 4]
        if precision == "bf16amp" and method not in ("lora", "dora"):
            precision = "bf16"
        cell = Cell(family, method, i % 3 != 0, ("sdpa", "eager")[i // 4 % 2], precision, 2048, 2)
        spec = _spec(FAMILY_MODELS[family], cell)
        if i // 6 % 2:
            spec = dataclasses.replace(spec, hardware=HardwareSpec(device_type=DeviceType.CUDA))
        report = estimate(spec)
        if not report.pinned:
            continue
        pinned += 1
        said = [f.code for f in report.findings if _NOT_MODELLED.search(f.code) or _NOT_MODELLED.search(f.message)]
        assert not said, (cell.label, spec.hardware.device_type, said)
    assert pinned >= 8  # the check sees pinned answers (10 at session 19)


@pytest.mark.parametrize("change,pinned", [
    ({}, True),
    ({"r": 64}, True),  # the rank class the rows stand for (r <= 64)
    ({"target_modules": ("q_proj", "v_proj")}, True),  # peft's default targets: their own +qv rows
    ({"r": 128}, False),
    ({"dropout": 0.0}, False),
    ({"target_modules": ("q_proj", "k_proj", "v_proj", "o_proj")}, False),
])
def test_the_key_holds_the_adapter_recipe(change: dict[str, object], pinned: bool) -> None:
    """LoRA targets, rank class and dropout change the per-token recipe (issue 20): only a checked one is pinned
    (``envelope_range.recipe_of``; probes with these recipes, ``pinned_probes.py --recipes``, were within 2 %)."""
    spec = _spec("meta-llama/Llama-3.1-8B", Cell("llama", "qlora", True, "sdpa", "bf16", 1536, 2))  # has +qv rows
    assert spec.lora is not None
    spec = dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, **change))  # type: ignore[arg-type]
    assert estimate(spec).pinned is pinned


# Gradient accumulation is not in the envelope's key: a pinned kind is pinned at any gradient_accumulation_steps.
# Session 20's probes (pinned_probes.py --accum, traced with two passes) found the accumulating micro-step's
# backward 2.3 .. 78.5 % above the formula where a new gradient is a temporary beside the accumulated .grad until
# AccumulateGrad adds it in place (torch autograd/functions/accumulate_grad.h): checked here at tiny widths, where
# those moments set the phase, against the accumulating trace (== the real CPU step, byte for byte, session 20).
_TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
               "intermediate_size": 172, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
               "vocab_size": 8000, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
_WIDE_MLP = {"hidden_size": 128, "intermediate_size": 2048, "vocab_size": 256}


@pytest.mark.parametrize("change,method,precision,ckpt,moment", [
    ({"tie_word_embeddings": True}, "full", "bf16", True, "embedding"),  # the tied sum (was -19.7 %, gemma-7b)
    (_WIDE_MLP, "full", "autocast", True, "top layer down_proj weight gradient"),  # Mistral-7B -5.7 % (bf16)
    ({}, "full", "autocast", True, "head gradient cast"),  # Qwen2.5-7B eager autocast: -23.0 %
    ({}, "freeze", "fp32", False, "head"),  # a partially trained head's new gradient (Qwen3-14B: -51.7 %)
])
def test_accumulating_micro_step_equals_its_trace(change: dict[str, object], method: str, precision: str,
                                                  ckpt: bool, moment: str) -> None:
    from fitcheck.report import Phase
    from fitcheck.torch_adapters import (
        PinnedPath,
        activation_trace_kwargs,
        components_from_trace,
        phase_errors,
        trace_step,
    )

    spec = cell_spec(Cell("llama", method, ckpt, "sdpa", precision, 16, 1), {**_TINY_LLAMA, **change})
    spec = dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, grad_accum=4))
    report = estimate(spec)
    assert report.pinned is False  # tiny widths: outside every range (the probes' models were pinned)
    saved = next(c for c in report.components if c.name == "activations.saved")
    assert saved.detail.endswith(f"worst at the {moment}")
    traced = trace_step(spec.model.config, **{**activation_trace_kwargs(spec), "grad_accum": 2})  # pass 2 of 2
    assert abs(phase_errors(spec, components_from_trace(traced))[Phase.BACKWARD]) < 0.001
    # the default path's trace of an accumulating run: the one pass it traces, seen as the later micro-step
    # (trace_result.accumulating_step), equals pass 2 of 2 during backward; the first pass alone is lower
    path = PinnedPath("always")
    got = {c.name: c.at(Phase.BACKWARD) for c in path.activations(spec)[0] or ()}
    assert got == {c.name: c.at(Phase.BACKWARD) for c in components_from_trace(traced)}
    first = dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, grad_accum=1))  # the same traces
    assert sum(c.at(Phase.BACKWARD) for c in path.activations(first)[0] or ()) < sum(got.values())


@pytest.mark.parametrize("method", ["full", "lora", "qlora", "qlora_noprep"])
def test_16bit_weights_under_the_other_autocast_are_never_pinned(method: str) -> None:
    """float16 weights under bf16 autocast, or bfloat16 under fp16 (``ActivationMode.promoted``: s19-promoted's
    checks were -1.2 .. -3.2 % off during backward) are not in the grid's key (``envelope.precision_of``: None),
    QLoRA without k-bit preparation (the ``qlora16`` formulas) too, on CPU and CUDA: traced on the default path."""
    from fitcheck.core.activations import envelope_key
    from fitcheck.spec import Dtype, MixedPrecision, PrecisionSpec

    spec = _spec("meta-llama/Llama-3.1-8B", Cell("llama", method, True, "sdpa", "bf16", 1536, 2))
    assert estimate(spec).pinned is (method != "qlora_noprep")  # the bf16 run: inside its checked range
    for load, mixed in ((Dtype.FLOAT16, MixedPrecision.BF16), (Dtype.BFLOAT16, MixedPrecision.FP16)):
        for device in (DeviceType.CPU, DeviceType.CUDA):
            other = dataclasses.replace(spec, precision=PrecisionSpec(load, mixed),
                                        hardware=HardwareSpec(device_type=device))
            assert envelope_key(other) is None
            assert estimate(other).pinned is False
