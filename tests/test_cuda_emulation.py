"""A CUDA spec's trace keeps what the CUDA step keeps (``fitcheck.torch_adapters.cuda_emulation``), a CPU one what the
CPU step keeps; and a CUDA answer is pinned only by a check against that trace where the two differ.

H200 (benchmarks/data/gpu_truth_nvidia_h200.json): GPT-2 fp32 8 x 1024 measured 14470 MiB, the CPU-kernel trace
answered 28289 (SDPA's math path with dropout); Phi-2 LoRA under bf16 autocast measured 68659 MiB, the CPU-autocast
trace answered 52018 (layer_norm and gelu_new's pow run in fp32 under CUDA autocast).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fitcheck.core import estimate
from fitcheck.core.activations import envelope as envelope_module
from fitcheck.core.activations import in_envelope
from fitcheck.report import Phase
from fitcheck.spec import DeviceType, HardwareSpec, MixedPrecision
from fitcheck.torch_adapters.differential import Cell, cell_spec

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SEQ, BATCH = 32, 2
# GPT-2 with only attention dropout (the residual/embedding masks differ between CPU and CUDA too: cuda_dropout)
GPT2: dict[str, Any] = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 1, "n_embd": 32,
                        "n_head": 2, "n_positions": 64, "vocab_size": 96, "attn_pdrop": 0.1, "resid_pdrop": 0.0,
                        "embd_pdrop": 0.0}
PHI: dict[str, Any] = {"model_type": "phi", "architectures": ["PhiForCausalLM"], "num_hidden_layers": 1,
                       "hidden_size": 32, "intermediate_size": 128, "num_attention_heads": 2, "vocab_size": 96,
                       "max_position_embeddings": 64, "hidden_act": "gelu_new"}
STEP: dict[str, Any] = {"seq_len": SEQ, "micro_batch": BATCH, "optimizer": None, "steps": 1}


def _phases(result: Any) -> dict[Phase, int]:
    return {p: b.total for p, b in result.phases.items()}


def test_cuda_sdpa_dropout_keeps_no_square_tensor() -> None:
    """SDPA with dropout traced for CUDA keeps what the same call without dropout keeps (the fused kernels' q, k, v,
    output, logsumexp); the CPU trace keeps the math path's s x s softmax, noise and dropped probabilities."""
    from fitcheck.torch_adapters.tracer import trace_step

    no_dropout = {**GPT2, "attn_pdrop": 0.0}
    cuda = trace_step(GPT2, dtype="float32", cuda_kernels=True, **STEP)
    assert _phases(cuda) == _phases(trace_step(no_dropout, dtype="float32", cuda_kernels=True, **STEP))
    cpu = trace_step(GPT2, dtype="float32", **STEP)
    square = BATCH * GPT2["n_head"] * SEQ * SEQ * 4  # one fp32 (b, heads, s, s) tensor
    extra = cpu.phases[Phase.FORWARD_END].get("activations") - cuda.phases[Phase.FORWARD_END].get("activations")
    assert extra > 2 * square  # softmax, dropout noise, dropped probabilities (less the fused path's output, lse)


def test_cuda_autocast_runs_layer_norm_and_pow_in_fp32() -> None:
    """Under the emulated CUDA autocast a bf16 LayerNorm's output and gelu_new's pow are fp32, and autograd keeps the
    fp32 casts (the autocast kernel sits above autograd); CPU autocast keeps them bf16."""
    import transformers

    from fitcheck.torch_adapters.cuda_emulation import cuda_kernels

    model = transformers.PhiForCausalLM(transformers.PhiConfig(**PHI)).to(torch.bfloat16)
    layer = model.model.layers[0]
    ids = torch.randint(0, PHI["vocab_size"], (BATCH, SEQ))

    def run() -> tuple[torch.dtype, set[tuple[torch.dtype, tuple[int, ...]]]]:
        seen: dict[str, torch.dtype] = {}

        def record(_module: Any, _inputs: Any, out: torch.Tensor) -> None:
            seen["ln"] = out.dtype

        hook = layer.input_layernorm.register_forward_hook(record)
        saved: set[tuple[torch.dtype, tuple[int, ...]]] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.add((t.dtype, tuple(t.shape)))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids, labels=ids)
        hook.remove()
        return seen["ln"], saved

    cpu_ln, cpu_saved = run()
    with cuda_kernels():
        cuda_ln, cuda_saved = run()
    intermediate = (torch.float32, (BATCH, SEQ, PHI["intermediate_size"]))  # fc1 output cast for pow
    assert (cpu_ln, cuda_ln) == (torch.bfloat16, torch.float32)
    assert intermediate in cuda_saved and intermediate not in cpu_saved
    assert (torch.float32, (BATCH, SEQ, PHI["hidden_size"])) in cuda_saved  # the LayerNorm's fp32 input
    # the registrations are gone after the context: CPU autocast is CPU autocast again
    assert run()[0] == torch.bfloat16


def test_cuda_trace_of_an_autocast_layernorm_family_keeps_more() -> None:
    """trace_step with cuda_kernels under bf16 autocast keeps the fp32 tensors; without autocast nothing changes."""
    from fitcheck.torch_adapters.tracer import trace_step

    auto = {"dtype": "bfloat16", "mixed_precision": "bf16", **STEP}
    cuda, cpu = trace_step(PHI, cuda_kernels=True, **auto), trace_step(PHI, **auto)
    fp32_pow_input = BATCH * SEQ * PHI["intermediate_size"] * 4
    extra = cuda.phases[Phase.FORWARD_END].get("activations") - cpu.phases[Phase.FORWARD_END].get("activations")
    assert extra >= fp32_pow_input
    plain = {"dtype": "bfloat16", **STEP}  # no autocast: the lists do not apply, no dropout in PHI
    assert _phases(trace_step(PHI, cuda_kernels=True, **plain)) == _phases(trace_step(PHI, **plain))


def test_emulated_ops_are_cuda_autocast_ops_the_cpu_does_not_list() -> None:
    """Every op the emulation registers has an AutocastCUDA kernel and no AutocastCPU one in the installed torch."""
    from fitcheck.torch_adapters.cuda_emulation import emulated_ops

    ops = emulated_ops()
    assert {"layer_norm", "pow.Tensor_Scalar", "softmax.int", "exp"} <= set(ops)
    for name in ops:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "AutocastCUDA"), name
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "AutocastCPU"), name


def _cuda(spec: Any) -> Any:
    return dataclasses.replace(spec, hardware=HardwareSpec(device_type=DeviceType.CUDA))


def test_a_cuda_layernorm_autocast_answer_needs_a_cuda_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """phi full bf16 under bf16 autocast: its CPU row pins a CPU answer, not a CUDA one (CUDA autocast keeps fp32
    LayerNorm/pow tensors the formula does not count); the CUDA check of phi LoRA bf16amp was -9.3 % (out)."""
    cpu = cell_spec(Cell("phi", "full", False, "sdpa", "bf16", 1024, 1))
    cpu = dataclasses.replace(cpu, precision=dataclasses.replace(cpu.precision, mixed_precision=MixedPrecision.BF16))
    assert in_envelope(cpu)
    assert not in_envelope(_cuda(cpu)) and not estimate(_cuda(cpu)).pinned
    message = envelope_module.not_pinned_finding(_cuda(cpu)).message
    assert "range-checked on CPU only" in message and "layer_norm" in message
    lora_amp = _cuda(cell_spec(Cell("phi", "lora", False, "sdpa", "bf16amp", 1024, 1)))
    assert not in_envelope(lora_amp)
    # a bf16 @cuda row (its cells run no autocast) does not pin 16-bit weights under autocast either
    rows = dict(envelope_module.envelope_ranges())
    rows["phi/full/nockpt/sdpa/bf16@cuda"] = rows["phi/full/nockpt/sdpa/bf16"]
    monkeypatch.setattr(envelope_module, "envelope_ranges", lambda: rows)
    assert not in_envelope(_cuda(cpu)) and in_envelope(_cuda(cell_spec(Cell("phi", "full", False, "sdpa", "bf16",
                                                                             1024, 1))))


def test_a_cuda_gpt2_sdpa_answer_is_pinned_by_its_cuda_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2 (attention dropout) with SDPA: the CUDA answer is pinned by gpt2/full/nockpt/sdpa/fp32@cuda; without
    that row it is not (its CPU row checked the math path); the CPU answer keeps its CPU row."""
    cpu = cell_spec(Cell("gpt2", "full", False, "sdpa", "fp32", 1024, 8))
    assert in_envelope(cpu) and in_envelope(_cuda(cpu))
    rows = {k: v for k, v in envelope_module.envelope_ranges().items() if not k.endswith("@cuda")}
    monkeypatch.setattr(envelope_module, "envelope_ranges", lambda: rows)
    assert in_envelope(cpu) and not in_envelope(_cuda(cpu))
