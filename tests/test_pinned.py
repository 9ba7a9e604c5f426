"""No silent extrapolation: a formula answer outside the checked envelope says so; one path for every number."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fitcheck.advice import max_micro_batch
from fitcheck.core import estimate
from fitcheck.core.activations import CHECKED, envelope_key, in_envelope
from fitcheck.spec import Dtype, FreezeSpec, LoraSpec, MixedPrecision, PrecisionSpec
from fitcheck.torch_adapters.differential import Cell, cell_spec

OUTSIDE = Cell("llama", "lora", True, "eager", "bf16amp", 64, 1)  # a kind of run the grid found > 2 % off


def test_envelope_keys_name_the_grid_kinds() -> None:
    spec = cell_spec(Cell("llama", "qlora", False, "sdpa", "autocast", 64, 1))
    assert envelope_key(spec) == ("llama", "qlora", False, "sdpa", "autocast")
    # fp16 autocast, layer subsets of LoRA, router-only freezing: not in the grid at all
    fp16 = dataclasses.replace(spec, precision=PrecisionSpec(Dtype.FLOAT32, MixedPrecision.FP16))
    assert envelope_key(fp16) is None
    subset = dataclasses.replace(spec, lora=LoraSpec(r=8, layers_to_transform=(0,)))
    assert envelope_key(subset) is None
    router = dataclasses.replace(cell_spec(Cell("mixtral", "full", False, "sdpa", "bf16", 64, 1)),
                                 freeze=FreezeSpec(trainable=("*.block_sparse_moe.gate.*",)))
    assert envelope_key(router) is None


def test_outside_the_envelope_the_formula_answer_is_not_pinned() -> None:
    # LoRA on a bf16 model under bf16 autocast, checkpointed eager attention: -3.2 % at 4x2048, outside
    unchecked = cell_spec(OUTSIDE)
    assert not in_envelope(unchecked)
    report = estimate(unchecked)
    assert report.pinned is False
    codes = [f.code for f in report.findings]
    assert "not-pinned" in codes
    assert any(f.code == "not-pinned" and f.severity.value == "warning" for f in report.findings)


def test_inside_the_envelope_the_formula_answer_is_pinned() -> None:
    assert ("llama", "full", False, "sdpa", "bf16") in CHECKED
    # inside the range of shapes this kind was checked at (envelope_ranges.json: 512 to 32k tokens; 64 is not)
    report = estimate(cell_spec(Cell("llama", "full", False, "sdpa", "bf16", 1024, 2)))
    assert report.pinned is True
    assert "not-pinned" not in [f.code for f in report.findings]


def test_never_mode_keeps_the_formula_and_warns() -> None:
    from fitcheck.torch_adapters import PinnedPath

    spec = cell_spec(OUTSIDE)
    assert not in_envelope(spec)
    report = PinnedPath("never")(spec)
    assert report.pinned is False and "not-pinned" in [f.code for f in report.findings]


def test_auto_mode_traces_outside_the_envelope_and_falls_back_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from fitcheck.errors import NotModelledError
    from fitcheck.torch_adapters import PinnedPath, trace_batch

    path = PinnedPath("auto", can_trace=True)
    dora = cell_spec(dataclasses.replace(OUTSIDE, seq=32))  # (DoRA is pinned since session 3: not the example)
    assert not in_envelope(dora)
    traced = path(dora)
    assert traced.pinned is True and any(c.name == "activations.traced" for c in traced.components)
    int8 = cell_spec(Cell("llama", "int8", False, "sdpa", "bf16", 32, 1))
    # 8-bit LoRA is traced since issue 10 (tracer_int8.py); pinned only inside a checked range of shapes (issue 20):
    # 32 tokens is below every range benchmarks/envelope_ranges.py runs (the single grid cell pinned it before)
    assert not in_envelope(int8)

    def refuse(_self: object, _micro_batch: int) -> None:
        raise NotModelledError("refused for the test")

    monkeypatch.setattr(trace_batch.BatchTraces, "result", refuse)
    fallback = PinnedPath("auto", can_trace=True)(dora)  # a trace that cannot run: formula + warning + why
    codes = [f.code for f in fallback.findings]
    assert fallback.pinned is False and "not-pinned" in codes and "trace-failed" in codes


def test_max_micro_batch_takes_the_headline_path() -> None:
    """The issue-10 case: --trace said FITS while the largest micro-batch (formula) said 0."""
    pytest.importorskip("transformers")
    from fitcheck.spec import HardwareSpec
    from fitcheck.torch_adapters import PinnedPath

    spec = cell_spec(Cell("llama", "qlora", False, "sdpa", "autocast", 16, 1))
    spec = dataclasses.replace(spec, hardware=HardwareSpec(gpu_memory_bytes=24 * 2**30))
    path = PinnedPath("always")
    headline = path(spec)
    assert headline.fits
    assert max_micro_batch(spec, path, limit=64) >= 1


def test_cli_json_has_pinned() -> None:
    import contextlib
    import io

    from fitcheck.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["estimate", "--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--dtype", "bfloat16",
                   "--per_device_train_batch_size", "1", "--max_seq_length", "128", "--no_trace", "--json"])
    assert rc in (0, 1)
    out = json.loads(buf.getvalue())
    assert isinstance(out["pinned"], bool)


def test_bf16_model_under_bf16_autocast_is_the_bf16_kind() -> None:
    spec = cell_spec(Cell("llama", "full", False, "sdpa", "bf16", 64, 1))
    amp = dataclasses.replace(spec, precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16))
    assert envelope_key(amp) == envelope_key(spec)
    lora = dataclasses.replace(amp, lora=LoraSpec(r=8))  # fp32 adapters are cast: the grid's own "bf16amp" kind
    assert envelope_key(lora) == ("llama", "lora", False, "sdpa", "bf16amp")
