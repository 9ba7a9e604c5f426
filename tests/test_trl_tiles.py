"""Issue 20: the SFT step traced without the fused head's repeated token tiles replays as the whole loop.

TRL 1.16's ``ChunkedLogProbFunction`` loops over token tiles of ``TOKEN_CHUNK_SIZE`` rows in forward and backward,
so a trace of the SFT step at a large micro-batch ran thousands of identical tiles op by op (Qwen2.5-0.5B at
1139 x 512: 143 tiles x 5 vocabulary chunks a pass, 57 s of a 1-layer trace; the default answer's boundary replay
took 245 CPU s). ``tracer_trl.repeated_tiles_skipped`` runs the first two or three and the last. Here the tile is
made 64 rows so that a tiny model's step has 13-20 tiles: the replay of the skipped trace equals the whole loop's,
byte for byte, on the CUDA path (where a tile allocates nothing), with fp32 hidden states cast per tile under bf16
autocast, and on the CPU folds (which allocate per tile). The op-count test failed on main (every tile traced).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from tiny_models import WIDE_VOCAB_LLAMA

from fitcheck.torch_adapters.allocator_replay import replay_events
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_trl import kept_token_starts

OUTPUTS = ("log_probs", "entropy", "is_top1")
TILE = 64  # rows per token tile in these tests (trl's TOKEN_CHUNK_SIZE is 4096)
CONFIG = {**WIDE_VOCAB_LLAMA, "vocab_size": 40000}  # two vocabulary chunks of 32768 per token tile


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    from trl.kernels import chunked_logprob as ck

    monkeypatch.setattr(ck, "TOKEN_CHUNK_SIZE", TILE)


def _trace(micro_batch: int, seq_len: int, **kwargs: Any) -> Any:
    step = {"seq_len": seq_len, "micro_batch": micro_batch, "dtype": "bfloat16", "mixed_precision": "bf16",
            "checkpointing": True, "optimizer": None, "steps": 1, "num_layers": 1, "cuda_kernels": True,
            "trl_head": OUTPUTS, **kwargs}
    return trace_step(CONFIG, **step)


def test_kept_token_starts() -> None:
    """The first two or three tiles and the last, an even number of full tiles skipped between."""
    assert kept_token_starts(4096 * 3, 4096) == [0, 4096, 8192]
    assert kept_token_starts(4096 * 4 + 1, 4096) == [0, 4096, 16384]
    assert kept_token_starts(1139 * 511, 4096) == [0, 4096, 581632]  # 143 tiles: 140 skipped
    for tokens in range(1, 40 * 64, 37):
        every = list(range(0, tokens, 64))
        kept = kept_token_starts(tokens, 64)
        assert kept[-1] == every[-1] and kept[:2] == every[:2]
        assert (len(every) - len(kept)) % 2 == 0


@pytest.mark.parametrize(("micro_batch", "seq_len", "settings"), [
    (4, 256, {}),  # CUDA folds, bf16: a tile allocates nothing (16 tiles)
    (4, 200, {"dtype": "float32"}),  # fp32 hidden states and weights cast to bf16 per tile (13 tiles)
    (5, 256, {"dtype": "float32", "cuda_kernels": False}),  # the CPU folds' fp32 tiles (20 tiles, last partial)
])
def test_skipped_tiles_replay_as_the_whole_loop(small_tiles: None, micro_batch: int, seq_len: int,
                                                settings: dict[str, Any]) -> None:
    """The allocator replay of the trace with the repeated tiles skipped equals the whole loop's, byte for byte."""
    skipped = _trace(micro_batch, seq_len, **settings)
    every = _trace(micro_batch, seq_len, skip_tiles=False, **settings)
    assert replay_events([skipped.alloc_events]) == replay_events([every.alloc_events])
    assert {p: b.total for p, b in skipped.phases.items()} == {p: b.total for p, b in every.phases.items()}


def test_traced_tiles_do_not_grow_with_the_micro_batch(small_tiles: None) -> None:
    """At 16 and 64 token tiles a pass, the forward traces the same number of tile products (4 tiles x 2 vocabulary
    chunks; the backward's run inside the autograd engine, which this mode does not see). Main traced every tile:
    32 and 128 products."""
    import torch
    from torch.overrides import TorchFunctionMode

    class MatMuls(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.count += func is torch.mm and "out" in (kwargs or {})
            return func(*args, **(kwargs or {}))

    counts = []
    for micro_batch in (4, 16):
        with MatMuls() as mm:
            _trace(micro_batch, 256)
        counts.append(mm.count)
    assert counts == [8, 8]
