"""Part 1 of ``tuner_vs_hf.py``: the tuner and HF's ``auto_find_batch_size`` on real Trainers (CPU, tiny Llama).

See ``tuner_vs_hf.py`` for what is compared; the configurations and the simulated GPU are in ``tuner_budget.py``.
Run: ``PYTHONPATH=. python benchmarks/tuner_vs_hf.py --part 1``.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from fitcheck.integrations import TuningError, divisors, tune_micro_batch
from tuner_budget import CONFIGS, MAX_STEPS, SEQ, Config, budget_for, build_trainer, real_peak


class Watch(transformers.TrainerCallback):  # type: ignore[misc]
    """Counts training starts and optimizer steps; checks the weights at each start against the initial ones."""

    def __init__(self) -> None:
        self.initial: dict[str, Any] = {}
        self.starts = 0
        self.steps = 0
        self.last_start_initial: bool | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
        self.starts += 1
        self.last_start_initial = all(torch.equal(p, self.initial[n]) for n, p in model.named_parameters())
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
        self.steps += 1
        return control


def watched(config: Config, out: str, **kw: Any) -> tuple[Any, Watch]:
    watch = Watch()
    trainer = build_trainer(config, out, max_steps=MAX_STEPS, callbacks=[watch], **kw)
    watch.initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return trainer, watch



@dataclass
class Outcome:
    micro: int
    accum: int
    attempts: int
    ooms: int
    steps: int
    from_initial: bool | None
    trials: str = ""


def ours(config: Config, out: str, budget: int) -> tuple[Outcome, int]:
    trainer, watch = watched(config, out)
    with budget_for(trainer.model, budget) as mode:
        try:
            result = tune_micro_batch(trainer, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
        except TuningError as exc:
            return Outcome(0, 0, len(exc.trials), mode.ooms, 0, None), 0
        trials = ", ".join(f"{t.micro_batch}x{t.grad_accum} " + (f"ok {t.peak_bytes / 2**20:.2f}M" if t.fits else "OOM")
                           for t in result.trials)
        trainer.train()
    return Outcome(result.micro_batch, result.grad_accum, len(result.trials), mode.ooms, watch.steps,
                   watch.last_start_initial, trials), result.predicted_micro_batch


def hf(config: Config, out: str, budget: int) -> Outcome:
    trainer, watch = watched(config, out, auto_find_batch_size=True)
    with budget_for(trainer.model, budget) as mode:
        try:
            trainer.train()
        except RuntimeError:  # "No executable batch size found, reached zero."
            return Outcome(0, 0, watch.starts, mode.ooms, watch.steps, None)
    micro = int(trainer._train_batch_size)
    return Outcome(micro, int(trainer.args.gradient_accumulation_steps), watch.starts, mode.ooms, watch.steps,
                   watch.last_start_initial)


def cells(o: Outcome, per_gpu: int) -> str:
    kept = "yes" if o.micro * o.accum == per_gpu else "no"
    init = {True: "yes", False: "no", None: "-"}[o.from_initial]
    return f"{o.micro:2d}x{o.accum:<2d} {o.attempts:3d} {o.ooms:3d} {o.steps:5d} {kept:>4} {init:>4}"


def real_trainers() -> int:
    t0 = time.perf_counter()
    header = (f"{'config':24} {'budget':>8} {'true':>5} | {'pred':>4} {'ours':>5} {'tri':>3} {'OOM':>3} {'steps':>5} "
              f"{'glob':>4} {'init':>4} | {'HF':>5} {'att':>3} {'OOM':>3} {'steps':>5} {'glob':>4} {'init':>4}")
    print("Part 1: real transformers Trainers on CPU under a simulated GPU (max_steps = 2)")
    print(header)
    print("-" * len(header))
    details: list[str] = []
    good = 0
    with tempfile.TemporaryDirectory() as out:
        for config in CONFIGS:
            per_gpu = config.micro * config.accum
            sizes = divisors(per_gpu)
            peaks = [real_peak(config, out, m) for m in sizes]
            budget = (peaks[config.target] + peaks[config.target + 1]) // 2
            truth = max((m for m, p in zip(sizes, peaks, strict=True) if p <= budget), default=0)
            mine, predicted = ours(config, out, budget)
            theirs = hf(config, out, budget)
            ok = mine.micro == truth and (predicted != truth or mine.attempts <= 2)
            good += ok

            print(f"{config.name:24} {budget / 2**20:7.2f}M {truth:5d} | {predicted:4d} "
                  f"{cells(mine, per_gpu)} | {cells(theirs, per_gpu)}")
            listed = ", ".join(f"{m}:{p / 2**20:.2f}M" for m, p in zip(sizes, peaks, strict=True))
            details.append(f"{config.name:24} peaks {listed}"
                           f"\n{'':24} tuner trials: {mine.trials}")
    print("-" * len(header))
    print(f"tuner on the true maximum (<= 2 trials when predicted exactly): {good} of {len(CONFIGS)}  "
          f"({time.perf_counter() - t0:.0f} s)")
    print("\nPer-config real peaks (micro-batch: live-byte peak of a real 2-step run) and the tuner's trials:")
    print("\n".join(details))
    return 0 if good == len(CONFIGS) else 1
