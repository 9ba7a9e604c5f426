"""The whole-run replay starts from the loading warm-up block, as ``from_pretrained`` leaves the allocator.

transformers 5.23 ``caching_allocator_warmup`` allocates and frees one block of every parameter's bytes before
loading; the weights are carved out of it. The replay used to give each parameter a segment of its own, rounded to
2 MiB (``get_allocation_size``): Phi-2's 128 attention weights of 12.5 MiB took 14 MiB each, 190 MiB above the 5304
MiB the H200 measured after loading (``benchmarks/data/gpu_truth_nvidia_h200.json``). Fails on the code before
(no ``replay_step_args.load_warmup``).
"""

from __future__ import annotations

from fitcheck.cli.estimate import spec_from_values
from fitcheck.core.caching import CachingAllocator
from fitcheck.core.loading.events import warmup_bytes
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.replay_step_args import load_warmup

MIB = 1024**2
RUN = {"model_name_or_path": "meta-llama/Llama-3.2-1B", "dtype": "bfloat16", "gpu": "H100",
       "per_device_train_batch_size": 2, "max_seq_length": 512}


def _spec(**extra: object) -> TrainingSpec:
    return spec_from_values({**RUN, **extra}, env={})[0]


def test_parameters_carved_out_of_the_block_take_one_segment() -> None:
    """``get_allocation_size``: a 12.5 MiB request gets a 14 MiB segment of its own; out of a cached block of all
    the bytes (``get_free_block`` best fit, ``should_split``) four of them take one 50 MiB segment."""
    alone, carved = CachingAllocator(), CachingAllocator()
    carved.malloc(99, 50 * MIB)
    carved.free(99)
    for h in range(4):
        alone.malloc(h, 12 * MIB + MIB // 2)
        carved.malloc(h, 12 * MIB + MIB // 2)
    assert alone.stats.reserved == 4 * 14 * MIB
    assert carved.stats.reserved == 50 * MIB


def test_the_replay_warmup_is_the_load_phases_block() -> None:
    block = warmup_bytes(_spec(), _spec().hardware.gpu_memory_bytes)
    assert block > 0
    assert load_warmup(_spec()) == [(-1, block, "setup"), (-1, -block, "setup")]
    # where the load is not a one-device from_pretrained of resident weights, or the block stays oversize
    assert load_warmup(_spec(num_processes=2)) == []  # DDP: loaded with device_map=None, no warm-up
    assert load_warmup(_spec(load_in_4bit=True, bnb_4bit_quant_type="nf4")) == []  # quantized on load
    assert load_warmup(_spec(cuda_alloc_conf="max_split_size_mb:128")) == []  # LoadPhase.oversize_cached adds it
    assert load_warmup(_spec(device_type="cpu")) == []
