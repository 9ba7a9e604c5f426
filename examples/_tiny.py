"""What the CPU examples share: the tiny Llama config in `tiny-llama/` and a random-token dataset.

Nothing is downloaded: the model is built from `tiny-llama/config.json` with random weights, and the data is
random token ids. Imported by `train_with_callback.py` and `qlora.py` (run them from the repository root).
"""

from __future__ import annotations

import os

import torch

TINY_LLAMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny-llama")
SEQ = 64


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Fixed-length random token sequences (every batch is full length: the worst case fitcheck assumes)."""

    def __init__(self, vocab: int, n: int = 8) -> None:
        self.data = torch.randint(0, vocab, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}
