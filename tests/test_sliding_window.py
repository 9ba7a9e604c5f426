"""Mistral-style sliding-window attention from the window on: not modelled, so never pinned (issue 20).

transformers 5.23 ``masking_utils._ignore_causal_mask_sdpa`` lets SDPA use ``is_causal`` (no mask) only while the
sequence is shorter than ``sliding_window``; from the window on it materialises the banded mask and every layer's
SDPA runs with it. The formula does not count that (Mistral-7B-v0.1, window 4096: -15.6 % during backward at
1 x 4096, full fine-tune with checkpointing), so ``recipe_gaps.sliding_window_findings`` says so and the answer is
not pinned. Here a Mistral-7B-v0.1 config narrowed to h 256 / I 688, 2 layers, a window of 128, traced on fake
tensors one token below the window (exact) and at it (off by far more than 2 %).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import narrow_catalog_config

from fitcheck.core import estimate
from fitcheck.report import Phase
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, phase_errors
from fitcheck.torch_adapters.tracer import trace_step

WINDOW = 128


def _narrow_mistral() -> dict[str, Any]:
    return narrow_catalog_config("mistralai/Mistral-7B-v0.1", sliding_window=WINDOW)


def _not_pinned_notes(spec: Any) -> list[str]:
    return [f.message for f in estimate(spec).findings if f.code == "activations-not-pinned"]


@pytest.mark.parametrize(("batch", "seq", "inside"), [
    (2, WINDOW - 1, True), (1, WINDOW, False), (2, 4 * WINDOW, False),
])
def test_banded_mask_is_not_pinned(batch: int, seq: int, inside: bool) -> None:
    cfg = _narrow_mistral()
    spec = cell_spec(Cell("mistral", "full", True, "sdpa", "bf16", seq, batch), cfg)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    errs = phase_errors(spec, components_from_trace(trace_step(cfg, num_layers=2, **kw)))
    notes = [n for n in _not_pinned_notes(spec) if "sliding-window" in n]
    report = estimate(spec)
    if inside:
        assert abs(errs[Phase.BACKWARD]) <= 0.005, errs
        assert not notes
    else:
        assert abs(errs[Phase.BACKWARD]) > 0.02, errs  # what the finding is for
        assert notes, report.findings
        assert report.pinned is False


def test_no_note_without_a_window_or_under_eager() -> None:
    cfg = _narrow_mistral()
    cfg.pop("sliding_window")
    cfg["sliding_window"] = None
    spec = cell_spec(Cell("mistral", "full", True, "sdpa", "bf16", 4 * WINDOW, 1), cfg)
    assert not [n for n in _not_pinned_notes(spec) if "sliding-window" in n]
    eager = cell_spec(Cell("mistral", "full", True, "eager", "bf16", 4 * WINDOW, 1), _narrow_mistral())
    assert not [n for n in _not_pinned_notes(eager) if "sliding-window" in n]
