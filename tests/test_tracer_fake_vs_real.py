"""The fake-tensor trace equals a real CPU step, byte for byte, and each fake-vs-real fix is needed.

Real side: the same live-tensor recorder on real CPU tensors (``trace_step(fake=False)``).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fitcheck.report import PHASES, Phase
from fitcheck.spec import LoraSpec
from fitcheck.torch_adapters import tracer_patches
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_depth import extrapolate

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 344,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 500,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}
ARGS: dict[str, Any] = {"seq_len": 64, "micro_batch": 2, "dtype": "float32"}


def _totals(r: Any) -> dict[Phase, int]:
    return {p: b.total for p, b in r.phases.items()}


@pytest.mark.parametrize(
    "extra",
    [{}, {"checkpointing": True}, {"lora": LoraSpec(r=4, target_modules=("q_proj", "v_proj"))},
     {"dtype": "bfloat16", "attn_implementation": "eager"}, {"mixed_precision": "bf16"}],
)
def test_fake_equals_real_every_phase(extra: dict[str, Any]) -> None:
    args = {**ARGS, **extra}
    fake = trace_step(TINY, fake=True, **args)
    real = trace_step(TINY, fake=False, **args)
    assert _totals(fake) == _totals(real)
    assert fake.final_grads == real.final_grads


def test_packed_sequence_fix_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without fix 1, fake mode builds a mask and expands K/V that the real step never does."""
    import contextlib

    real = trace_step(TINY, fake=False, checkpointing=True, **ARGS)
    monkeypatch.setattr(tracer_patches, "unpacked_sequences", contextlib.nullcontext)
    unfixed = trace_step(TINY, fake=True, checkpointing=True, **ARGS)
    assert unfixed.peak != real.peak


def test_module_to_fix_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without fix 2, peft's adapter .to() on fake parameters fails while building."""
    import contextlib

    monkeypatch.setattr(tracer_patches, "module_to_is_noop", contextlib.nullcontext)
    with pytest.raises(Exception):  # noqa: B017 - torch raises RuntimeError("Couldn't swap ...") here
        trace_step(TINY, fake=True, lora=LoraSpec(r=4, target_modules=("q_proj",)), **ARGS)


def test_depth_extrapolation_is_exact() -> None:
    cfg = dict(TINY, num_hidden_layers=4)
    full = trace_step(cfg, **ARGS)
    one = trace_step(cfg, num_layers=1, **ARGS)
    two = trace_step(cfg, num_layers=2, **ARGS)
    ext = extrapolate(one, two, 4, 4)
    for p in PHASES:  # the training-step phases the tracer records (not generation/evaluation)
        assert abs(ext.phases[p].total - full.phases[p].total) <= 64
