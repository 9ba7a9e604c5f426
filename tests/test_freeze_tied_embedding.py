"""Partial training of a model with tied embeddings: the shared tensor's backward (issue 20, off-grid probes).

``--trainable_layers`` with the embedding's name trainable trains the tensor the LM head shares
(``freeze.frozen_layers``: ``head_trained`` when tied). Its backward is the full fine-tune's: the head's weight
gradient exists from the head's backward on, and the embedding's backward makes a second vocab x hidden gradient
that the engine adds to the first (``backward.tied_embedding_backward``). The formula had neither for partial
training: Phi-4-mini (tied, 200064-token vocabulary), 4 layers, top one trained, checkpointed, was -99.7 % at fp32
2 x 640 and -22.1 % at bf16 6 x 2112 during backward against the trace (``benchmarks/pinned_probes.py`` seed 113),
while printing ``pinned: true``. Here Phi-4-mini narrowed to width 256 with a 32768-token vocabulary (so the
vocabulary-sized tensors set the phase), traced on fake tensors; about a second a case.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import narrow_catalog_config

from fitcheck.report import Phase
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, phase_errors
from fitcheck.torch_adapters.tracer import trace_step

BOUND = 0.005


@pytest.mark.parametrize(("precision", "ckpt", "batch", "seq"), [
    ("fp32", True, 1, 64),  # the embedding's backward: head gradient + embedding gradient + their sum
    ("fp32", True, 4, 256),
    ("bf16", True, 6, 256),  # the head's backward: its weight gradient already exists
    ("bf16", False, 2, 128),
])
def test_during_backward_equals_the_trace(precision: str, ckpt: bool, batch: int, seq: int) -> None:
    cfg = narrow_catalog_config("microsoft/Phi-4-mini-instruct", tie_word_embeddings=True)
    cfg.update(vocab_size=32768, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.pop("rope_scaling", None)
    spec = cell_spec(Cell("phi3", "freeze", ckpt, "sdpa", precision, seq, batch), cfg)
    assert spec.model.shape.tied_embeddings
    kw = activation_trace_kwargs(spec)
    errs = phase_errors(spec, components_from_trace(trace_step(spec.model.config, **kw)))
    assert abs(errs[Phase.BACKWARD]) <= BOUND, errs
