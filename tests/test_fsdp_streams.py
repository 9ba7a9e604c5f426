"""FSDP's side-stream pools (core/states/fsdp_streams.py): the torch source they rest on, the real FSDP2 gradient
layout on CPU, and what they add to reserved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fitcheck.core import estimate
from fitcheck.core.caching import AllocatorConf
from fitcheck.core.states import fsdp_side_pools
from fitcheck.readers.model_config import load_inventory
from fitcheck.spec import (
    BatchSpec,
    DeviceType,
    FsdpSpec,
    HardwareSpec,
    MixedPrecision,
    PrecisionSpec,
    ShardingSpec,
    Strategy,
    TrainingSpec,
)
from fitcheck.spec.model import Dtype

torch = pytest.importorskip("torch")


def _fsdp_spec(version: int = 2, processes: int = 1, **fsdp: object) -> TrainingSpec:
    return TrainingSpec(
        model=load_inventory("meta-llama/Llama-3.2-1B", env={}),
        batch=BatchSpec(micro_batch=4, seq_len=1024),
        precision=PrecisionSpec(load_dtype=Dtype.BFLOAT16, mixed_precision=MixedPrecision.BF16),
        sharding=ShardingSpec(strategy=Strategy.FSDP, fsdp=FsdpSpec(version=version, **fsdp),  # type: ignore[arg-type]
                              num_processes=processes),
        hardware=HardwareSpec(device_type=DeviceType.CUDA),
    )


def _source(rel: str) -> str:
    return (Path(torch.__file__).parent / rel).read_text(encoding="utf-8")


def test_the_torch_source_allocates_where_the_pools_say() -> None:
    """The installed torch allocates FSDP2's gather casts/outputs in the copy-in stream and the reduce output and its
    cast (the sharded gradients) in the reduce-scatter stream; FSDP1 casts gradients in the post-backward stream."""
    coll = _source("distributed/fsdp/_fully_shard/_fsdp_collectives.py")
    gather = coll[coll.index("def foreach_all_gather("):coll.index("def _get_param_all_gather_inputs(")]
    assert gather.index("with device_handle.stream(all_gather_copy_in_stream):") < gather.index(
        "_get_param_all_gather_inputs(fsdp_params)") < gather.index("all_gather_output = all_gather_comm.allocate(")
    assert "all_gather_stream.wait_stream(all_gather_copy_in_stream)" in gather
    reduce = coll[coll.index("def foreach_reduce("):coll.index("def foreach_reduce_scatter_copy_in(")]
    assert reduce.index("with device_handle.stream(reduce_scatter_stream):") < reduce.index(
        "reduce_output = reduce_scatter_comm.allocate(")
    assert reduce.index("with device_handle.stream(post_reduce_stream):") < reduce.index(
        "reduce_output = _to_dtype_if_needed(reduce_output, orig_dtype)") < reduce.index(
        "new_sharded_grad = torch.as_strided(")
    assert "post_reduce_stream = reduce_scatter_stream" in reduce
    runtime = _source("distributed/fsdp/_runtime_utils.py")
    hook = runtime[runtime.index("def _post_backward_hook("):runtime.index("def _post_backward_reshard_only_hook(")]
    assert hook.index("with state._device_handle.stream(state._post_backward_stream):") < hook.index(
        "_reduce_grad_no_shard(state, handle)")
    assert "new_sharded_grad = torch.empty_like(chunks[0])" in runtime
    # the allocator hands a freed block only to requests of its own stream
    # (c10/cuda/CUDACachingAllocator.cpp is not shipped with the wheel: the Python API documents it)
    assert "stream" in _source("cuda/memory.py")


_FSDP2_CPU = r"""
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True)
model = LlamaForCausalLM(cfg).float()
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)  # accelerate 1.15, bf16
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp)
fully_shard(model, mp_policy=mp)
ids = torch.randint(0, 256, (2, 16))
model(input_ids=ids, labels=ids).loss.backward()
out = []
for layer in model.model.layers:
    grads = [p.grad._local_tensor for p in layer.parameters()]
    out.append({"storages": len({g.untyped_storage().data_ptr() for g in grads}),
                "storage_bytes": grads[0].untyped_storage().nbytes(),
                "numel": sum(p.numel() for p in layer.parameters()),
                "dtype": str(grads[0].dtype)})
print("RESULT " + json.dumps(out))
dist.destroy_process_group()
"""


def test_real_fsdp2_keeps_each_units_gradients_in_one_reduce_allocation(free_port: int) -> None:
    """torch's FSDP2 (CPU, gloo, one rank, accelerate's bf16 MixedPrecisionPolicy): every gradient of a layer unit
    is a view of one fp32 storage of the unit's size: the cast of the reduce output, one block per unit in the
    reduce stream, as the pool replay allocates it."""
    port = free_port
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    done = subprocess.run([sys.executable, "-c", _FSDP2_CPU], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    units = json.loads(line[len("RESULT "):])
    assert len(units) == 2
    for u in units:
        assert u["storages"] == 1 and u["dtype"] == "torch.float32"
        assert u["storage_bytes"] == u["numel"] * 4


def test_fsdp2_reserved_holds_the_sharded_gradients_beside_the_activations() -> None:
    """At the step's peak (start of backward, no gradients yet) the reduce stream still caches last step's fp32
    sharded gradients: reserved - allocated is at least their size (before: the 2-group gap alone, 1.4 GiB)."""
    spec = _fsdp_spec()
    side = fsdp_side_pools(spec, AllocatorConf())
    assert side is not None
    grads = spec.model.total_params * 4  # every parameter trained, fp32 after accelerate's upcast
    assert side.reduce >= grads
    report = estimate(spec)
    assert report.peak_reserved_bytes - report.peak_allocated_bytes >= grads
    assert any(f.code == "fsdp-side-streams" for f in report.findings)


def test_pools_follow_the_setup() -> None:
    """No pools on the CPU or without FSDP; offloaded gradients leave the reduce stream; more ranks shard the
    gradients; FSDP1 NO_SHARD at one process has no gather stream without mixed precision."""
    spec = _fsdp_spec()
    base = fsdp_side_pools(spec, AllocatorConf())
    assert base is not None
    assert fsdp_side_pools(replace(spec, hardware=HardwareSpec(device_type=DeviceType.CPU)), AllocatorConf()) is None
    assert fsdp_side_pools(replace(spec, sharding=ShardingSpec()), AllocatorConf()) is None
    off = fsdp_side_pools(_fsdp_spec(offload_params=True), AllocatorConf())
    assert off is not None and off.reduce < base.reduce / 2  # one unit at a time (the tail: 1.6 GB)
    eight = fsdp_side_pools(_fsdp_spec(processes=8), AllocatorConf())
    assert eight is not None and eight.reduce < base.reduce / 4
    fp32 = replace(_fsdp_spec(version=1), precision=PrecisionSpec(load_dtype=Dtype.FLOAT32))
    v1 = fsdp_side_pools(fp32, AllocatorConf())
    assert v1 is not None and v1.gather == 0 and v1.reduce == 0


def test_above_the_gpu_the_side_pools_are_released_not_an_oom() -> None:
    """Where the side pools alone push the run over the GPU, torch releases their free segments and retries
    (release_cached_blocks): the run fits, with a WARNING; below what the step itself needs it does not fit."""
    roomy = estimate(_fsdp_spec())
    assert roomy.fits
    tight = estimate(replace(_fsdp_spec(), hardware=HardwareSpec(device_type=DeviceType.CUDA,
                                                                 gpu_memory_bytes=roomy.device_used_bytes - 1)))
    assert tight.fits and tight.device_used_bytes < roomy.device_used_bytes
    (note,) = [f for f in tight.findings if f.code == "fsdp-side-streams"]
    assert note.severity.value == "warning" and "release_cached_blocks" in note.message
    short = estimate(replace(_fsdp_spec(), hardware=HardwareSpec(device_type=DeviceType.CUDA,
                                                                 gpu_memory_bytes=roomy.peak_allocated_bytes)))
    assert not short.fits
