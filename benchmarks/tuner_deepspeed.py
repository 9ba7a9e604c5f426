"""tune_micro_batch on a real transformers Trainer under a REAL DeepSpeed 0.19.8 engine (CPU, one process, gloo).

For each ZeRO stage: the tiny Llama of ``benchmarks/tuner_budget.py`` (bf16 under DeepSpeed, AdamW with
``torch_adam``, small buckets so the activations decide the peak, as in ``benchmarks/deepspeed_cpu.py``),
per-GPU batch 8 × 2. The true maximum comes from real DeepSpeed training runs (2 optimizer steps, engine
preparation included) under the simulated GPU of ``tuner_budget.BudgetMode``; the budget lies half-way between
the peaks of 2 × 8 and 4 × 4 (true maximum 2). Then, on a fresh Trainer under that budget:
``tune_micro_batch(trainer)`` (an engine per trial, torn down) and ``trainer.train()``; next to it, an untuned
Trainer at the size found, same seed. Columns: the true maximum, the prediction, the size found and its trials,
the DeepSpeed batch keys ``train()``'s engine ran with, optimizer steps, the peak of the tuned and the untuned
``train()`` (equal: the trials leave nothing behind), and whether the parameters at ``on_train_begin`` and after
training equal the untuned run's bit for bit.

Run: ``PYTHONPATH=. python benchmarks/tuner_deepspeed.py [stage ...]`` (default 1 2 3; one process per stage,
since DeepSpeed initialises torch.distributed). ``--json STAGE`` prints one stage's row as JSON (the test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

BUCKET = 20_000  # elements: ZeRO's 5e8-element default buckets would be the whole simulated GPU
MAX_STEPS = 2


def ds_config(stage: int) -> dict[str, Any]:
    """A DeepSpeed config with the batch keys on ``auto`` (filled from the TrainingArguments).

    The three stages cover the three optimizer/scheduler paths of transformers' ``deepspeed_optim_sched``:
    ZeRO-1 the Trainer's own AdamW and scheduler (no ``optimizer`` section), ZeRO-2 DeepSpeed's AdamW with the
    Trainer's scheduler, ZeRO-3 DeepSpeed's AdamW and ``WarmupLR`` (``auto`` keys filled per engine).
    """
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto", "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET,
                              "stage3_prefetch_bucket_size": BUCKET, "stage3_param_persistence_threshold": 0},
    }
    if stage >= 2:
        config["optimizer"] = {"type": "AdamW",
                               "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}
    if stage == 3:
        config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                              "warmup_num_steps": "auto"}}
    return config


def _env(stage: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gloo_rank import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    warnings.filterwarnings("ignore")


def run_stage(stage: int, out: str) -> dict[str, Any]:
    """Scan, tune, train, and the untuned reference, for one ZeRO stage (see the module docstring)."""
    _env(stage)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    import transformers
    from fitcheck.integrations import TuningError, divisors, tune_micro_batch
    from tuner_budget import SEQ, Config, budget_for, build_trainer

    class Record(transformers.TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.start: list[Any] = []
            self.steps = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
            self.start = [_full(p).clone() for p in model.parameters()]
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            self.steps += 1
            return control

    def _full(p: Any) -> Any:  # ZeRO-3: one process holds the whole partition in ds_tensor
        ds = getattr(p, "ds_tensor", None)
        return (ds if ds is not None else p).detach()

    config = Config(f"DeepSpeed ZeRO-{stage}, 8 x 2", 8, 2, target=1,
                    extra={"deepspeed": ds_config(stage), "bf16": True, "weight_decay": 0.1})
    per_gpu = config.micro * config.accum
    sizes = divisors(per_gpu)

    def train(micro: int, budget: int, tune: bool) -> dict[str, Any]:
        record = Record()
        trainer = build_trainer(config, out, micro=micro, accum=per_gpu // micro, max_steps=MAX_STEPS,
                                callbacks=[record])
        row: dict[str, Any] = {}
        with budget_for(trainer.model, budget) as mode:
            if tune:
                result = tune_micro_batch(trainer, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
                row.update(micro=result.micro_batch, accum=result.grad_accum,
                           predicted=result.predicted_micro_batch,
                           trials=[(t.micro_batch, t.grad_accum, t.fits) for t in result.trials])
            mode.peak = mode.current
            output = trainer.train()
        engine = trainer.model_wrapped
        row.update(peak=mode.peak, steps=record.steps, global_step=output.global_step, start=record.start,
                   end=[_full(p).clone() for p in trainer.model.parameters()],
                   engine_batch=(engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
                                 engine.train_batch_size()),
                   config_batch=tuple(trainer.args.hf_deepspeed_config.config[k] for k in (
                       "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")))
        return row

    unbounded = 10**12
    low, high = (train(m, unbounded, False)["peak"] for m in sizes[config.target: config.target + 2])
    budget = (low + high) // 2
    tuned = train(config.micro, budget, True)
    untuned = train(tuned["micro"], unbounded, False)
    nothing: dict[str, Any] = {}
    if stage == 2:  # nothing fits: the parameters alone fill the simulated GPU
        trainer = build_trainer(config, out, max_steps=MAX_STEPS)
        tight = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) + 1024
        before = dict(trainer.args.hf_deepspeed_config.config)
        hooks = _hook_count(trainer.model)
        try:
            with budget_for(trainer.model, tight):
                tune_micro_batch(trainer, gpu_memory=tight, device_type="cpu", max_seq_length=SEQ)
            nothing = {"raised": False}
        except TuningError as exc:
            nothing = {"raised": True, "trials": len(exc.trials),
                       "args_kept": (trainer.args.per_device_train_batch_size,
                                     trainer.args.gradient_accumulation_steps) == (config.micro, config.accum),
                       "config_kept": dict(trainer.args.hf_deepspeed_config.config) == before,
                       "hooks_kept": _hook_count(trainer.model) == hooks}
    return {
        "stage": stage, "budget": budget, "true": sizes[config.target], "predicted": tuned["predicted"],
        "micro": tuned["micro"], "accum": tuned["accum"], "trials": tuned["trials"],
        "engine_batch": tuned["engine_batch"], "config_batch": tuned["config_batch"],
        "steps": tuned["steps"], "global_step": tuned["global_step"],
        "peak_tuned": tuned["peak"], "peak_untuned": untuned["peak"],
        "start_equal": all(torch.equal(a, b) for a, b in zip(tuned["start"], untuned["start"], strict=True)),
        "end_equal": all(torch.equal(a, b) for a, b in zip(tuned["end"], untuned["end"], strict=True)),
        "nothing_fits": nothing,
    }


def _hook_count(model: Any) -> int:
    """Forward/backward hooks on the model's modules and parameters (a failed engine build must leave none)."""
    names = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
             "_post_accumulate_grad_hooks")
    owners = [*model.modules(), *model.parameters()]
    return sum(len(getattr(o, n, None) or {}) for o in owners for n in names)


def measure(stage: int) -> dict[str, Any]:
    """:func:`run_stage` in its own process (DeepSpeed initialises torch.distributed for the process)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--json", str(stage)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ZeRO-{stage} run failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(stages: list[int]) -> int:
    """Print the table; exit 1 when a row misses the true maximum or does not start from the same bits."""
    print(f"{'stage':7} {'true':>4} {'pred':>4} {'found':>6} {'trials':24} {'engine m/G/B':>13} {'steps':>5} "
          f"{'peak tuned/untuned':>20} {'start=':>6} {'end=':>5}")
    bad = 0
    for stage in stages:
        r = measure(stage)
        trials = " ".join(f"{m}x{g}{'ok' if ok else 'OOM'}" for m, g, ok in r["trials"])
        engine = "/".join(str(x) for x in r["engine_batch"])
        ok = (r["micro"] == r["true"] and r["start_equal"] and r["end_equal"]
              and r["steps"] == MAX_STEPS and r["peak_tuned"] == r["peak_untuned"])
        bad += not ok
        print(f"ZeRO-{stage:<2} {r['true']:4d} {r['predicted']:4d} {r['micro']:>3}x{r['accum']:<2} {trials:24} "
              f"{engine:>13} {r['steps']:5d} {r['peak_tuned'] / 2**20:9.3f}/{r['peak_untuned'] / 2**20:.3f}M "
              f"{r['start_equal']!s:>6} {r['end_equal']!s:>5}" + ("" if ok else "   <- off"))
        if r["nothing_fits"]:
            print(f"        nothing fits: {r['nothing_fits']}")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--json"]:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_stage(int(sys.argv[2]), tmp)))
        sys.exit(0)
    sys.exit(main([int(a) for a in sys.argv[1:]] or [1, 2, 3]))
