"""Shared test setup: no test may reach the network."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# tiny_models.py holds shared assertions (formula vs trace): let pytest explain their failures in full
pytest.register_assert_rewrite("tiny_models")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# fitcheck's trace cache (fitcheck/torch_adapters/trace_cache.py) never writes to the real ~/.cache from tests or CI
_TRACE_CACHES = tempfile.mkdtemp(prefix="fitcheck-test-cache-")
os.environ["FITCHECK_CACHE_DIR"] = _TRACE_CACHES
atexit.register(shutil.rmtree, _TRACE_CACHES, True)


@pytest.fixture(autouse=True)
def _own_trace_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own empty trace cache (its subprocesses inherit it): what one test traced is never another
    test's cache hit (a test that makes a trace fail must see it fail)."""
    monkeypatch.setenv("FITCHECK_CACHE_DIR", tempfile.mkdtemp(dir=_TRACE_CACHES))


@pytest.fixture
def free_port() -> int:
    """A TCP port nothing listens on now, for a ``torch.distributed.run`` rendezvous (fixed ports clashed when two
    multi-process tests, or two suites, ran on one machine): :func:`benchmarks.gloo_rank.free_port`."""
    from benchmarks.gloo_rank import free_port as _free_port

    return int(_free_port())


# Real-library checks that repeat a kind another test in the default run already covers (a second row of the same
# real CPU step, a second DeepSpeed/FSDP variant of the same tuner trial). They run with FITCHECK_HEAVY_TESTS=1
# (about 15 more worker-minutes on a 2-core machine); the default run, which CI runs, stays under its 30 minutes.
HEAVY = (
    "tests/test_cpu_truth.py::test_real_cpu_step_within_two_percent[llama QLoRA nf4 dq bf16 ckpt]",
    "tests/test_cpu_truth.py::test_real_cpu_step_within_two_percent[qwen2 bf16 full sgd]",
    "tests/test_cpu_truth.py::test_real_cpu_step_within_two_percent[llama bf16 freeze emb frozen]",
    "tests/test_tuner_grpo.py::test_grpo_under_deepspeed_or_fsdp_lands_on_the_max_and_trains_like_an_untuned_run[zero3]",
    "tests/test_tuner_grpo.py::test_grpo_under_deepspeed_or_fsdp_lands_on_the_max_and_trains_like_an_untuned_run[fsdp1]",
    "tests/test_tuner_deepspeed.py::test_tuner_on_a_real_deepspeed_engine_finds_the_max_without_training[2]",
    "tests/test_tuner_fsdp.py::test_tuned_fsdp1_trainer_survives_an_oom_mid_step_and_trains_like_an_untuned_one[forward]",
    "tests/test_tuner.py::test_hf_tuner_on_the_same_budget_shrinks_by_tenths",
    "tests/test_fsdp_upcast.py::test_bf16_and_fp32_loads_give_one_estimate_and_verdict[trl_fsdp2.yaml]",
    # session 13 (CI at 2391 s): a second variant of a kind the default run keeps
    "tests/test_levers.py::test_reentrant_checkpointing_saves_what_non_reentrant_saves_real_cpu_step",
    "tests/test_tuner_grpo.py::test_grpo_under_deepspeed_or_fsdp_lands_on_the_max_and_trains_like_an_untuned_run[zero2]",
    "tests/test_save_phase.py::test_real_one_process_trainer_save_creates_nothing[full-trainer]",
    "tests/test_tuner_fsdp.py::test_tuned_fsdp1_trainer_survives_an_oom_mid_step_and_trains_like_an_untuned_one[backward]",
    "tests/test_fsdp_upcast.py::test_real_prepare_upcasts_a_bf16_model_and_the_estimate_follows[1]",
    "tests/test_tuner_same_weights.py::test_tuned_run_trains_to_the_weights_of_an_untuned_run[LoRA]",
    "tests/test_tuner_same_weights.py::test_tuned_run_trains_to_the_weights_of_an_untuned_run[checkpointing]",
    "tests/test_tuner_trainer.py::test_tuner_lands_on_the_scanned_max_without_training[full FT, 4 x 4]",
    "tests/test_tuner_trainer.py::test_tuner_lands_on_the_scanned_max_without_training[LoRA r8, 16 x 1]",
    # session 20 (CI at 1689 s): the same-weights promise stays checked on the Trainer (same file, [Trainer]); the
    # SFTTrainer's tuning on test_tuner_trainer.py [TRL SFTTrainer, 16 x 1] and a TRL trainer's restore-and-train
    # on test_tuner_grpo.py
    "tests/test_tuner_same_weights.py::test_tuned_run_trains_to_the_weights_of_an_untuned_run[SFTTrainer]",
    # spawns the real FSDP1 runs whose bytes benchmarks/data/fsdp1_run_events_cpu.json records (~2 minutes)
    "tests/test_fsdp1_run_events.py::test_sequence_matches_a_real_fsdp1_run",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip :data:`HEAVY` unless ``FITCHECK_HEAVY_TESTS=1``."""
    if os.environ.get("FITCHECK_HEAVY_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="a repeat of a covered real-library check: FITCHECK_HEAVY_TESTS=1 runs it")
    for item in items:
        if item.nodeid in HEAVY:
            item.add_marker(skip)
