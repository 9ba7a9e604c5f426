"""The cuBLAS workspaces a CUDA step allocates through the caching allocator, placed where the GPU places them.

torch's ``aten/src/ATen/cuda/CublasHandlePool.cpp`` allocates a thread's workspace (32 MiB on sm90, plus the
cuBLASLt one) at that thread's first cuBLAS call and keeps it; the forward runs on the Python thread and the
backward on autograd's device thread, so the second workspace is allocated at the backward's first matmul (the LM
head's), when the loss's fp32 logits-sized blocks have just been freed. Measured on an H200
(``benchmarks/data/gpu_truth_nvidia_h200.json``, Qwen2.5-0.5B full bf16, 8 x 1024): the replay without them
answered 28508 MiB reserved against 33262 MiB measured (-14.1 %, one 4748 MiB fp32 logits segment short).
"""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.core import cublas_thread_workspaces
from fitcheck.core.caching import CachingAllocator
from fitcheck.families import traits_of_type
from fitcheck.spec import DeviceType, HardwareSpec, Kind, ModelInventory, ModelShape, ParamEntry, Role, TrainingSpec

MIB = 1024**2


def _spec(**hw: object) -> TrainingSpec:
    shape = ModelShape("llama", "LlamaForCausalLM", 64, 2, 4, 4, 16, 128, 1000, traits=traits_of_type("llama"))
    entry = ParamEntry("model.layers.*.mlp.up_proj.weight", (128, 64), Role.MLP, Kind.LINEAR, repeat=2)
    return TrainingSpec(model=ModelInventory("tiny", shape, (entry,)), hardware=HardwareSpec(**hw))  # type: ignore[arg-type]


def test_workspace_carved_from_a_freed_logits_block_costs_a_segment() -> None:
    """``get_free_block`` is best fit over the pool's free blocks ordered by (size, address); ``should_split``
    splits a large-pool block when more than ``kSmallSize`` remains; requests of at least ``kMinLargeAlloc`` get a
    segment of their own size rounded to 2 MiB (``get_allocation_size``). So a 32 MiB workspace allocated while
    the only free blocks are a 28 MiB activation and two 100 MiB logits blocks takes 32 MiB of the first logits
    block for good, and the next step's two logits blocks need a third 100 MiB segment."""

    def run(*activations: int) -> int:
        a = CachingAllocator()
        for h, n in enumerate(activations, 10):  # freed fp32 activations (hidden 896 x 8192 tokens: 28 MiB)
            a.malloc(h, n)
        a.malloc(3, 100 * MIB)  # the loss's fp32 logits-sized blocks
        a.malloc(4, 100 * MIB)
        for h in (*range(10, 10 + len(activations)), 3, 4):
            a.free(h)
        a.malloc(5, 32 * MIB)  # the autograd thread's cuBLAS workspace, never freed
        a.malloc(6, 100 * MIB)  # the next step's logits
        a.malloc(7, 100 * MIB)
        return a.stats.reserved

    assert run(28 * MIB) == (28 + 100 + 100 + 100) * MIB  # the workspace split a logits block: one more segment
    # with a free 48 MiB block (hidden 1536 x 8192 tokens in fp32) the workspace goes there instead
    assert run(28 * MIB, 48 * MIB) == (28 + 48 + 100 + 100) * MIB


def test_trace_kwargs_carry_the_gpus_workspaces() -> None:
    from fitcheck.torch_adapters.trace_arguments import trace_kwargs

    assert cublas_thread_workspaces(_spec(gpu_name="H100-80GB")) == (32 * MIB, MIB)
    assert trace_kwargs(_spec(gpu_name="h200-141gb"))["cublas_workspaces"] == (32 * MIB, MIB)
    assert trace_kwargs(_spec(gpu_name="A100-80GB"))["cublas_workspaces"] == (8 * MIB + 128 * 1024, MIB)
    assert trace_kwargs(_spec(device_type=DeviceType.CPU))["cublas_workspaces"] == ()


QWEN: dict[str, Any] = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2,
                        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 128,
                        "tie_word_embeddings": True}


def test_trace_holds_one_workspace_pair_per_thread_outside_the_steps_accounting() -> None:
    """Two steps traced for CUDA: the workspaces enter ``alloc_events`` once per thread (the forward's at its first
    matmul, the backward's at the LM head's backward), are never freed, and change neither the step's phases nor
    any other event; the region starts still point at their regions."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters.tracer import trace_step

    ws, lt = 3 * MIB + 4096, MIB + 4096  # sizes no tensor of this model has
    kw: dict[str, Any] = {"seq_len": 32, "micro_batch": 2, "optimizer": "adamw_torch_fused", "steps": 2,
                          "cuda_kernels": True}
    plain = trace_step(QWEN, **kw)
    held = trace_step(QWEN, cublas_workspaces=(ws, lt), **kw)
    assert {p: b.total for p, b in held.phases.items()} == {p: b.total for p, b in plain.phases.items()}

    freed = {s for s, n, _ in held.alloc_events if n < 0}
    extra = [(i, s, n, tag) for i, (s, n, tag) in enumerate(held.alloc_events)
             if n in (ws, lt) and s not in freed]
    workspaces = [(n, tag) for _, _, n, tag in extra]
    assert workspaces == [(ws, "forward_warmup"), (lt, "forward_warmup"), (ws, "backward_warmup"),
                          (lt, "backward_warmup")]
    # the backward's pair follows the head's backward: after the loss's gradient blocks (backward_start region)
    backward_start = held.region_starts[2]
    assert held.alloc_events[backward_start][2] == "backward_start_warmup"
    assert extra[2][0] > backward_start
    # everything else is the plain trace's, in order, and each region starts where it did
    rest = [(n, tag) for i, (_, n, tag) in enumerate(held.alloc_events) if i not in {e[0] for e in extra}]
    assert rest == [(n, tag) for _, n, tag in plain.alloc_events]
    tags = [held.alloc_events[k][2] if k < len(held.alloc_events) else "done" for k in held.region_starts]
    assert tags == [plain.alloc_events[k][2] if k < len(plain.alloc_events) else "done"
                    for k in plain.region_starts]
