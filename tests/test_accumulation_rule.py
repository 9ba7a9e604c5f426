"""Gradient accumulation's one rule (``fitcheck/core/states/accumulation.py``) against the real engines.

``benchmarks/accumulation_engines_cpu.py --write`` recorded, on CPU gloo with the real DDP, DeepSpeed 0.19.8 engine
and transformers 5.23 Trainer under accelerate 1.15's FSDP1 / FSDP2, which ``.grad`` each leaf holds when micro-step
2's new gradient arrives (``benchmarks/data/accumulation_engines_cpu.json``); the rule, the traced path's use of it
and the formula's gradients between micro-steps are checked against those records, and one engine runs live.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.core import estimate
from fitcheck.core.states import accumulates_in_grad
from fitcheck.report import Location, Phase

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "data" / "accumulation_engines_cpu.json"


def _rows() -> dict[str, Any]:
    rows: dict[str, Any] = json.loads(RECORDED.read_text(encoding="utf-8"))["rows"]
    return rows


@pytest.mark.parametrize("key", sorted(_rows()))
def test_the_rule_is_what_the_real_engines_hold(key: str) -> None:
    """Where the rule says a later micro-step adds into ``.grad``, every leaf held one when its new gradient came;
    elsewhere none did (ZeRO-2/3, FSDP with ``sync_each_batch``); the first micro-step held none anywhere. The traced
    path follows the rule but for FSDP1 and ZeRO-1 with ``overlap_comm``, which it says it cannot show."""
    from benchmarks.accumulation_engines_cpu import spec_of
    from fitcheck.torch_adapters.run_scope import accumulates_in_grad as traced_accumulates
    from fitcheck.torch_adapters.run_scope import accumulation_not_traced

    engine, seq = key.split()
    row = _rows()[key]
    spec = spec_of(engine, int(seq))
    held, leaves = row["micro2"]["held"], row["micro2"]["leaves"]
    assert row["micro1"]["held"] == 0 and leaves > 0
    assert held == (leaves if accumulates_in_grad(spec) else 0)
    declined = engine.startswith("fsdp1") or engine == "zero1-overlap"
    assert bool(accumulation_not_traced(spec)) == (declined and accumulates_in_grad(spec))
    assert traced_accumulates(spec) == (accumulates_in_grad(spec) and not declined)
    if held:  # what is held: the module's bf16 gradients, whole; FSDP1 on one process its reduced fp32 one
        assert row["micro2"]["whole"] == held
        assert row["micro2"]["held_dtypes"] == (["float32"] if engine == "fsdp1" else ["bfloat16"])


@pytest.mark.parametrize("engine", ["zero1", "zero1-overlap", "zero3", "fsdp2", "fsdp1-2ranks"])
def test_the_formula_counts_the_gradients_held_between_micro_steps(engine: str) -> None:
    """Micro-step 2's end of forward minus micro-step 1's (the same forward, after ``zero_grad``) is what the
    earlier micro-step left: the formula's end of forward with accumulation 2 minus with 1 (ZeRO-3: nothing, its
    flat partition buffer is resident; the others: every bf16 ``.grad``; ZeRO-1 also its ipg bucket(s), which only
    the boundary's epilogue releases: main left out 40,000 / 80,000 B, -0.39 % / -0.77 % of the forward), within
    0.01 % of the forward; a DeepSpeed engine's start of backward in micro-step 2 too (main: ZeRO-1 -0.38 %, with
    ``overlap_comm`` -0.76 %)."""
    from dataclasses import replace

    from benchmarks.accumulation_engines_cpu import spec_of

    row = _rows()[f"{engine} 32"]
    real = row["micro2"]["forward_peak"] - row["micro1"]["forward_peak"]
    spec = spec_of(engine, 32)

    def forward(s: Any) -> int:
        return sum(c.at(Phase.FORWARD_END) for c in estimate(s).components if c.location is Location.DEVICE)

    est = forward(spec) - forward(replace(spec, batch=replace(spec.batch, grad_accum=1)))
    assert abs(est - real) <= 1e-4 * row["micro2"]["forward_peak"]
    if engine.startswith("zero"):
        start = sum(c.at(Phase.BACKWARD_START) for c in estimate(spec).components if c.location is Location.DEVICE)
        assert abs(start - row["micro2"]["start_peak"]) <= 1e-4 * row["micro2"]["start_peak"]


@pytest.mark.parametrize("seq", [32, 128])
def test_zero3_backward_holds_its_resident_gradient_buffer_in_every_micro_step(seq: int) -> None:
    """ZeRO-3's flat gradient buffer exists before any gradient is made, in micro-step 1 as in 2 (the real engine's
    are equal byte for byte): no moment of backward subtracts gradients "not made yet" (main: -8.2 % / -6.8 % of
    the real engine's head moment in micro-step 1 and in runs without accumulation, +2.6 % / +2.1 % in micro-step 2).
    The formula's backward phase, the largest of its moments, is the head's: equal within 0.01 % to the recorded
    live bytes right after the head's weight gradient is made, with accumulation 1 and 2; so is the traced default
    path's at 32 tokens (``trace_result.resident_gradients_step``; main -9.1 % of the layers' peak)."""
    from dataclasses import replace

    from benchmarks.accumulation_engines_cpu import spec_of

    row = _rows()[f"zero3 {seq}"]
    assert row["micro1"] == row["micro2"]
    real = row["micro1"]["head_peak"]  # the LM head's backward region
    assert real > row["micro1"]["layers_peak"] - 262_144  # gloo's copy of the head gradient: see the benchmark

    def phases(rep: Any) -> dict[Phase, int]:
        return {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}

    for accum in (1, 2):
        spec = spec_of("zero3", seq)
        spec = replace(spec, batch=replace(spec.batch, grad_accum=accum))
        tot = phases(estimate(spec))
        assert abs(tot[Phase.BACKWARD] - real) <= 1e-4 * real
        assert abs(tot[Phase.BACKWARD_START] - row["micro1"]["start_peak"]) <= 1e-4 * real
    if seq == 32:
        from fitcheck.torch_adapters import PinnedPath

        traced = phases(PinnedPath("always", cache=None)(replace(spec, batch=replace(spec.batch, grad_accum=1))))
        assert abs(traced[Phase.BACKWARD] - real) <= 1e-4 * real


@pytest.mark.parametrize("case", ["zero1-overlap-8-ranks-accum2", "zero3-tied-accum2"])
def test_recorded_deepspeed_accumulation_cases(case: str) -> None:
    """The real engine's recorded peaks (``accumulation_engines_cpu.py --write-cases``), the largest micro-step's,
    within 0.1 %: ZeRO-1 with ``overlap_comm`` on 8 ranks holds every whole ``.grad`` and its two ipg buckets until
    the boundary, whose reduction of the head at the final norm's hook holds no new head gradient (session 21:
    forward -1.73 %, backward +3.60 %; session 20: forward -27.4 %); a tied ZeRO-3 run adds nothing into a held
    ``.grad`` (its gradients go to the resident flat buffer), so no accumulation temporaries (session 20: backward
    +6.4 %). The boundary's optimizer step (one flat fp32 tensor per group, ``layout.zero_flat_groups``: -10.30 %
    before session 22 for the tied ZeRO-3 run) and what is held between micro-steps (the end of forward less the
    activations and logits), each within 0.1 %: ZeRO-1 + ``overlap_comm``'s step was recorded as the largest
    micro-step's ``engine.step()`` region before session 23, the first micro-step's idle one with every whole
    ``.grad`` (3,133,256 B, -11.02 %), not its boundary step (2,788,880 B)."""
    from benchmarks.deepspeed_cpu import CASES, TINY, estimated_case, run_spec

    real = json.loads(RECORDED.read_text(encoding="utf-8"))["deepspeed_cases"][case]
    est = estimated_case(run_spec(**{"config": TINY, **CASES[case]}))
    for r, e in zip(real, est, strict=True):  # forward, backward, optimizer step, held between micro-steps
        assert abs(e - r) <= 0.001 * r


@pytest.mark.slow
def test_zero1_overlap_keeps_every_grad_until_the_boundary() -> None:
    """The real engine, ZeRO-1 with ``overlap_comm`` on 8 ranks (torch's fake process group, rank 1), accumulation
    2: its hook reduces only at the boundary, so the rank holds the whole model's bf16 ``.grad`` between micro-steps,
    not its partition (session 20 counted the partition: forward -27.4 %, backward -8.8 %; session 21 -1.7 % /
    +3.6 %: the ipg buckets left out of forward, the head's new gradient counted twice at the boundary's reduction;
    now within 0.1 %)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    from benchmarks.deepspeed_cpu import CASES, TINY, estimated_case, run_spec

    case = "zero1-overlap-8-ranks-accum2"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "deepspeed_cpu.py"), "--measure-case", case],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=600, check=True)
    real = [int(x) for x in proc.stdout.strip().splitlines()[-1].split()]
    assert real == json.loads(RECORDED.read_text(encoding="utf-8"))["deepspeed_cases"][case]  # deterministic
    est = estimated_case(run_spec(config=TINY, **CASES[case]))
    for r, e in zip(real, est, strict=True):  # forward, backward, the boundary's step, held between micro-steps
        assert abs(e - r) <= 0.001 * r


# FSDP2 rows (engine, micro-step, accumulation it is estimated at): micro-step 2 of an accumulation window, and the
# first micro-step of a run that reduces in it (sync_each_batch) as a step without accumulation
_FSDP_CASES = [("fsdp2", "micro2", 2), ("fsdp2-2ranks", "micro2", 2), ("fsdp2-sync", "micro2", 2),
               ("fsdp2-sync", "micro1", 1), ("fsdp2-2ranks-sync", "micro1", 1), ("fsdp2-2ranks-sync", "micro2", 2),
               ("fsdp1", "micro1", 1), ("fsdp1", "micro2", 2), ("fsdp1-2ranks", "micro2", 2),
               ("fsdp1-2ranks-sync", "micro1", 1), ("fsdp1-2ranks-sync", "micro2", 2),
               # fsdp_config backward_prefetch=backward_pre: the top layer gathered from the start of backward
               # (fsdp1_prefetch.fsdp1_prefetched_units; before: -4.4 / -2.8 % at the start)
               ("fsdp1-2ranks-pre", "micro2", 2)]
# below the record at 32 tokens on two ranks, not modelled: FSDP2 sync_each_batch's tail reduce-scatter copy-in
# (torch._chunk_cat on CPU) with the LM head's unsharded gradient alive (-1.3 / -3.2 %); FSDP1's record there varies
# by 5 % between runs (gloo's reduce-scatter completes on its own thread; -2.3 .. -4.6 %)
_UNDER_AT_32_ON_2_RANKS = 0.05


def _phases(engine: str, seq: int, accum: int, traced: bool = False) -> dict[Phase, int]:
    from benchmarks.accumulation_engines_cpu import spec_of

    spec = spec_of(engine, seq, accum)
    if traced:
        from fitcheck.torch_adapters import PinnedPath

        rep = PinnedPath("always", cache=None)(spec)
    else:
        rep = estimate(spec)
    return {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}


@pytest.mark.parametrize("seq", [32, 128])
@pytest.mark.parametrize(("engine", "micro", "accum"), _FSDP_CASES)
def test_fsdp_backward_is_the_real_trainers(engine: str, micro: str, accum: int, seq: int) -> None:
    """The real Trainer's FSDP rank (recorded), start of backward and during backward (the LM head's and the
    layers' backward), against the formula: each moment holds the rank's gradients as FSDP keeps them then
    (``core/states/fsdp_backward.py``: reduced fp32 shards, the unit's unsharded gradients, the last reduce-scatter
    input, FSDP1's root gathered with the head's gradient waiting for the embedding's). Before: FSDP2 during
    backward +3.1 / +7.3 % (1 rank), +10.4 / +11.2 % (2 ranks) at 32 / 128 tokens, without accumulation +4.0 /
    +15.2 %; FSDP1 start of backward +5.4 .. +10.9 % (two layer units counted), during +6.4 / +15.5 % (1 rank)."""
    from benchmarks.accumulation_engines_cpu import during_peak

    m = _rows()[f"{engine} {seq}"][micro]
    est = _phases(engine, seq, accum)
    assert abs(est[Phase.BACKWARD_START] - m["start_peak"]) <= 0.01 * m["start_peak"]
    under = _UNDER_AT_32_ON_2_RANKS if "2ranks" in engine and seq == 32 else 0.01
    assert -under * during_peak(m) <= est[Phase.BACKWARD] - during_peak(m) <= 0.01 * during_peak(m)


@pytest.mark.parametrize(("engine", "micro", "accum", "seq"), [("fsdp2-sync", "micro1", 1, 32),
                                                               ("fsdp2", "micro2", 2, 32)])
def test_fsdp_traced_backward_is_the_real_trainers(engine: str, micro: str, accum: int, seq: int) -> None:
    """The traced default path (the plain step traced, ``activations/fsdp_traced.py`` shifting its backward to
    FSDP2's moments) against the same records. Before: +4.0 % / +3.1 %."""
    from benchmarks.accumulation_engines_cpu import during_peak

    m = _rows()[f"{engine} {seq}"][micro]
    est = _phases(engine, seq, accum, traced=True)
    assert abs(est[Phase.BACKWARD] - during_peak(m)) <= 0.01 * during_peak(m)
