"""The tuner refuses an FSDP1 Trainer with a clear message (real Trainer, CPU, tiny Llama).

FSDP2 trials are tested in tests/test_tuner_fsdp.py (accelerate's FSDP state set on the CPU) and were run on an
H100. FSDP does not turn on by itself on this CPU-only setup: transformers 5.23 ``Trainer`` raises
"Using fsdp only works in distributed training." in one process (trainer.py), and under a gloo process group
(``MULTI_CPU``) accelerate 1.15 never enables FSDP (state.py enables it only for GPU-type distributed types):
``is_fsdp_enabled`` stays False and the model is wrapped in ``DistributedDataParallel``, which the tuner handles.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fitcheck.integrations.tuner import TuningError, tune_micro_batch  # noqa: E402
from tuner_budget import CONFIGS, SEQ, build_trainer  # noqa: E402


def test_an_fsdp1_trainer_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    trainer = build_trainer(CONFIGS[0], str(tmp_path))
    trainer.is_fsdp_enabled = True  # what Trainer.__init__ sets when accelerate's state has an FSDP plugin (GPU)
    # no plugin with fsdp_version 2 in accelerate's state: taken as FSDP1 (accelerate's plugin default is 1)
    with pytest.raises(TuningError, match=r"FSDP1-prepared model are not supported.*fsdp_version: 2.*"
                                          r"set_trainer_micro_batch"):
        tune_micro_batch(trainer, gpu_memory=10**9, device_type="cpu", max_seq_length=SEQ)
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (16, 1)
