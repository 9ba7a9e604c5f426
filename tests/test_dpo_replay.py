"""Issue 19: the whole-run allocator replay describes TRL 1.16's DPOTrainer run.

Before, ``run_scope.not_replayed`` answered every DPO run with "the dpo trainer's step (chosen + rejected rows, the
reference model's no_grad forward or its adapters-off pass)" and the replay, where forced, composed the plain
Trainer's step: no reference copy, no reference pass, full-vocabulary logits. Now the DPO step is traced as the
trainer runs it (``torch_adapters/tracer_dpo.py``) and replayed. The real DPOTrainer vs the replay on CPU is
``benchmarks/trl_replay.py`` (its rows in ``benchmarks/data/trl_replay_cpu.json``). Each test failed on main.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from tiny_models import WIDE_VOCAB_LLAMA
from trl_replay_rows import check_precompute_row, check_replay_row, one_step_traces, setup_bytes

from fitcheck.spec import TrainerKind, TrainerSpec, TrainingSpec

OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")  # DPOTrainer's policy head (core.trainers registry)
REPLAYED = ("dpo full ref", "dpo full ref no-ckpt", "dpo LoRA", "dpo LoRA no-ckpt", "dpo rpo_alpha",
            "dpo precompute_ref_log_probs", "dpo LoRA precompute_ref_log_probs")
PRECOMPUTED = ("dpo precompute_ref_log_probs", "dpo LoRA precompute_ref_log_probs")


@pytest.mark.parametrize("case", REPLAYED)
def test_recorded_replay_matches_the_real_dpo_trainer(case: str) -> None:
    """The recorded three-step runs: the replay's allocated peak within 0.1 % of the real DPOTrainer's live tensors
    (full fine-tune with its reference copy, LoRA with the adapters-off pass, with and without checkpointing), over
    the run and in the last step; the plain Trainer's step replayed instead (what main composed) is off by more
    than 10 %."""
    check_replay_row(case)


@pytest.mark.parametrize("case", PRECOMPUTED)
def test_recorded_precompute_pass_matches_the_real_one(case: str) -> None:
    """``precompute_ref_log_probs``: the pass ``DPOTrainer.__init__`` runs before training (no_grad forwards of the
    policy, adapters disabled under PEFT), replayed in the setup, within 0.1 % of the real pass's live tensors."""
    check_precompute_row(case)


def _spec(case: Any) -> TrainingSpec:
    from benchmark_module import load_benchmark

    spec: TrainingSpec = load_benchmark("trl_truth").spec_for(case)
    return spec


def _case(**kwargs: Any) -> Any:
    from benchmark_module import load_benchmark

    truth = load_benchmark("trl_truth")
    return truth.Case("dpo", TrainerKind.DPO, length=48, prompt=32, **kwargs)


def test_dpo_run_scope() -> None:
    """A full fine-tune (reference copy) and LoRA (adapters off) are replayed, with or without ``rpo_alpha`` or
    ``precompute_ref_log_probs``; another loss stays out, named."""
    from benchmark_module import load_benchmark

    from fitcheck.torch_adapters import not_replayed, replayed_run

    lora = load_benchmark("trl_truth").TRL_LORA
    for case in (_case(), _case(lora=lora), _case(ckpt=False), _case(extra={"rpo_alpha": 1.0}),
                 _case(extra={"precompute_ref_log_probs": True})):
        spec = _spec(case)
        assert replayed_run(spec) and not_replayed(spec) == "", case
    full = _spec(_case())
    ipo = dataclasses.replace(full, trainer=dataclasses.replace(full.trainer, loss_type=("ipo",)))
    assert not replayed_run(ipo) and "ipo" in not_replayed(ipo)


def test_dpo_step_holds_the_reference_copy_and_its_pass() -> None:
    """The traced step at its real shape: 2 x (32 + 48) pairs run as 4 rows; the full fine-tune's setup holds
    the reference copy (the policy's bytes twice, with the batch's few KiB of ids and masks); the LoRA step's
    adapters-off pass opens no region (six per step and ``done``: what ``allocator_compose.whole_run`` cuts at)."""
    from benchmark_module import load_benchmark

    from fitcheck.torch_adapters import run_trace_kwargs

    full = _spec(_case())
    kwargs = run_trace_kwargs(full)
    assert kwargs["micro_batch"] == 4 and kwargs["seq_len"] == 80 and kwargs["trl_head"] == OUTPUTS
    assert kwargs["trl_dpo"] == ("model", 32, None, 0)
    lora = _spec(_case(lora=load_benchmark("trl_truth").TRL_LORA))
    traces = one_step_traces({"full": full, "lora": lora}, seq_len=40, micro_batch=2)
    setup = {name: setup_bytes(t) for name, t in traces.items()}
    params = 2 * full.model.total_params  # bf16, no tied weights
    assert setup["full"] == pytest.approx(2 * params, abs=4096)  # + ids, labels, completion mask, rotary buffers
    assert len(traces["lora"].region_starts) == len(traces["full"].region_starts) == 7


def test_dpo_near_budget_replays_the_dpo_run(tmp_path: Path) -> None:
    """Near the budget a DPO LoRA run is replayed (``reserved-near-budget-replayed``), no longer warned about."""
    from fitcheck.cli import spec_from_values
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import PinnedPath

    (tmp_path / "config.json").write_text(json.dumps(WIDE_VOCAB_LLAMA))
    flags = {"model_name_or_path": str(tmp_path), "bf16": True, "gradient_checkpointing": True, "use_peft": True,
             "per_device_train_batch_size": 2, "trainer": "dpo", "max_prompt_length": 32,
             "max_completion_length": 32, "gpu_memory": "80GiB"}
    spec = spec_from_values(flags, {})[0]
    used = estimate(spec).device_used_bytes
    near = dataclasses.replace(spec, hardware=dataclasses.replace(spec.hardware, gpu_memory_bytes=used + 2**20))
    path = PinnedPath("auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = path(near)
    codes = [f.code for f in report.findings]
    assert "reserved-near-budget-replayed" in codes and "reserved-near-budget" not in codes
    assert len(path.near_budget.replays) == 1


def test_cuda_head_scores_the_labelled_positions_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the fused head gathers the labelled positions (``hidden_states[mask]``): ``tracer_dpo.compact_gather``
    on fake tensors replays as the real boolean gather and ``masked_scatter`` of a real CPU step forced onto that
    path (``trl.trainer.utils._use_triton`` True), within the gather's index tensors; without it the head scores
    every position (the prompt's too)."""
    import trl.trainer.utils as trl_utils

    from fitcheck.torch_adapters.allocator_replay import replay_events
    from fitcheck.torch_adapters.tracer import trace_step
    from fitcheck.torch_adapters.tracer_dpo import compact_gather, labelled_positions
    from fitcheck.torch_adapters.tracer_trl_plans import DpoPlan

    step: dict[str, Any] = {"seq_len": 64, "micro_batch": 4, "dtype": "bfloat16", "mixed_precision": "bf16",
                            "checkpointing": True, "optimizer": None, "steps": 1, "trl_head": OUTPUTS,
                            "lora": None, "trl_dpo": DpoPlan("model", 48, None, 0)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        every = trace_step(WIDE_VOCAB_LLAMA, **step)
        with compact_gather(labelled_positions(4, 64, 48)):
            emulated = trace_step(WIDE_VOCAB_LLAMA, **step)
        monkeypatch.setattr(trl_utils, "_use_triton", lambda _device: True)
        real = trace_step(WIDE_VOCAB_LLAMA, fake=False, **step)
    peaks = {name: replay_events([t.alloc_events]).peak_allocated for name, t in
             (("every", every), ("emulated", emulated), ("real", real))}
    assert peaks["emulated"] == pytest.approx(peaks["real"], rel=0.005)
    assert peaks["every"] > 1.2 * peaks["real"]


def test_compact_gather_leaves_torch_tensor_as_it_was() -> None:
    """``compact_gather`` intercepts indexing through a torch-function mode and leaves ``torch.Tensor`` alone: a
    ``__getitem__`` once assigned to ``torch.Tensor`` (its first version) gives every tensor the sequence protocol
    for good, and ``torch.tensor([tensor(3)])`` (Qwen2.5-VL's ``get_rope_index``) then raises ``len() of a 0-d
    tensor``: it failed test_vision.py after this file in one pytest worker."""
    import torch

    from fitcheck.torch_adapters.tracer_dpo import compact_gather

    before = dict(vars(torch.Tensor))
    with compact_gather(2):
        x = torch.arange(12.0).reshape(4, 3)
        assert x[torch.tensor([False, True, True, False])].shape == (2, 3)  # the first ``count`` rows, copied
        assert torch.tensor([torch.tensor(3), torch.tensor(4)]).tolist() == [3, 4]
    assert dict(vars(torch.Tensor)) == before
    assert torch.tensor([torch.tensor(3), torch.tensor(4)]).tolist() == [3, 4]
    assert torch.arange(4)[torch.tensor([True, False, True, False])].tolist() == [0, 2]  # real indexing again


def test_plain_replay_is_not_the_dpo_step() -> None:
    """``run_trace_kwargs`` of a DPO spec is no longer the plain Trainer's (``trace_kwargs``)."""
    from fitcheck.torch_adapters import run_trace_kwargs

    spec = _spec(_case())
    plain = run_trace_kwargs(dataclasses.replace(spec, trainer=TrainerSpec()))
    assert "trl_dpo" not in plain and run_trace_kwargs(spec)["micro_batch"] == 2 * plain["micro_batch"]
