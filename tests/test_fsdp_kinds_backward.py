"""FSDP's backward moments of the runs s22 left on the old formula -- LoRA, QLoRA (FSDP1), a tied-embedding full
fine-tune and SHARD_GRAD_OP -- against the real ``transformers.Trainer`` under accelerate's FSDP1 / FSDP2 on 1 and 2
gloo ranks (tiny Llama, 32 and 128 tokens, with and without accumulation), recorded by
``benchmarks/fsdp_kinds_cpu.py`` in ``benchmarks/data/fsdp_kinds_cpu.json``. Formula only (no trace): 0.02 s a
case."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fitcheck.core import estimate
from fitcheck.report import Location, Phase

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

# (engine, micro-step, accumulation it is estimated at): micro-step 2 of an accumulation window, and the first
# micro-step of a run that reduces in it (one FSDP1 process, sync_each_batch) as a step without accumulation
_CASES = [(f"{kind}-{engine}", micro, accum) for kind in ("lora", "qlora", "tied")
          for engine, micro, accum in (("fsdp1", "micro1", 1), ("fsdp1", "micro2", 2), ("fsdp1-2ranks", "micro2", 2),
                                       ("fsdp1-2ranks-sync", "micro1", 1), ("fsdp2", "micro2", 2),
                                       ("fsdp2-sync", "micro1", 1), ("fsdp2-2ranks", "micro2", 2),
                                       ("fsdp2-2ranks-sync", "micro1", 1))
          if not (kind == "qlora" and "fsdp2" in engine)]  # FSDP2 QLoRA: bf16 adapters, not the plain Trainer's
# fsdp="shard_grad_op auto_wrap" on 2 ranks: FSDP2 reshard_after_forward=False; FSDP1 runs FULL_SHARD (accelerate 1.15)
_CASES += [(f"sgo-{engine}", micro, accum) for engine, micro, accum in (
    ("fsdp1-2ranks", "micro2", 2), ("fsdp1-2ranks-sync", "micro1", 1), ("fsdp2-2ranks", "micro2", 2),
    ("fsdp2-2ranks-sync", "micro1", 1), ("fsdp2-2ranks-sync", "micro2", 2))]
# below the record during backward, not modelled: the final norm's fp32 backward with every layer's activations alive
# (the LoRA / QLoRA runs' layers-region peak at this vocabulary / width, -0.9 .. -2.0 %)
_UNDER = 0.025
_OVER = 0.015
# two gloo ranks at 32 tokens: the record moves by a few percent between runs (gloo's collectives finish on their own
# thread and the frees follow them; tied-fsdp2-2ranks-sync's layers peak 4,899,974 B recorded, 4,604,550 B rerun), as
# test_accumulation_rule's -5 %; FSDP2 tied at the end of an accumulation window over by +2.1 % on one rank (+3.9 % on
# two): the bottom layer's moment counts the top layer's reduce_scatter_input beside layer 0's held .grad, not resolved
_NOISY = (0.08, 0.045)
_OVER_TIED_WINDOW = 0.025


@cache
def _rows() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "benchmarks" / "data" / "fsdp_kinds_cpu.json").read_text("utf-8"))
    return data["rows"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("seq", [32, 128])
@pytest.mark.parametrize(("engine", "micro", "accum"), _CASES)
def test_fsdp_kinds_backward_is_the_real_trainers(engine: str, micro: str, accum: int, seq: int) -> None:
    """Start of backward within 0.5 % and during backward (the LM head's and the layers' backward) within
    -2.5 / +1.5 % (two ranks at 32 tokens: -8 / +4.5 %). Before (main at session 23): start of backward LoRA FSDP1
    one process +8 .. +20 % (a root copy FSDP1 never makes of bf16 units), LoRA FSDP2 +4.5 .. +7 % and QLoRA FSDP1
    +0.6 .. +2.2 % (adapter weight casts FSDP's 16-bit copies make unnecessary); during backward LoRA +4.7 .. +38 %
    (a layer unit and its gradients at the head's moment), tied +4 .. +16 % (the old formula's unit gradients and
    buffers); SHARD_GRAD_OP: FSDP1 start +5 .. +11 % (accelerate 1.15 runs FULL_SHARD), FSDP2 start -3.8 % (the
    embedding's unit kept gathered), during +3.4 .. +4.8 %."""
    from accumulation_engines_cpu import during_peak
    from fsdp_kinds_cpu import spec_of

    m = _rows()[f"{engine} {seq}"][micro]
    rep = estimate(spec_of(engine, seq, accum))
    est = {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}
    assert abs(est[Phase.BACKWARD_START] - m["start_peak"]) <= 0.005 * m["start_peak"]
    real = during_peak(m)
    under, over = _NOISY if "2ranks" in engine and seq == 32 else (
        _UNDER, _OVER_TIED_WINDOW if engine == "tied-fsdp2" else _OVER)
    assert -under * real <= est[Phase.BACKWARD] - real <= over * real
