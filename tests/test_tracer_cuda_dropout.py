"""Dropout traced as CUDA runs it (tracer_patches.cuda_dropout): a bool mask, not the CPU kernel's noise tensor.

torch 2.13 ``Dropout.cpp`` ``dropout``: CUDA inputs with 0 < p < 1 run ``native_dropout`` (backward keeps a 1-byte
mask); CPU ones multiply in ``bernoulli_`` noise of the input's dtype (kept for backward). A trace describes a
CUDA run unless ``device_type cpu``: the CPU kernel made ``fitcheck estimate`` answer 38.36 GiB for a LoRA run an
H100 measured at 31.00 GiB (benchmarks/data/gpu_truth_nvidia_h100_80gb_hbm3.json).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from fitcheck.report import Phase
from fitcheck.spec import LoraSpec
from fitcheck.torch_adapters.tracer import trace_step

HIDDEN, INTER, LAYERS, SEQ, BATCH = 64, 128, 2, 16, 2
LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
    "intermediate_size": INTER, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": LAYERS,
    "vocab_size": 256, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
KW: dict[str, Any] = {"seq_len": SEQ, "micro_batch": BATCH, "dtype": "float32", "optimizer": None, "steps": 1,
                      "lora": LoraSpec(r=4, alpha=8, dropout=0.05, target_modules=("all-linear",))}


def test_cuda_kernel_keeps_one_byte_per_element_where_the_cpu_kernel_keeps_four() -> None:
    cpu = trace_step(LLAMA, **KW)
    cuda = trace_step(LLAMA, cuda_kernels=True, **KW)
    # every adapted linear's input goes through its own dropout: q, k, v, o, gate, up (HIDDEN wide), down (INTER);
    # layer 0's q/k/v input descends from frozen weights only (no grad): neither kernel keeps anything for it
    elements = BATCH * SEQ * (LAYERS * (6 * HIDDEN + INTER) - 3 * HIDDEN)
    gap = cpu.phases[Phase.BACKWARD_START].total - cuda.phases[Phase.BACKWARD_START].total
    assert gap == elements * (4 - 1)  # fp32 noise vs bool mask
    no_dropout = {**KW, "lora": LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=("all-linear",))}
    # without dropout both kernels are the same run
    assert trace_step(LLAMA, cuda_kernels=True, **no_dropout).phases == trace_step(LLAMA, **no_dropout).phases


def test_fake_cuda_kernel_trace_equals_a_real_step_on_that_kernel() -> None:
    """The fake trace of the CUDA path equals a real CPU step that runs ``native_dropout`` (same patch)."""
    fake = trace_step(LLAMA, cuda_kernels=True, fake=True, **KW)
    real = trace_step(LLAMA, cuda_kernels=True, fake=False, **KW)
    assert {p: b.total for p, b in fake.phases.items()} == {p: b.total for p, b in real.phases.items()}



QLORA_LLAMA: dict[str, Any] = {**LLAMA, "hidden_size": 256, "intermediate_size": 688, "vocab_size": 8000,
                               "max_position_embeddings": 512}  # tests/test_tracer_qlora.py's TINY


@pytest.mark.parametrize("ckpt", [False, True], ids=["nockpt", "ckpt"])
def test_qlora_formula_counts_the_cuda_bool_mask_and_the_cpu_noise(ckpt: bool) -> None:
    """QLoRA (4-bit base, k-bit prepared, fp32, LoRA dropout 0.05 on every linear): the CUDA formula against the
    CUDA-emulating trace and the CPU formula against the CPU trace, every phase within 0.1 % of the traced
    activations. The formula counted 4 B of fp32 noise per dropped element on CUDA too (``qlora.py``
    ``_adapters``): here +9.2 % at the start of backward without checkpointing, +15.5 % during backward with it."""
    import dataclasses

    pytest.importorskip("bitsandbytes")
    from tiny_models import spec_from_config

    from fitcheck.spec import DeviceType, HardwareSpec, QuantSpec
    from fitcheck.torch_adapters import components_from_trace, phase_errors
    from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs

    lora = LoraSpec(r=8, alpha=16, dropout=0.05, target_modules=("all-linear",))
    cpu = spec_from_config(QLORA_LLAMA, seq=64, batch=2, dtype="bfloat16", lora=lora, quant=QuantSpec(bits=4),
                           checkpointing=ckpt)
    cuda = dataclasses.replace(cpu, hardware=HardwareSpec(device_type=DeviceType.CUDA))
    for spec in (cpu, cuda):
        kwargs = activation_trace_kwargs(spec)
        assert kwargs["cuda_kernels"] is (spec is cuda)
        errors = phase_errors(spec, components_from_trace(trace_step(QLORA_LLAMA, **kwargs)))
        assert all(abs(e) <= 0.001 for e in errors.values()), (spec.hardware.device_type, errors)
