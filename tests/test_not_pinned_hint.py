"""Issue 19: the ``not-pinned`` warning's hint where torch is installed.

The core writes "install torch + transformers ... or pass --trace" without knowing whether torch is installed. The
default path knows: a TRL trainer's step is not auto-traced (``run_scope.traceable``), so its hint is ``--trace``;
under ``--no_trace`` a plain run's hint is to drop the flag. Before, both said to install torch.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

pytest.importorskip("torch")

from benchmark_module import load_benchmark

from fitcheck.spec import TrainerKind, TrainerSpec


def _hint(mode: str, trainer: TrainerKind) -> str:
    from fitcheck.torch_adapters import PinnedPath

    truth = load_benchmark("trl_truth")
    spec = truth.spec_for(truth.Case("sft", TrainerKind.SFT))
    if trainer is TrainerKind.TRAINER:
        spec = dataclasses.replace(spec, trainer=TrainerSpec())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = PinnedPath(mode, can_trace=True)(spec)
    assert not report.pinned
    return next(f.hint for f in report.findings if f.code == "not-pinned")


@pytest.mark.parametrize("mode", ["auto", "never"])
def test_trl_run_not_pinned_says_pass_trace(mode: str) -> None:
    hint = _hint(mode, TrainerKind.SFT)
    assert "--trace" in hint and "sft trainer's policy step" in hint and "install torch" not in hint


def test_plain_run_under_no_trace_says_drop_it() -> None:
    hint = _hint("never", TrainerKind.TRAINER)
    assert "drop --no_trace" in hint and "install torch" not in hint
