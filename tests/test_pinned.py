"""No silent extrapolation: a formula answer outside the checked envelope says so; one path for every number."""

from __future__ import annotations

import dataclasses
import json
import re

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


# Issue 20: "a formula note that says 'not modelled' and pinned: true never appear together". Found by
# benchmarks/pinned_probes.py's note check (session 22) on runs it does not draw: a stack outside the modelled
# versions (--stack; the range rows ran the modelled one) and a quantization the readers estimate as unquantized
_UNMODELLED = re.compile(r"not\s+modell?ed|unmodell?ed", re.IGNORECASE)


@pytest.mark.parametrize("model,values,code", [
    ("meta-llama/Llama-2-7b-hf", {"stack": "peft=0.10.0"}, "versions-not-modelled"),
    ("meta-llama/Llama-2-7b-hf", {"stack": "torch=2.1.0"}, "versions-not-modelled"),
    ("microsoft/Phi-3-mini-4k-instruct", {"stack": "bitsandbytes=0.42.0", "load_in_4bit": True,
                                          "bnb_4bit_quant_type": "nf4"},  # fused q/k/v: the kept inputs' bound
     "bnb-keeps-inputs"),
    ("meta-llama/Llama-2-7b-hf", {"quantization_config": {"quant_method": "hqq", "nbits": 4}},
     "quantization-not-modelled"),
])
def test_pinned_never_next_to_a_not_modelled_note(model: str, values: dict[str, object], code: str) -> None:
    from fitcheck.catalog import find_catalog_config
    from fitcheck.readers import inventory_from_config
    from fitcheck.readers.run_args import spec_from_values

    found = find_catalog_config(model)
    assert found is not None
    config = dict(found[0])
    base = {"per_device_train_batch_size": 2, "max_seq_length": 1000, "dtype": "bfloat16", "device_type": "cpu",
            "gradient_checkpointing": True, "use_peft": True, "lora_target_modules": "all-linear"}
    inventory = inventory_from_config(config, str(config["model_type"]), "fitcheck/catalog")
    run = {k: v for k, v in values.items() if k != "quantization_config"}
    plain = estimate(spec_from_values({**base, **{k: v for k, v in run.items() if k != "stack"}},
                                      inventory=inventory)[0])
    assert plain.pinned  # the same run on the modelled stack, unquantized: a pinned kind at a shape inside it
    if "quantization_config" in values:
        config["quantization_config"] = values["quantization_config"]
        inventory = inventory_from_config(config, str(config["model_type"]), "fitcheck/catalog")
    report = estimate(spec_from_values({**base, **run}, inventory=inventory)[0])
    assert code in {f.code for f in report.findings}
    assert not report.pinned
    unpinned = next(f for f in report.findings if f.code == "not-pinned")
    assert code in unpinned.message and _UNMODELLED.search(unpinned.message)
