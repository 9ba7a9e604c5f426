"""The advisor and the analytic micro-batch search, on a stand-in estimate and on the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_advisor_fakes import fake_estimate, llama8b_spec, with_budget

from fitcheck.advice.advisor import Tier, advise
from fitcheck.advice.batch_search import keep_global_batch, max_micro_batch, plan_global_batch, with_micro_batch
from fitcheck.spec import AttnImpl, ShardingSpec, Strategy

ROOT = Path(__file__).resolve().parents[1]


def linear_scan(spec, est, limit=128):  # type: ignore[no-untyped-def]
    best = 0
    for m in range(1, limit + 1):
        if est(with_micro_batch(spec, m)).fits:
            best = m
    return best


@pytest.mark.parametrize(("gib", "micro"), [(80, 1), (80, 16), (120, 3), (200, 7), (60, 2), (300, 1)])
def test_max_micro_batch_equals_a_linear_scan(gib: float, micro: int) -> None:
    spec = with_budget(llama8b_spec(micro=micro, seq=1024), gib)
    assert max_micro_batch(spec, fake_estimate) == linear_scan(spec, fake_estimate, 400)


def test_max_micro_batch_is_zero_when_nothing_fits_and_margin_lowers_it() -> None:
    assert max_micro_batch(with_budget(llama8b_spec(), 40), fake_estimate) == 0
    spec = with_budget(llama8b_spec(seq=1024), 200)
    assert max_micro_batch(spec, fake_estimate, safety_margin=0.2) < max_micro_batch(spec, fake_estimate)


@pytest.mark.parametrize(
    ("micro", "gas", "want", "plan"),
    [
        (8, 2, 4, (4, 4, True)),  # divides: exact
        (8, 2, 3, (2, 8, True)),  # 16 = 2 x 8 keeps it; 2 >= 3/2
        (7, 1, 5, (5, 1, False)),  # 7 is prime: closest not larger, 5 x 1
        (4, 4, 32, (16, 1, True)),  # above the per-GPU batch: capped
    ],
)
def test_plan_global_batch_rule(micro: int, gas: int, want: int, plan: tuple[int, int, bool]) -> None:
    spec = llama8b_spec(micro=micro, gas=gas)
    got = plan_global_batch(spec, want)
    assert (got.micro_batch, got.grad_accum, got.exact) == plan
    assert got.global_batch <= got.requested_global_batch
    assert keep_global_batch(spec, want) == plan[:2]


def test_advice_on_the_stand_in_keeps_global_batch_and_ranks_fitting_first() -> None:
    spec = llama8b_spec(micro=4, seq=4096, gas=4)
    report = fake_estimate(spec)
    assert not report.fits
    sugg = advise(spec, report, fake_estimate, limit=20)
    assert sugg and sugg[0].fits
    fits = [s.fits for s in sugg]
    assert fits == sorted(fits, reverse=True)
    for s in sugg:
        assert s.spec is not None
        again = fake_estimate(s.spec)
        assert (again.peak_allocated_bytes, again.fits) == (s.peak_allocated_bytes, s.fits)
        if s.tier is Tier.SAME_TRAINING:
            assert s.micro_batch * s.grad_accum == 16  # global batch kept
    tiers = [s.tier for s in sugg if s.fits]
    order = list(Tier)
    assert [order.index(t) for t in tiers] == sorted(order.index(t) for t in tiers)


def test_advice_suggests_sdpa_for_eager_and_zero_for_several_gpus() -> None:
    spec = llama8b_spec(micro=2, seq=4096)
    spec = replace(spec, activations=replace(spec.activations, attn_implementation=AttnImpl.EAGER))
    spec = replace(spec, sharding=ShardingSpec(Strategy.DDP, num_processes=8))
    sugg = advise(spec, fake_estimate(spec), fake_estimate, limit=50)
    argvs = [" ".join(s.argv) for s in sugg]
    assert any("--attn_implementation sdpa" in a for a in argvs)
    assert any("--zero_stage 3" in a for a in argvs)


def test_advice_when_it_fits_with_room_turns_checkpointing_off_or_raises_the_micro_batch() -> None:
    spec = with_budget(llama8b_spec(micro=1, seq=1024, gas=8), 200)
    spec = replace(spec, activations=replace(spec.activations, checkpointing=True))
    report = fake_estimate(spec)
    assert report.fits
    sugg = advise(spec, report, fake_estimate)
    titles = [s.title.lower() for s in sugg]
    assert any("no gradient checkpointing" in t for t in titles)
    assert any("micro-batch" in t and s.micro_batch > 1 for t, s in zip(titles, sugg, strict=True))
    assert all(s.fits for s in sugg)
    assert sugg[0].relative_step_time < 1.0


# --- the real estimator: the done-means -------------------------------------------------------------

BASE_ARGV = [
    "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--per_device_train_batch_size", "4",
    "--gradient_accumulation_steps", "4", "--max_seq_length", "4096", "--bf16", "--dtype", "bfloat16",
    "--gpu", "H100-80GB",
]  # fmt: skip


def real_spec():  # type: ignore[no-untyped-def]
    from fitcheck.readers.model_config import load_inventory
    from fitcheck.readers.run_args import spec_from_values

    inv = load_inventory("meta-llama/Llama-3.1-8B", env={})
    values = {
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "max_seq_length": 4096,
        "bf16": True, "dtype": "bfloat16", "gpu": "H100-80GB",
    }  # fmt: skip
    return spec_from_values(values, inventory=inv)[0]


def test_llama31_8b_seq4096_top_suggestions_fit_by_their_own_estimate() -> None:
    from fitcheck.core.estimator import estimate

    spec = real_spec()
    report = estimate(spec)
    assert not report.fits
    sugg = advise(spec, report)
    assert len(sugg) >= 3
    for s in sugg[:3]:
        assert s.fits
        again = estimate(s.spec)  # type: ignore[arg-type]
        assert again.fits and again.peak_allocated_bytes == s.peak_allocated_bytes


def run_cli(argv: list[str]) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "fitcheck.cli.main", "estimate", *argv, "--json"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr[-2000:]
    data: dict[str, object] = json.loads(out.stdout)
    return data


@pytest.mark.slow
def test_first_suggestion_as_flags_gives_the_number_the_advisor_printed() -> None:
    base = run_cli(BASE_ARGV)
    assert base["fits"] is False
    suggestions = base["suggestions"]
    assert isinstance(suggestions, list) and suggestions
    first = suggestions[0]
    again = run_cli([*BASE_ARGV, *first["argv"]])
    assert again["fits"] is True
    assert again["peak_allocated_bytes"] == first["peak_allocated_bytes"]
    assert again["device_used_bytes"] == first["device_used_bytes"]
