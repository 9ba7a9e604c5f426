"""DeepSpeed ``offload_optimizer``: what the device holds (``fitcheck/core/states/deepspeed_offload.py``) against the
real deepspeed 0.19.8 engine on CPU, its host-side tensors told apart by identity
(``benchmarks/deepspeed_offload_cpu.py --write`` recorded ``benchmarks/data/deepspeed_offload_cpu.json``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fitcheck.report import Location, Phase

# ZeRO-2/3 reduce the LM head at the final norm's hook with its fp64 norm copy, the logits-side tensors freed
# (deepspeed_offload.offload_grad_norm_component): over by at most this (+0.52 %, -0.00 %, +0.57 % recorded: the final
# norm's own saved input, freed by then, is counted); +2.66 %, +1.51 %, +2.91 % with the copy beside the head's
# moment (session 22).
HEAD_MOMENT_OVER = 0.006


def _recorded() -> dict[str, Any]:
    from benchmarks.deepspeed_offload_cpu import DATA

    return dict(json.loads(DATA.read_text(encoding="utf-8")))


def _device(components: Any) -> dict[Phase, int]:
    return {p: sum(c.at(p) for c in components if c.location is Location.DEVICE) for p in Phase}


@pytest.mark.parametrize("case", ["zero1-offload", "zero1-offload-accum2", "zero2-offload", "zero2-offload-s64",
                                  "zero3-offload", "zero3-offload-accum2"])
def test_the_device_holds_what_the_real_offload_engine_holds(case: str) -> None:
    """Forward within 0.1 % (the staging buffer from initialize on: -12.8 % before); backward within 0.1 % for ZeRO-1
    (every whole ``.grad`` kept on the device until the end-of-backward reduction, with the fp64 norm copy: -48.1 %
    before) and for ZeRO-2/3 within 0.1 % under and :data:`HEAD_MOMENT_OVER` over (no gradient subtracted from the
    device, the fp64 norm copy at the head's reduction and the largest gradient in flight: -39.4 % / -6.0 % / -32.5 %
    before session 22, +2.66 % / +1.51 % / +2.91 % before session 23)."""
    from benchmarks.deepspeed_offload_cpu import CASES, estimate_of

    real = _recorded()[case]
    est = estimate_of(CASES[case])
    assert abs(est["forward"] - real["forward"]) <= 0.001 * real["forward"]
    if CASES[case]["stage"] == 1:
        assert abs(est["backward"] - real["backward"]) <= 0.001 * real["backward"]
    else:
        assert 0.999 * real["backward"] <= est["backward"] <= (1 + HEAD_MOMENT_OVER) * real["backward"]


def test_the_traced_path_reads_an_offloaded_run_as_the_formula_does() -> None:
    """The traced default path holds no gradient on the device either (``run_scope.gradients_resident``): ZeRO-2 +
    offload at 2 x 16 tokens, -5.9 % without the largest gradient in flight, -39 % on main."""
    from benchmarks.deepspeed_offload_cpu import CASES, estimate_of, spec_of
    from fitcheck.torch_adapters import PinnedPath

    real = _recorded()["zero2-offload"]
    tot = _device(PinnedPath("always", cache=None)(spec_of(CASES["zero2-offload"])).components)
    traced = max(tot[Phase.BACKWARD_START], tot[Phase.BACKWARD])
    assert 0.999 * real["backward"] <= traced <= (1 + HEAD_MOMENT_OVER) * real["backward"]
    assert abs(traced - estimate_of(CASES["zero2-offload"])["backward"]) <= 0.001 * real["backward"]
