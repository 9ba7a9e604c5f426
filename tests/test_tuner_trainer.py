"""tune_micro_batch on real Trainers (CPU, tiny Llama) under a simulated GPU budget, against a scan of real runs.

For each configuration the budget (a live-byte limit that raises torch's OOM error, tests/tuner_budget.py) is
placed between two sizes; the true maximum is found by real training runs at every size that keeps the global
batch. The tuner must land on it, in at most 2 trials when its prediction is that size, keep the global batch,
leave parameters, RNG and optimizer untouched, and the following train() must run max_steps optimizer steps
at the size found without running out of memory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fitcheck.integrations.tuner import (  # noqa: E402
    TuningError,
    divisors,
    train_with_tuned_micro_batch,
    tune_micro_batch,
)
from tuner_budget import CONFIGS, MAX_STEPS, SEQ, Config, budget_for, build_trainer, real_peak  # noqa: E402


def scan(config: Config, out: str) -> tuple[int, int]:
    """(budget, true maximum): the budget half-way between the real peaks of the target size and the next.

    Two real runs: memory grows with the micro-batch (benchmarks/tuner_vs_hf.py scans every size and checks
    it), so the target size is the largest that fits and the next one is the smallest that does not.
    """
    sizes = divisors(config.micro * config.accum)
    low, high = (real_peak(config, out, m) for m in sizes[config.target : config.target + 2])
    assert low < high
    return (low + high) // 2, sizes[config.target]


class StartCheck(transformers.TrainerCallback):  # type: ignore[misc]
    """Records whether the parameters equal the initial ones when training begins, and counts steps."""

    def __init__(self) -> None:
        self.initial: dict[str, Any] = {}
        self.equal_at_start: bool | None = None
        self.optimizer_steps = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
        self.equal_at_start = all(torch.equal(p, self.initial[n]) for n, p in model.named_parameters())
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        self.optimizer_steps += 1
        return control


def _count_forwards(model: Any) -> list[int]:
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_tuner_lands_on_the_scanned_max_without_training(config: Config, tmp_path: Path) -> None:
    out = str(tmp_path)
    budget, truth = scan(config, out)
    check = StartCheck()
    trainer = build_trainer(config, out, max_steps=MAX_STEPS, callbacks=[check])
    check.initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    per_gpu = config.micro * config.accum
    rng = torch.get_rng_state()
    with budget_for(trainer.model, budget):
        result = tune_micro_batch(trainer, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
    assert result.micro_batch == truth, result.table()
    if result.predicted_micro_batch == truth:
        assert len(result.trials) <= 2, result.table()
    assert trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps == per_gpu
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (
        result.micro_batch, result.grad_accum)
    assert torch.equal(torch.get_rng_state(), rng)
    assert trainer.optimizer is None and all(p.grad is None for p in trainer.model.parameters())
    assert all(t.fits == (t.micro_batch <= truth) for t in result.trials)
    forwards = _count_forwards(trainer.model)
    with budget_for(trainer.model, budget):
        output = trainer.train()  # no OOM at the size found
    assert check.equal_at_start is True
    assert output.global_step == MAX_STEPS == check.optimizer_steps
    assert forwards[0] == MAX_STEPS * result.grad_accum


@pytest.mark.slow
def test_nothing_fits_raises_and_leaves_the_arguments(tmp_path: Path) -> None:
    config = CONFIGS[1]
    trainer = build_trainer(config, str(tmp_path))
    params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    with pytest.raises(TuningError, match="no micro-batch") as info, budget_for(trainer.model, params + 1024):
        tune_micro_batch(trainer, gpu_memory=params + 1024, device_type="cpu", max_seq_length=SEQ)
    assert info.value.trials and not any(t.fits for t in info.value.trials)
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 4)


@pytest.mark.slow
def test_train_with_tuned_micro_batch_trains_once_at_the_size_found(tmp_path: Path) -> None:
    config = CONFIGS[0]
    out = str(tmp_path)
    budget = (real_peak(config, out, 4) + real_peak(config, out, 8)) // 2
    trainer = build_trainer(config, out, max_steps=MAX_STEPS)
    with budget_for(trainer.model, budget) as mode:
        output = train_with_tuned_micro_batch(trainer, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
    assert output.global_step == MAX_STEPS and mode.ooms <= 1
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 4)


def test_start_and_every_verdict_are_agreed_over_ranks_gloo_world_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  free_port: int) -> None:
    import torch.distributed as dist

    config = CONFIGS[0]
    trainer = build_trainer(config, str(tmp_path))
    calls: list[int] = []
    real = dist.all_reduce

    def spy(tensor: Any, op: Any = dist.ReduceOp.SUM, **kw: Any) -> Any:
        calls.append(int(tensor.item()))
        assert op == dist.ReduceOp.MIN
        return real(tensor, op=op, **kw)

    monkeypatch.setattr(dist, "all_reduce", spy)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with budget_for(trainer.model, 10**12):
            result = tune_micro_batch(trainer, gpu_memory=10**9, device_type="cpu", max_seq_length=SEQ)
    finally:
        dist.destroy_process_group()
    # one all-reduce (MIN) of the starting index, then one per trial: every rank takes the same path
    assert len(calls) == 1 + len(result.trials) >= 2


def test_without_a_length_the_trials_run_at_the_models_longest(tmp_path: Path) -> None:
    trainer = build_trainer(CONFIGS[0], str(tmp_path))  # no max_length: fitcheck's default 1024 > 128 positions
    with budget_for(trainer.model, 10**12):
        result = tune_micro_batch(trainer, gpu_memory=10**9, device_type="cpu")
    assert result.seq_len == trainer.model.config.max_position_embeddings == 128
    assert result.micro_batch == 16 and len(result.trials) == 1  # the top size: no upward check


@pytest.mark.slow
def test_two_ddp_ranks_with_different_budgets_agree(tmp_path: Path, free_port: int) -> None:
    """torch.distributed.run, 2 CPU processes (gloo): rank 1 has less memory; both set the size that fits on it."""
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "rank"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port),
           str(root / "benchmarks" / "tuner_ddp_worker.py"), str(out), "3000000", "1700000"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads((tmp_path / f"rank.{r}").read_text()) for r in (0, 1)]
    assert rows[0][:3] == rows[1][:3]  # same micro-batch, accumulation and number of trials on both ranks
    micro, accum, _, same, initialised, world, kind = rows[0]
    assert micro * accum == 16 and same is True
    assert (initialised, world, kind) == (True, 2, "DistributedType.MULTI_CPU")


def test_cpu_budget_is_honoured_without_a_simulated_allocator(tmp_path: Path) -> None:
    """Issue 21: on the CPU nothing refuses an allocation, so ``gpu_memory`` was ignored (16 x 1 kept at a measured
    33.8 MB with an 18 MiB budget). The measured live-tensor peak of each trial is now held against it."""
    config = CONFIGS[0]  # full FT, 16 x 1
    out = str(tmp_path)
    budget, _ = scan(config, out)
    trainer = build_trainer(config, out)
    result = tune_micro_batch(trainer, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
    assert result.micro_batch < config.micro * config.accum
    assert all(t.peak_bytes is not None and t.peak_bytes <= budget for t in result.trials if t.fits)
    assert any(not t.fits for t in result.trials) or result.micro_batch == 1
