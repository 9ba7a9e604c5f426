"""LLM.int8 LoRA activations (fitcheck/core/activations/int8.py) against fake-tensor traces of the real
bitsandbytes ``Linear8bitLt`` layers (``MatMul8bitFp`` on CPU): one layer's saved bytes per token to the byte
(2-layer minus 1-layer trace), with and without checkpointing; the CUDA path is from source."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tiny_models import spec_from_config

from fitcheck.core.activations.int8 import (
    int8_checkpointed_inputs,
    int8_formula_applies,
    int8_layer_saved_per_token,
)
from fitcheck.core.activations.qlora import lora_layer_params, qlora_layer_saved_per_token
from fitcheck.spec import DeviceType, HardwareSpec, LoraSpec, QuantSpec

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2000,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
INT8 = QuantSpec(bits=8)
DROP = LoraSpec(r=8, alpha=16, dropout=0.05, target_modules=("all-linear",))
PLAIN = LoraSpec(r=8, alpha=16, target_modules=("all-linear",))
QV = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
SEQ = 64


def _layer_delta(lora: LoraSpec, mixed: str, attn: str, ckpt: bool, reentrant: bool = False) -> dict[str, int]:
    """Bytes per token one more decoder layer adds to the trace, by phase (activations)."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from fitcheck.torch_adapters.tracer import trace_step

    runs = [
        trace_step(TINY, seq_len=SEQ, micro_batch=1, dtype="bfloat16", mixed_precision=mixed,
                   attn_implementation=attn, checkpointing=ckpt, lora=lora, quant=INT8, num_layers=n,
                   use_reentrant=reentrant)
        for n in (1, 2)
    ]
    return {p.value: (runs[1].phases[p].get("activations") - runs[0].phases[p].get("activations")) // SEQ
            for p in runs[0].phases}


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("lora", "mixed", "attn"),
    [(DROP, "no", "sdpa"), pytest.param(PLAIN, "no", "sdpa", marks=SLOW), pytest.param(QV, "no", "sdpa", marks=SLOW),
     (DROP, "bf16", "sdpa"), pytest.param(PLAIN, "bf16", "sdpa", marks=SLOW),
     pytest.param(DROP, "no", "eager", marks=SLOW), pytest.param(DROP, "bf16", "eager", marks=SLOW)],
)
def test_int8_layer_equals_trace(lora: LoraSpec, mixed: str, attn: str) -> None:
    spec = spec_from_config(TINY, seq=SEQ, mixed=mixed, attn=attn, lora=lora, quant=INT8)
    assert int8_formula_applies(spec)
    per_token, s2 = int8_layer_saved_per_token(spec, attn == "eager")
    # autocast keeps the bf16 casts of the layer's LoRA weights until backward (a per-layer constant)
    cache = 2 * lora_layer_params(spec) // TINY["num_hidden_layers"] // SEQ if mixed == "bf16" else 0
    assert _layer_delta(lora, mixed, attn, False)["end of forward"] == per_token + s2 * SEQ + cache


@pytest.mark.parametrize("mixed", ["no", pytest.param("bf16", marks=SLOW)])
def test_checkpointed_int8_layer_keeps_every_linear_input(mixed: str) -> None:
    """Non-reentrant checkpointing drops saved tensors, not ``ctx.A`` (an attribute of MatMul8bitFp)."""
    spec = spec_from_config(TINY, seq=SEQ, mixed=mixed, checkpointing=True, lora=DROP, quant=INT8)
    residual = 4 * TINY["hidden_size"]  # the fp32 checkpoint input (k-bit preparation upcasts the model)
    assert _layer_delta(DROP, mixed, "sdpa", True)["start of backward"] == residual + int8_checkpointed_inputs(spec)


def test_int8_layer_exceeds_the_qlora_layer_where_only_ctx_a_keeps_the_input() -> None:
    spec = spec_from_config(TINY, seq=SEQ, lora=DROP, quant=INT8)
    h, inter = TINY["hidden_size"], TINY["intermediate_size"]
    extra = int8_layer_saved_per_token(spec, False)[0] - qlora_layer_saved_per_token(spec, False)[0]
    assert extra == 4 * (2 * h + inter)
    plain = spec_from_config(TINY, seq=SEQ, lora=PLAIN, quant=INT8)  # fp32 adapters keep those inputs already
    assert int8_layer_saved_per_token(plain, False) == qlora_layer_saved_per_token(plain, False)


def test_cuda_int8_autocast_keeps_fp32_mlp_outputs() -> None:
    """MatMul8bitLt returns the input's dtype (int8 GEMM, no autocast op): the MLP stays fp32 on CUDA, while CPU's
    MatMul8bitFp runs F.linear under autocast (bf16 outputs)."""
    cpu = spec_from_config(TINY, seq=SEQ, mixed="bf16", lora=DROP, quant=INT8)
    cuda = dataclasses.replace(cpu, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    h, inter = TINY["hidden_size"], TINY["intermediate_size"]
    masks = 3 * (6 * h + inter)  # CUDA's bool dropout masks (below; o_proj reads q = h wide)
    assert int8_layer_saved_per_token(cuda, False)[0] - int8_layer_saved_per_token(cpu, False)[0] == 8 * inter - masks
    assert int8_checkpointed_inputs(cuda) - int8_checkpointed_inputs(cpu) == 2 * inter


def test_cuda_lora_dropout_keeps_a_bool_mask_not_fp32_noise() -> None:
    """torch: CPU ``F.dropout`` saves fp32 noise of its input's size; ``native_dropout`` (what CUDA runs for
    0 < p < 1, aten Dropout.cpp ``is_fused_kernel_acceptable``) returns a bool mask. The int8 CUDA layer counts
    1 B per dropped element where the CPU trace counts 4 (7 adapters: q/k/v/gate/up on h, o_proj on q, down on I),
    through the QLoRA layer it shares (``qlora.lora_dropout_mask_bytes``)."""
    import torch

    x = torch.randn(8, 32, requires_grad=True)
    saved: list[torch.dtype] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        torch.nn.functional.dropout(x, 0.05, training=True)
    assert saved == [torch.float32]  # _dropout_impl: input * noise saves the fp32 noise
    assert torch.native_dropout(x.detach(), 0.05, True)[1].dtype == torch.bool
    cpu = spec_from_config(TINY, seq=SEQ, mixed="bf16", lora=DROP, quant=INT8)
    cuda = dataclasses.replace(cpu, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    h, inter = TINY["hidden_size"], TINY["intermediate_size"]
    q = TINY["hidden_size"]  # 4 heads x 64

    def gap(cpu_spec: Any) -> int:
        cuda_spec = dataclasses.replace(cpu_spec, hardware=HardwareSpec(device_type=DeviceType.CUDA))
        return qlora_layer_saved_per_token(cpu_spec, False)[0] - qlora_layer_saved_per_token(cuda_spec, False)[0]

    assert gap(cpu) == 3 * (5 * h + q + inter)
    assert gap(dataclasses.replace(cpu, lora=PLAIN)) == 0
    assert int8_layer_saved_per_token(cpu, False)[0] - int8_layer_saved_per_token(cuda, False)[0] == (
        gap(cpu) - 8 * inter)  # the masks, less the fp32 MLP of MatMul8bitLt (above)


def test_cuda_int8_llama2_7b_layer_from_source() -> None:
    """The CUDA LLM.int8 LoRA layer of Llama-2-7B (fp16 autocast, TRL's LoRA r16 all-linear, dropout 0.05), term by
    term from source (bytes per token; h = q = 4096, I = 11008): two RMSNorms' fp32 input and rsqrt 2(4h+4); seven
    adapters' bool dropout masks (5h + q + I) and fp16 casts for lora_A 2(5h + q + I), lora_A outputs 7·2r; SDPA's
    fp16 q, k, v, output 2·4q and logsumexp 4·heads; gate/up outputs and act(gate) in fp32 (MatMul8bitLt returns
    A.dtype) 12I; ctx.A of q/k/v and gate/up (fp32 norm outputs, 8h) and of down_proj (the fp32 product, 4I).
    The old formula counted the CPU trace's fp32 dropout noise: 488296 B/token."""
    from fitcheck.catalog import find_catalog_config

    found = find_catalog_config("meta-llama/Llama-2-7b-hf")
    assert found is not None
    lora = LoraSpec(r=16, alpha=32, dropout=0.05, target_modules=("all-linear",))
    spec = spec_from_config(dict(found[0]), seq=4096, mixed="fp16", lora=lora, quant=INT8, dtype="float16")
    spec = dataclasses.replace(spec, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    h, q, inter, r, heads = 4096, 4096, 11008, 16, 32
    dropped = 5 * h + q + inter
    expected = (2 * (4 * h + 4) + dropped + 2 * dropped + 7 * 2 * r + 2 * 4 * q + 4 * heads + 12 * inter
                + 8 * h + 4 * inter)
    assert expected == 381544
    assert int8_layer_saved_per_token(spec, False) == (expected, 0)


@pytest.mark.slow
def test_reentrant_checkpointing_keeps_no_ctx_a() -> None:
    """Reentrant checkpointing runs the forward under no_grad: no MatMul8bitFp node, no ctx.A."""
    from fitcheck.core.estimator import estimate
    from fitcheck.report import Phase

    assert _layer_delta(DROP, "no", "sdpa", True, reentrant=True)["start of backward"] == 4 * TINY["hidden_size"]
    spec = spec_from_config(TINY, seq=SEQ, checkpointing=True, lora=DROP, quant=INT8)
    re = dataclasses.replace(spec, activations=dataclasses.replace(spec.activations, use_reentrant=True))

    def saved(s: Any) -> int:
        return next(c.at(Phase.BACKWARD_START) for c in estimate(s).components if c.name == "activations.saved")

    layers = TINY["num_hidden_layers"]
    assert saved(spec) - saved(re) == layers * int8_checkpointed_inputs(spec) * SEQ


def test_int8_lora_is_pinned_on_cpu_and_from_source_on_cuda() -> None:
    from fitcheck.core.activations import in_envelope
    from fitcheck.core.estimator import estimate
    from fitcheck.torch_adapters.differential import Cell, cell_spec

    # bf16: the autocast kind is in envelope_probe_misses.json (Llama-2-7B 1 x 1152: +2.9 %), not pinned anywhere
    cpu = cell_spec(Cell("llama", "int8", True, "sdpa", "bf16", 2048, 2))
    assert in_envelope(cpu) and estimate(cpu).pinned  # inside its checked range (envelope_ranges.json, issue 20)
    short = cell_spec(Cell("llama", "int8", True, "sdpa", "bf16", 64, 1))
    assert not in_envelope(short)  # below it: its single grid cell pinned this before
    assert not any("lower bound" in f.hint for f in estimate(cpu).findings)
    cuda = dataclasses.replace(cpu, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    report = estimate(cuda)
    assert not in_envelope(cuda) and not report.pinned
    assert any(f.code == "not-pinned" and "MatMul8bitLt" in f.message for f in report.findings)
    assert any(f.code == "cuda-not-traced" and "subA" in f.message for f in report.findings)


def test_matmul8bitlt_keeps_its_input_and_its_outlier_columns() -> None:
    """Real bitsandbytes ``MatMul8bitLt`` (the CUDA training path), run on CPU through its default kernels
    (``backends/default/ops.py``; CUDA runs the same ``int8_mixed_scaled_mm``): ``ctx.tensors = (None, subA, A)``
    keeps the input itself and ``subA``, a copy of the input's outlier columns (|x| >= threshold); the output is
    in the input's dtype under autocast; with no input needing a gradient no node (no ctx) is recorded."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    from bitsandbytes.autograd._functions import MatMul8bitLt

    layer = bnb.nn.Linear8bitLt(32, 24, bias=False, has_fp16_weights=False, threshold=6.0)
    layer.weight = bnb.nn.Int8Params(torch.randn(24, 32) * 0.02, requires_grad=False,
                                     has_fp16_weights=False).to("cpu")
    layer.init_8bit_state()
    x = torch.randn(2, 5, 32).clamp(-3, 3).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = MatMul8bitLt.apply(x, layer.weight, None, None, layer.state)
    assert out.dtype == torch.float32  # int8_scaled_mm(..., dtype=A.dtype): autocast does not apply
    _cat, sub_a, a = out.grad_fn.tensors
    assert _cat is None and a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert sub_a.numel() == 0  # no outlier column
    y = x.detach().clone()
    y[..., 3] = 10.0
    y[0, 1, 7] = -8.0
    out = MatMul8bitLt.apply(y.requires_grad_(True), layer.weight, None, None, layer.state)
    assert tuple(out.grad_fn.tensors[1].shape) == (10, 2)  # every row of the two outlier columns, fp32
    assert out.grad_fn.tensors[1].dtype == torch.float32
    assert MatMul8bitLt.apply(x.detach(), layer.weight, None, None, layer.state).grad_fn is None
    # one row crossing the threshold in every column: subA is a full copy, the bound of int8_outliers.py
    from fitcheck.core.activations.int8_outliers import Int8Linear, sub_a_bytes

    z = x.detach().clone()
    z[0, 0, :] = 7.0
    sub_a = MatMul8bitLt.apply(z.requires_grad_(True), layer.weight, None, None, layer.state).grad_fn.tensors[1]
    assert sub_a.numel() * sub_a.element_size() == sub_a_bytes(Int8Linear("down_proj", 32, 24, 4), 10, 32) == 1280


def test_first_layer_keeps_no_qkv_input_without_checkpointing() -> None:
    """Layer 0's norm output needs no gradient without checkpointing (frozen embeddings, no input-gradient hook):
    no MatMul8bitFp node keeps it. The whole Llama-3.1-8B step traced on real bitsandbytes layers (1 and 2 layers,
    extrapolated) equals the formula to the byte at the end of forward and the start of backward (before:
    +4·hidden_size per token)."""
    pytest.importorskip("bitsandbytes")
    from fitcheck.core.activations.int8 import int8_first_layer_unsaved
    from fitcheck.report import Phase
    from fitcheck.torch_adapters import Cell, cell_spec, compare

    cell = Cell("llama", "int8", False, "sdpa", "fp32", 256, 1)
    assert int8_first_layer_unsaved(cell_spec(cell)) == 4 * 4096
    out = compare(cell)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
        assert out.formula[phase] == out.trace[phase]
    assert int8_first_layer_unsaved(cell_spec(Cell("llama", "int8", True, "sdpa", "fp32", 256, 1))) == 0
