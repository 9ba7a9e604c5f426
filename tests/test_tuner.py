"""The tuner's search (search_largest) on a simulated GPU (a live-byte budget that raises torch's OOM error)."""

from __future__ import annotations

import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fitcheck.integrations.tuner import set_trainer_micro_batch  # noqa: E402
from fitcheck.integrations.tuner_search import is_oom_error, search_largest  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402


def _oom(m: int) -> Exception:
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate a batch of {m}")


def threshold_step(true_max: int) -> Any:
    def step(m: int) -> None:
        if m > true_max:
            raise _oom(m)

    return step


def hf_search(step: Any, start: int) -> tuple[int, int]:
    """accelerate's find_executable_batch_size on the same step: (result, trials)."""
    from accelerate.utils import find_executable_batch_size

    trials = []

    @find_executable_batch_size(starting_batch_size=start)
    def run(batch_size: int) -> int:
        trials.append(batch_size)
        step(batch_size)
        return batch_size

    return run(), len(trials)


@pytest.mark.parametrize(
    ("predicted", "true_max", "max_trials"),
    [(12, 12, 2), (13, 12, 2), (11, 12, 3), (40, 12, 10), (3, 12, 10), (1, 1, 2), (5, 0, 4)],
)
def test_tuner_finds_the_true_max(predicted: int, true_max: int, max_trials: int) -> None:
    result = search_largest(threshold_step(true_max), predicted, clear_cache=lambda: None)
    assert result.size == true_max
    assert result.trials <= max_trials
    assert result.history[0].size == max(1, predicted)


def test_tuner_respects_upper_bound_in_one_trial() -> None:
    result = search_largest(threshold_step(100), 16, upper=16, clear_cache=lambda: None)
    assert (result.size, result.trials) == (16, 1)


def test_runtime_error_oom_form_is_recognised_and_other_errors_propagate() -> None:
    assert is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom_error(RuntimeError("shape mismatch"))

    def bad(m: int) -> None:
        raise ValueError("not an OOM")

    with pytest.raises(ValueError):
        search_largest(bad, 4, clear_cache=lambda: None)


def test_hf_tuner_on_the_same_budget_shrinks_by_tenths() -> None:
    # Pinned accelerate behaviour: x0.9 per OOM from the starting size, never upward.
    result, trials = hf_search(threshold_step(12), 64)
    assert result <= 12 and trials > 10
    ours = search_largest(threshold_step(12), 12, clear_cache=lambda: None)
    assert ours.size == 12 and ours.trials == 2


class BudgetMode(TorchDispatchMode):
    """A simulated GPU: counts live storage bytes created under it, raises torch's OOM past a budget."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key = id(st)
                if key in self._live:
                    continue
                n = st.nbytes()
                self._live[key] = n
                self.current += n
                weakref.finalize(st, self._free, key)
                self.peak = max(self.peak, self.current)
                if self.current > self.budget:
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate {n} bytes (simulated budget {self.budget})"
                    )
        return out

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)


def tiny_step_fn(budget: int) -> Any:
    """One real training step of a tiny MLP language model under the simulated budget."""
    torch.manual_seed(0)
    vocab, h, seq = 256, 32, 32
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, h),
        torch.nn.Linear(h, 4 * h),
        torch.nn.GELU(),
        torch.nn.Linear(4 * h, vocab),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    ids = torch.randint(0, vocab, (256, seq))

    def step(m: int) -> None:
        with BudgetMode(budget):
            logits = model(ids[:m])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:m].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            for (
                state
            ) in opt.state.values():  # states live outside the mode between steps: re-create each trial
                state.clear()
            del logits, loss

    return step


def true_max(step: Any, limit: int = 256) -> int:
    """Reference answer by plain bisection over [0, limit] (memory grows with the batch)."""
    lo, hi = 0, limit + 1  # lo runs (0 trivially), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            step(mid)
            lo = mid
        except torch.OutOfMemoryError:
            hi = mid
    return lo


def test_tuner_on_a_real_tracked_step_matches_the_scan() -> None:
    step = tiny_step_fn(budget=2 * 1024**2)
    truth = true_max(step, 40)
    assert 2 < truth < 40, truth
    for predicted, limit in ((truth, 2), (truth + 1, 2), (truth - 1, 3), (truth * 3, 8)):
        # no gc.collect() between trials (the default clear, 21 calls of ~0.3 s in a process that imported the
        # libraries): the simulated budget counts this trial's tensors only; tune_micro_batch's runs keep the default
        r = search_largest(step, predicted, clear_cache=lambda: None)
        assert r.size == truth
        assert r.trials <= limit
    hf_result, _ = hf_search(step, 24)
    assert hf_result <= truth


def test_set_trainer_micro_batch_keeps_global_batch_and_deepspeed_keys() -> None:
    class Args:
        per_device_train_batch_size = 8
        gradient_accumulation_steps = 2
        world_size = 4
        n_gpu = 1

        class hf_deepspeed_config:
            config: dict[str, object] = {  # noqa: RUF012
                "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": 2,
                "train_batch_size": 64,
                "zero_optimization": {"stage": 3},
            }

    class Trainer:
        args = Args()
        _train_batch_size = 8

    trainer = Trainer()
    got = set_trainer_micro_batch(trainer, 4)
    cfg = Args.hf_deepspeed_config.config
    assert (got.micro_batch, got.grad_accum, got.exact) == (4, 4, True)
    assert (
        cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 4
        == cfg["train_batch_size"]
    )
    assert cfg["train_batch_size"] == 64 and trainer._train_batch_size == 4
    got = set_trainer_micro_batch(trainer, 3)  # 16 per GPU is not a multiple of 3: 2 x 8 keeps it exactly
    assert (got.micro_batch, got.grad_accum) == (2, 8)
