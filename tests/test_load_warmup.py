"""transformers' ``caching_allocator_warmup`` in the load phase, and what ``max_split_size_mb`` makes of its block.

transformers 5.23 ``modeling_utils.py`` ``caching_allocator_warmup``: before loading onto a ``device_map``, one fp16
tensor of every parameter's bytes (tied weights once, ``get_total_byte_count``) is allocated and freed; the weights
are then carved out of that cached block. With ``max_split_size_mb`` below its size the block is oversize: no
weight may take it (``CUDACachingAllocator.cpp`` ``get_free_block``) and it stays reserved. Before this, the load
phase had no warm-up: every test here fails on that code (no ``warmup_bytes``, no ``LoadPhase.oversize_cached``;
the H200's 4718 MiB after loading Llama-3.2-1B with ``max_split_size_mb:128`` was estimated at 2360 MiB).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.cli.estimate import spec_from_values
from fitcheck.core import estimate
from fitcheck.core.loading import load_phase
from fitcheck.core.loading.events import warmup_bytes
from fitcheck.spec import TrainingSpec

MIB = 1024**2
RUN = {"model_name_or_path": "meta-llama/Llama-3.2-1B", "dtype": "bfloat16", "gpu": "H100",
       "per_device_train_batch_size": 2, "max_seq_length": 512}


def _spec(**extra: object) -> TrainingSpec:
    return spec_from_values({**RUN, **extra}, env={})[0]


def test_warmup_block_is_every_parameter_once() -> None:
    spec = _spec()
    assert spec.model.shape.tied_embeddings
    assert warmup_bytes(spec) == 2 * spec.model.total_params  # bf16, the tied head not counted again
    nf4 = _spec(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    assert warmup_bytes(nf4) < warmup_bytes(spec) // 2  # quantized linear weights at 0.5 byte per element
    assert warmup_bytes(_spec(num_processes=2)) == 0  # DDP: TRL loads with device_map=None, no warm-up


def test_weights_are_carved_out_of_the_warmup_block() -> None:
    lp = load_phase(_spec())
    assert lp is not None and lp.oversize_cached == 0
    # one segment of the block (rounded to 2 MiB) plus the small pool's 2 MiB segment for the norms
    assert lp.peak_reserved == -(-warmup_bytes(_spec()) // (2 * MIB)) * 2 * MIB + 2 * MIB


def test_max_split_size_keeps_the_warmup_block_beside_the_weights() -> None:
    plain, split = _spec(), _spec(cuda_alloc_conf="max_split_size_mb:128")
    lp, lp_split = load_phase(plain), load_phase(split)
    assert lp is not None and lp_split is not None
    block = -(-warmup_bytes(plain) // (2 * MIB)) * 2 * MIB
    assert lp_split.oversize_cached == block
    assert lp_split.peak_reserved >= lp.peak_reserved + block - 4 * MIB
    # the step's segments come on top of the cached block while every cudaMalloc succeeds
    assert estimate(split).peak_reserved_bytes == estimate(plain).peak_reserved_bytes + block


def test_above_the_gpu_the_oversize_block_is_released_first() -> None:
    split = _spec(cuda_alloc_conf="max_split_size_mb:128")
    plain = _spec()
    need = estimate(plain).device_used_bytes
    tight = replace(split, hardware=replace(split.hardware, gpu_memory_bytes=need + 64 * MIB))
    report = estimate(tight)
    assert report.fits and report.peak_reserved_bytes == estimate(plain).peak_reserved_bytes
