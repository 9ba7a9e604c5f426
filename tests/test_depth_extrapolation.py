"""The tracer's depth extrapolation (one and two layer groups -> the model's depth) against a full-depth trace.

A phase's peak is the largest of several moments, each affine in the depth; the moment that wins at one or two
layers need not win at 32. Llama-3.1-8B full fine-tune with checkpointing at 8 x 4096: at 1 and 2 layers the
during-backward peak is the LM head's (fp32 logits and their gradient alive, few gradients yet); at 32 layers it
is the bottom recomputed layer's, with every other layer's gradient alive. The old extrapolation drew one line
through the head moments and was 4 GB (10 %) under the 32-layer trace there; the formula agreed with the full
trace all along (the range grid's "during backward +129 %" was the extrapolation's error, not the formula's).
Fake tensors at real width: about 10 s.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fitcheck.catalog import find_catalog_config
from fitcheck.report import Phase
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_depth import combine_depths, depth_plan


@pytest.mark.parametrize(("method", "batch"), [("full", 8), ("full", 1), ("lora", 8)])
def test_extrapolated_depth_equals_the_full_depth_trace(method: str, batch: int) -> None:
    found = find_catalog_config("meta-llama/Llama-3.1-8B")
    assert found is not None
    config: dict[str, Any] = dict(found[0])
    spec = cell_spec(Cell("llama", method, True, "sdpa", "bf16", 4096, batch), config)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k not in ("micro_batch", "num_layers")}
    plan = depth_plan(config, kw.get("freeze"))
    assert plan == (1, 2)
    extrapolated = combine_depths(config, tuple(trace_step(config, num_layers=n, micro_batch=batch, **kw)
                                                for n in plan))
    full = trace_step(config, num_layers=config["num_hidden_layers"], micro_batch=batch, **kw)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD):
        assert extrapolated.phases[phase].total == full.phases[phase].total, phase


def test_a_moment_that_wins_only_deeper_is_extrapolated_on_its_own_line() -> None:
    """Mistral-Small-24B at 1/16 of its width and 1/4 of its 1792 tokens (full fine-tune, eager, bf16, no
    checkpointing, 1 x 448): during backward, after the LM head's moment, the one-layer trace's peak is the end of
    backward (every gradient, the embedding's too) and the two-layer trace's the top layer's softmax backward. A line
    through those two different moments falls under the top layer's own line, and the head's line won at 4 layers:
    6.39 MiB under the 4-layer trace (at the real width, 40 layers, 1 x 1792: 538 MiB, s19-probes). Each moment
    extrapolated on its own line is exact."""
    found = find_catalog_config("mistralai/Mistral-Small-24B-Instruct-2501")
    assert found is not None
    config: dict[str, Any] = dict(found[0], hidden_size=1280, intermediate_size=8192, num_attention_heads=32,
                                  num_key_value_heads=8, head_dim=32, vocab_size=32768, num_hidden_layers=4)
    spec = cell_spec(Cell("mistral", "full", False, "eager", "bf16", 448, 1), config)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    plan = depth_plan(config, kw.get("freeze"))
    assert plan == (1, 2)
    extrapolated = combine_depths(config, tuple(trace_step(config, num_layers=n, **kw) for n in plan))
    full = trace_step(config, num_layers=4, **kw)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD):
        assert extrapolated.phases[phase] == full.phases[phase], phase
