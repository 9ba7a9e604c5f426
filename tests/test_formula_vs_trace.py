"""The checked envelope holds: sampled grid cells at real widths, formula vs fake-tensor trace within 2 %.

``benchmarks/formula_vs_trace.py`` runs the whole grid (every catalog family × method × checkpointing ×
attention × precision) and its result is ``fitcheck.core.activations.CHECKED``; these tests re-run a few cells
of it, among them the issue-10 regressions (QLoRA without checkpointing under autocast, partial freezing).
"""

from __future__ import annotations

import pytest

from fitcheck.core.activations import CHECKED, envelope_key
from fitcheck.torch_adapters.differential import Cell, cell_spec, compare, grid

pytest.importorskip("transformers")

REGRESSIONS = [
    # QLoRA without checkpointing under bf16 autocast: the backward head moment held L x 16-bit casts of the
    # 4-bit weights (+104 % on Llama-3-8B before the fix)
    Cell("llama", "qlora", False, "sdpa", "autocast", 256, 1),
    Cell("llama", "qlora", False, "eager", "bf16", 512, 1),
    # partial freezing: frozen layers save only what input gradients need
    Cell("llama", "freeze", False, "sdpa", "bf16", 256, 2),
    Cell("qwen2", "freeze", True, "eager", "autocast", 256, 1),
    # full fine-tune under autocast with checkpointing: no weight cast survives into backward
    Cell("mistral", "full", True, "sdpa", "autocast", 128, 1),
]
# issue 12: OLMo-2 (full-width q/k norms, post-norms; the embedding-output cast autocast caches under LoRA +
# checkpointing) and gpt-oss (sinks, clamped-SwiGLU grouped_mm experts, two eager masks under checkpointing)
RECENT = [
    Cell("olmo2", "lora", False, "sdpa", "bf16", 512, 1),
    Cell("olmo2", "full", True, "eager", "autocast", 256, 1),
    Cell("olmo2", "lora", True, "eager", "autocast", 256, 1),
    Cell("gpt_oss", "full", False, "sdpa", "bf16", 256, 1),
    Cell("gpt_oss", "lora", True, "eager", "bf16", 512, 1),
]


def _sampled() -> list[Cell]:
    """Every 37th cell of the grid that the envelope claims (deterministic, a few per run)."""
    cells = [c for c in grid() if envelope_key(cell_spec(c)) in CHECKED]
    return cells[::37]


@pytest.mark.parametrize("cell", REGRESSIONS + RECENT + _sampled(), ids=lambda c: c.label)
def test_formula_within_two_percent_of_trace(cell: Cell) -> None:
    out = compare(cell)
    assert not out.refused, out.refused
    assert abs(out.error) <= 0.02, (cell.label, {p.value: (out.formula[p], out.trace[p]) for p in out.formula})


def test_regression_cells_are_in_the_envelope() -> None:
    for cell in REGRESSIONS + RECENT:
        assert envelope_key(cell_spec(cell)) in CHECKED, cell.label
