"""A formula note that says "not modelled" must say something true (issue 20: pinned = checked at this shape).

- ``backward-not-pinned`` for "LoRA/quantized bases (adapter input casts in the recomputed layer)" was raised for
  LoRA without checkpointing too, where no layer is recomputed; those kinds' range rows (envelope_ranges.json,
  e.g. llama/lora/nockpt/sdpa/fp32 and /eager/fp32: within 0.04 % over 512-32768 tokens, 2 widths) check the
  backward phase, so the answer was never pinned for a reason that does not apply.
- Phi-3 LoRA over a k-bit-prepared 4-bit base was "activations of this quantized base use the LoRA recipe; traces
  differ by up to ~6 %": it is the LoRA recipe with fp32 base outputs (``ActivationMode.fp32_out``), within
  1.7 % over its range rows.
"""

from __future__ import annotations

import pytest

from fitcheck.catalog import find_catalog_config
from fitcheck.core import estimate

pytest.importorskip("torch")  # the grid's specs (cell_spec) live in the torch adapters

from fitcheck.torch_adapters import Cell, cell_spec


def _report(model: str, cell: Cell) -> object:
    found = find_catalog_config(model)
    assert found is not None
    return estimate(cell_spec(cell, dict(found[0])))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_lora_without_checkpointing_is_pinned_inside_its_range(attn: str) -> None:
    report = _report("meta-llama/Llama-3.1-8B", Cell("llama", "lora", False, attn, "fp32", 2048, 2))
    codes = [f.code for f in report.findings]  # type: ignore[attr-defined]
    assert "backward-not-pinned" not in codes
    assert report.pinned is True  # type: ignore[attr-defined]


def test_checkpointed_lora_off_the_traced_layer_keeps_the_note() -> None:
    # Gemma-2 (soft-capped eager softmax) is still "not modelled" where it is not
    report = _report("google/gemma-2-9b", Cell("gemma2", "lora", True, "eager", "bf16", 8192, 1))
    assert report.pinned is False  # type: ignore[attr-defined]


def test_phi3_qlora_autocast_is_pinned() -> None:
    report = _report("microsoft/Phi-3-mini-4k-instruct", Cell("phi3", "qlora", True, "sdpa", "autocast", 1024, 2))
    codes = [f.code for f in report.findings]  # type: ignore[attr-defined]
    assert "activations-not-pinned" not in codes
    assert report.pinned is True  # type: ignore[attr-defined]
