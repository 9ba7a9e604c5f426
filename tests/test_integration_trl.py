"""FitcheckCallback on REAL TRL 1.16 trainers (CPU, tiny Llama): the trainer recognised from its config, the lengths
read from the prepared dataset, the reference model in both the estimate and the measurement (within 3%)."""

from __future__ import annotations

import tempfile
import warnings

import pytest
from benchmark_module import load_benchmark

from fitcheck.spec import TrainerKind

pytest.importorskip("trl")

trl_truth = load_benchmark("trl_truth")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dpo full implicit ref", "grpo beta 0.04", "kto full implicit ref"])
def test_callback_recognises_trl_trainer_and_counts_reference(name: str) -> None:
    from fitcheck.integrations import FitcheckCallback

    case = next(c for c in trl_truth.CASES if c.name == name)
    callback = FitcheckCallback(print_report=False, measure_steps=2)
    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl_truth.build_trainer(case, path, callbacks=[callback])
        trainer.train()
        reference = trainer.ref_model
    assert callback.report is not None and callback.measured is not None
    spec = callback.report.spec
    assert spec.trainer.kind is case.trainer
    # lengths from the prepared dataset / tokenized prompts, not the config's 1024 default
    assert (spec.trainer.prompt_length, spec.trainer.completion_length) == (case.prompt, case.length)
    ref_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    assert callback.report.at_peak()["reference_model.weights"] == ref_bytes
    measured = callback.measured["live_tensor_peak"]
    assert measured > ref_bytes  # the measurement counts the reference copy's weights
    assert callback.report.peak_allocated_bytes == pytest.approx(measured, rel=0.03)
    if case.trainer is TrainerKind.GRPO:
        assert spec.batch.seq_len == case.prompt + case.length
