"""Eager attention's working set against fake-tensor traces, at shapes where the s² tensors set the peaks (issue 20).

``transformers`` 5.23 ``eager_attention_forward`` makes (b, a, s, s) scores, an fp32 softmax and its 16-bit cast;
the worst ops are the top layer's forward softmax (10·a or 8·a bytes per score position) and each layer's softmax
backward (12·a), with the (b, 1, s, s) mask held by every checkpointed layer
(``fitcheck.core.activations.eager``). Before it the
formula kept only the saved terms: -4 .. -6·a·s² during backward on these tiny models, -46 .. -85 % at 32k on
Llama-3.1-8B (``benchmarks/envelope_ranges.py --attn eager``). Each case varies the sequence, the micro-batch, the
precision and checkpointing, and checks end of forward and during backward.
"""

from __future__ import annotations

import pytest
from tiny_models import family_config, spec_from_config

from fitcheck.core.activations.decoder import activation_components
from fitcheck.report import Phase
from fitcheck.spec import LoraSpec

pytest.importorskip("transformers")

_WIDTHS = {"hidden_size": 64, "intermediate_size": 172, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "vocab_size": 1000}
_LORA = LoraSpec(r=8, alpha=16, dropout=0.05, target_modules=("all-linear",))

# (family, seq, batch, dtype, autocast, checkpointing, LoRA)
CASES = [
    ("llama", 512, 1, "bfloat16", "no", True, False),
    ("llama", 512, 1, "float32", "bf16", True, False),
    ("qwen2", 448, 1, "bfloat16", "no", True, True),
    ("llama", 512, 1, "float32", "no", False, False),
    ("mistral", 384, 2, "bfloat16", "no", False, False),
]


@pytest.mark.parametrize(("family", "seq", "batch", "dtype", "mp", "ck", "lora"), CASES,
                         ids=[f"{c[0]}-{c[3]}-{c[4]}-{c[2]}x{c[1]}-{'ck' if c[5] else 'nock'}{'-lora' if c[6] else ''}"
                              for c in CASES])
def test_eager_phases_match_trace(family: str, seq: int, batch: int, dtype: str, mp: str, ck: bool,
                                  lora: bool) -> None:
    from fitcheck.torch_adapters.trace_result import OPTSTATE, PARAMS
    from fitcheck.torch_adapters.tracer import trace_step

    cfg = family_config(family, _WIDTHS)
    adapter = _LORA if lora else None
    spec = spec_from_config(cfg, seq=seq, batch=batch, dtype=dtype, mixed=mp, checkpointing=ck, attn="eager",
                            lora=adapter)
    comps = activation_components(spec)
    tr = trace_step(cfg, seq_len=seq, micro_batch=batch, dtype=dtype, mixed_precision=mp,
                    attn_implementation="eager", checkpointing=ck, lora=adapter, optimizer=None)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD):
        br = tr.phases[phase]
        traced = br.total - br.get(PARAMS) - br.get(OPTSTATE) - (tr.final_grads if phase is Phase.BACKWARD else 0)
        formula = sum(c.at(phase) for c in comps)
        assert abs(formula - traced) <= 0.01 * traced, (phase.value, formula, traced)
