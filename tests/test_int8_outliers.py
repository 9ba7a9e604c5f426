"""LLM.int8 on CUDA (fitcheck/core/activations/int8_outliers.py, core/loading/events.py): the tensors bitsandbytes'
``MatMul8bitLt`` and quantize-on-load allocate, pinned against the installed source (its CUDA kernels do not run
here), and the H200 rows (``benchmarks/data/gpu_truth_nvidia_h200.json``) against the estimate and its bound."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from benchmark_module import load_benchmark

from fitcheck.core.activations.int8_outliers import (
    int8_linears,
    int8_outlier_bound,
    int8_outlier_bytes,
    int8_outlier_findings,
)

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "benchmarks" / "data" / "gpu_truth_nvidia_h200.json"
COUNTS = ROOT / "benchmarks" / "data" / "int8_cuda_outliers.json"


def _bnb_source(rel: str) -> str:
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or spec.origin is None:
        pytest.skip("bitsandbytes not installed")
    return (Path(spec.origin).parent / rel).read_text(encoding="utf-8")


def test_modelled_tensors_are_the_sources() -> None:
    """Each modelled term, as the installed bitsandbytes 0.50.2 / transformers 5.23 write it."""
    fn = _bnb_source("autograd/_functions.py")
    assert "F.int8_vectorwise_quant(A.to(torch.float16), threshold=state.threshold)" in fn  # the fast path
    assert "ctx.tensors = (CAt, subA, A)" in fn  # subA and A kept as node attributes
    cuda = _bnb_source("backends/cuda/ops.py")
    assert "outliers = A.abs() >= threshold" in cuda
    assert "outlier_cols = torch.argwhere(outliers.any(dim=0)).view(-1)" in cuda  # a subset of A's columns: the bound
    assert "int8_mixed_scaled_mm" not in cuda  # CUDA runs the default kernel below
    default = _bnb_source("backends/default/ops.py")
    assert "subA = A[:, outlier_cols].contiguous()" in default  # in A's dtype
    assert "int8_vectorwise_dequant.default(CB[:, outlier_cols].contiguous(), SCB)" in default
    assert "int8_scaled_mm.default(CA, CB, SCA, SCB, bias=bias, dtype=A.dtype)" in default  # output in A.dtype
    ops = _bnb_source("_ops.py")
    assert "return A * stats.view(-1, 1) * 7.874015718698502e-3" in ops  # two fp32 out x cols arrays at once
    # quantize-on-load: row_stats (SCB) before out_row (CB); the fp16 copy is made from a CPU tensor
    assert cuda.index("row_stats = torch.empty(rows") < cuda.index("out_row = torch.empty(A.shape")
    modules = _bnb_source("nn/modules.py")
    assert "B = self.data.contiguous().to(device=device, dtype=torch.float16)" in modules
    assert 'self.data.device.type == "cpu"' in modules  # Int8Params.to quantizes a CPU tensor only
    tf = importlib.util.find_spec("transformers")
    assert tf is not None and tf.origin is not None
    bnb_int = (Path(tf.origin).parent / "integrations" / "bitsandbytes.py").read_text(encoding="utf-8")
    assert 'bnb.nn.Int8Params(value.to("cpu"), requires_grad=False, **params_kwargs).to(value_device)' in bnb_int


def _row_spec(name: str) -> tuple[Any, dict[str, Any]]:
    from fitcheck.cli import spec_from_values

    gpu_truth = load_benchmark("gpu_truth")
    rows = {r["name"]: r for r in json.loads(H200.read_text(encoding="utf-8"))["rows"]}
    row = next(x for x in gpu_truth.ROWS if x.name == name)
    with tempfile.TemporaryDirectory() as tmp:
        spec, _ = spec_from_values(gpu_truth.rescore_values(row, rows[name]["environment"], tmp), {})
    return spec, rows[name]


def test_llama2_7b_bound_term_by_term() -> None:
    """Llama-2-7B (h = q = 4096, I = 11008), 8 layers, 1 x 4096, fp16 autocast, no checkpointing: every column of
    q/k/v, gate/up (fp32 norm outputs), o_proj (fp16 attention output) and down_proj (fp32 product) copied, less
    layer 0's q/k/v (no node); the largest transient is down_proj's subA + subB (int8 + two fp32 copies)."""
    pytest.importorskip("transformers")
    spec, _ = _row_spec("llama2-7b-8L int8 LoRA b1 s4096")
    assert [(x.name, x.a_bytes) for x in int8_linears(spec)] == [
        ("q_proj", 4), ("k_proj", 4), ("v_proj", 4), ("o_proj", 2), ("gate_proj", 4), ("up_proj", 4),
        ("down_proj", 4)]
    h, inter, tokens = 4096, 11008, 4096
    per_layer = 3 * 4 * h + 2 * h + 2 * 4 * h + 4 * inter
    bound = int8_outlier_bound(spec)
    assert bound.kept == (8 * per_layer - 3 * 4 * h) * tokens == 4194304000
    assert bound.transient == tokens * inter * 4 + h * inter * 9 == 586153984
    reentrant = dataclasses.replace(spec, activations=dataclasses.replace(
        spec.activations, checkpointing=True, use_reentrant=True))
    # no_grad forward: no node keeps a copy; the recomputed layer's graph holds its own through its backward
    assert int8_outlier_bound(reentrant).kept == per_layer * tokens


def test_h200_rows_lie_between_the_estimate_and_its_bound() -> None:
    """The three int8 rows (random weights): the estimate counts no outlier column and stays below the
    measurement; the bound (every column) above it; the rows' own columns (int8_cuda_outliers.json) explain the
    plain rows within 0.2 % and bracket the checkpointed one (its peak is in the top layer's recomputation)."""
    pytest.importorskip("transformers")
    from fitcheck.core.estimator import estimate

    counts = {r["name"]: r["outlier_columns"] for r in json.loads(COUNTS.read_text(encoding="utf-8"))["rows"]}
    for name in counts:
        spec, row = _row_spec(name)
        measured = row["measured"]["max_allocated"]
        est = estimate(spec).peak_allocated_bytes
        bound = int8_outlier_bound(spec)
        assert est < measured < est + bound.total, name
        got = int8_outlier_bytes(spec, counts[name])
        if spec.activations.checkpointing:
            assert est + got.kept < measured < est + got.kept + got.transient, name
        else:
            assert abs(est + got.kept - measured) / measured < 0.002, name


def test_findings_carry_the_bound() -> None:
    pytest.importorskip("transformers")
    from fitcheck.core.estimator import estimate
    from fitcheck.units import format_bytes

    spec, _ = _row_spec("llama2-7b-8L int8 LoRA b1 s4096")
    report = estimate(spec)
    bound = int8_outlier_bound(spec)
    gap = next(f for f in report.findings if f.code == "cuda-not-traced")
    assert format_bytes(bound.kept) in gap.message and format_bytes(bound.transient) in gap.message
    assert not any(f.code == "int8-outliers-may-not-fit" for f in report.findings)  # 141 GB free
    tight = report.device_used_bytes + bound.total // 2
    (warn,) = int8_outlier_findings(spec, report.device_used_bytes, tight)
    assert warn.code == "int8-outliers-may-not-fit" and format_bytes(bound.total) in warn.message
    assert int8_outlier_findings(spec, report.device_used_bytes, report.device_used_bytes - 1) == ()  # does-not-fit


def test_fp16_rows_load_phase_is_the_measured_one() -> None:
    """Quantize-on-load makes the fp16 GPU copy for an fp16 load too (``Bnb8bitQuantize.convert``'s CPU round trip):
    the Llama-2-7B fp16 rows' load and preparation equal the H200's allocator counters to the byte (before: the
    copy skipped for fp16, load reserved -3.93 %)."""
    pytest.importorskip("transformers")
    from fitcheck.core.loading import load_phase

    spec, row = _row_spec("llama2-7b-8L int8 LoRA b1 s4096")
    lp = load_phase(spec, spec.hardware.gpu_memory_bytes)
    assert lp is not None
    prep = row["measured"]["phases"]["prepare"]
    assert (lp.peak_reserved, lp.end_reserved) == (prep["max_reserved"], prep["reserved"]) == (3470786560, 3470786560)
    assert abs(lp.peak_allocated - prep["max_allocated"]) < 2**20  # 1 KiB apart per module's small tensors


def test_threshold_and_fp16_weights_are_read() -> None:
    """``llm_int8_threshold`` reaches the spec (0: ``int8_scaled_mm`` alone, no outlier copy, no bound);
    ``llm_int8_has_fp16_weight`` true (16-bit weights kept, re-quantized every forward) is refused as not modelled.
    Before: both keys were dropped and every 8-bit base read as threshold 6, int8 weights."""
    pytest.importorskip("transformers")
    from transformers import BitsAndBytesConfig

    from fitcheck.errors import ConfigError
    from fitcheck.findings import Finding
    from fitcheck.readers.quantization_config import quant_from_mapping, quant_from_object
    from fitcheck.spec import QuantSpec

    read = quant_from_object(BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=0.0))
    assert isinstance(read, QuantSpec) and read.int8_threshold == 0.0
    default = quant_from_object(BitsAndBytesConfig(load_in_8bit=True))  # transformers' default: 6.0
    assert isinstance(default, QuantSpec) and default.int8_threshold == 6.0
    refused = quant_from_object(BitsAndBytesConfig(load_in_8bit=True, llm_int8_has_fp16_weight=True))
    assert isinstance(refused, Finding) and refused.code == "quantization-not-modelled"
    with pytest.raises(ConfigError, match="llm_int8_threshold"):
        quant_from_mapping({"load_in_8bit": True, "llm_int8_threshold": -1}, source="config.json")
    spec, _ = _row_spec("llama2-7b-8L int8 LoRA b1 s4096")
    assert spec.quant is not None
    off = dataclasses.replace(spec, quant=dataclasses.replace(spec.quant, int8_threshold=0.0))
    assert int8_outlier_bound(off).total == 0
    from fitcheck.core.activations.cuda import cuda_gaps

    assert any("llm_int8_threshold 0: no outlier columns" in g for g in cuda_gaps(off))
