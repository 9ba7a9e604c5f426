"""Issue 19: the whole-run allocator replay describes TRL 1.16's KTOTrainer run.

Before, ``run_scope.not_replayed`` answered every KTO run with "the kto trainer's step (the reference model's
no_grad forward and the KL batch)" and the replay, where forced, composed the plain Trainer's step: no reference
copy, no KL batch, full-vocabulary logits. Now the KTO step is traced as the trainer runs it
(``torch_adapters/tracer_kto.py``) and replayed. The real KTOTrainer vs the replay on CPU is
``benchmarks/trl_replay.py`` (its rows in ``benchmarks/data/trl_replay_cpu.json``). Each test failed on main.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from trl_replay_rows import check_precompute_row, check_replay_row, one_step_traces, recorded_rows, setup_bytes

from fitcheck.errors import ConfigError
from fitcheck.spec import TrainerKind, TrainerSpec, TrainingSpec

OUTPUTS = ("log_probs", "entropy", "mean_logits")  # KTOTrainer's policy head (core.trainers registry)
REPLAYED = ("kto full ref", "kto full ref no-ckpt", "kto LoRA", "kto LoRA no-ckpt", "kto apo_zero_unpaired (no KL)",
            "kto LoRA apo_zero_unpaired (no KL)", "kto precompute_ref_log_probs", "kto LoRA precompute_ref_log_probs")
PRECOMPUTED = ("kto precompute_ref_log_probs", "kto LoRA precompute_ref_log_probs")


@pytest.mark.parametrize("case", REPLAYED)
def test_recorded_replay_matches_the_real_kto_trainer(case: str) -> None:
    """The recorded three-step runs: the replay's allocated peak within 0.1 % of the real KTOTrainer's live tensors
    (full fine-tune with its reference copy, LoRA with the adapters-off pass, with and without checkpointing, with
    and without the KL batch, precomputed reference log-probs), over the run and in the last step; the plain
    Trainer's step replayed instead (what main composed) is off by more than 10 %."""
    check_replay_row(case)


@pytest.mark.parametrize("case", PRECOMPUTED)
def test_recorded_precompute_pass_matches_the_real_one(case: str) -> None:
    """``precompute_ref_log_probs``: the pass ``KTOTrainer.__init__`` runs before training (the completions' and the
    KL rows' no_grad forwards, adapters disabled under PEFT), replayed in the setup, within 0.1 % of the real
    pass's live tensors."""
    check_precompute_row(case)


def _spec(**kwargs: Any) -> TrainingSpec:
    from benchmark_module import load_benchmark

    truth = load_benchmark("trl_truth")
    spec: TrainingSpec = truth.spec_for(truth.Case("kto", TrainerKind.KTO, length=48, prompt=32, **kwargs))
    return spec


def test_kto_run_scope() -> None:
    """A full fine-tune (reference copy) and LoRA (adapters off) are replayed, with or without checkpointing, the KL
    batch or ``precompute_ref_log_probs``; the full-logits subclass and the copy under FSDP stay out, named."""
    from benchmark_module import load_benchmark

    from fitcheck.torch_adapters import not_replayed, replayed_run

    lora = load_benchmark("trl_truth").TRL_LORA
    for spec in (_spec(), _spec(lora=lora), _spec(ckpt=False), _spec(extra={"loss_type": "apo_zero_unpaired"}),
                 _spec(extra={"precompute_ref_log_probs": True})):
        assert replayed_run(spec) and not_replayed(spec) == "", spec.trainer
    full = _spec()
    logits = dataclasses.replace(full, activations=dataclasses.replace(full.activations, loss="full-logits"))
    assert not replayed_run(logits) and "KTO without TRL's fused LM head" in not_replayed(logits)


def test_kto_trace_kwargs_and_its_kl_batch() -> None:
    """The step at its real shape: 2 rows of 32 + 48 (one completion per row, one desirable), the copy, the KL
    batch with ``kto`` and none with ``apo_zero_unpaired``. Traced (2 x 40, one layer): the full fine-tune's setup
    holds the copy (the policy's bytes twice, with the batch's few KiB); the KL batch adds two no_grad forwards, so
    the ``kto`` step records more allocations than the ``apo_zero_unpaired`` one, at the same regions (six per
    step and ``done``)."""
    from fitcheck.readers import inventory_from_config
    from fitcheck.torch_adapters import run_trace_kwargs

    full, apo = _spec(), _spec(extra={"loss_type": "apo_zero_unpaired"})
    kwargs = run_trace_kwargs(full)
    assert kwargs["micro_batch"] == 2 and kwargs["seq_len"] == 80 and kwargs["trl_head"] == OUTPUTS
    assert kwargs["trl_kto"] == ("model", 32, True, 0, 1) and "trl_dpo" not in kwargs
    assert run_trace_kwargs(apo)["trl_kto"] == ("model", 32, False, 0, 1)
    assert "trl_kto" not in run_trace_kwargs(dataclasses.replace(full, trainer=TrainerSpec()))
    traces = one_step_traces({"kto": full, "apo": apo}, seq_len=40, num_layers=1)
    setup = setup_bytes(traces["kto"])
    one_layer = inventory_from_config({**full.model.config, "num_hidden_layers": 1}, "kto", "test").total_params
    assert setup == pytest.approx(2 * 2 * one_layer, abs=4096)  # bf16 policy + copy
    allocs = {name: sum(1 for _, n, _tag in t.alloc_events if n > 0) for name, t in traces.items()}
    assert allocs["kto"] > allocs["apo"] + 20  # two more forwards (a layer and the fused head each)
    assert len(traces["kto"].region_starts) == len(traces["apo"].region_starts) == 7


def test_kto_loss_type_flag(tmp_path: Path) -> None:
    """``--loss_type`` with ``--trainer kto``: KTOConfig's two choices are read (``apo_zero_unpaired``: no KL
    batch; absent: ``kto``), any other is refused naming them (before: every ``--loss_type`` with KTO was refused
    as a DPO field)."""
    from fitcheck.cli import spec_from_values

    (tmp_path / "config.json").write_text(json.dumps(_spec().model.config))
    flags = {"model_name_or_path": str(tmp_path), "bf16": True, "per_device_train_batch_size": 2, "trainer": "kto",
             "max_prompt_length": 32, "max_completion_length": 48}
    assert spec_from_values(flags, {})[0].trainer.loss_type == ("kto",)
    apo = spec_from_values({**flags, "loss_type": "apo_zero_unpaired"}, {})[0]
    assert apo.trainer.loss_type == ("apo_zero_unpaired",)
    with pytest.raises(ConfigError, match="kto, apo_zero_unpaired"):
        spec_from_values({**flags, "loss_type": "ipo"}, {})


@pytest.mark.parametrize("case", ("kto LoRA no-ckpt", "dpo LoRA no-ckpt"))
def test_formula_without_the_lora_dropout_trl_disables(case: str) -> None:
    """KTOTrainer / DPOTrainer run ``disable_dropout_in_model`` (``disable_dropout`` defaults to True): peft's LoRA
    dropout has ``p`` 0 and saves nothing. The formula (``core.trainers.step_spec``) now leaves its masks and copies
    out: within 1 % of the real run's live-tensor peak without checkpointing (before: +7.35 % KTO, +8.32 % DPO)."""
    from benchmark_module import load_benchmark

    from fitcheck.core import estimate

    bench = load_benchmark("trl_replay")
    (spec_case,) = [c for c in bench.ALL_CASES if c.name == case]
    assert spec_case.lora is not None and spec_case.lora.dropout > 0 and not spec_case.ckpt
    real = recorded_rows()[case]["real"]["peak"]
    assert estimate(bench.case_spec(spec_case)).peak_allocated_bytes == pytest.approx(real, rel=0.01)


def test_a_zero_byte_storage_is_no_allocator_event() -> None:
    """A zero-element tensor never reaches the caching allocator (torch ``CUDACachingAllocator.cpp``
    ``NativeCachingAllocator::allocate`` calls ``malloc`` only ``if (size != 0)``): the recorder's allocation events
    leave it out, and the region starts still point at their regions' first events."""
    import torch

    from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder

    rec = LiveTensorRecorder()
    with rec:
        kept = torch.ones(4)
        rec.enter_region("forward")
        empty = torch.zeros(0)
        del empty
        rec.enter_region("backward")
        grad = torch.ones(8)
        del grad
    events, starts = rec.allocation_events()
    assert [n for _, n, _ in events] == [16, 32, -32] and kept.numel() == 4
    assert starts == (1, 1)
    assert events[starts[1]][2] == "backward"
