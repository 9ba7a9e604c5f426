"""One rank of a 2-process DeepSpeed ZeRO-2 tuning run on CPU (gloo), started by ``torch.distributed.run``.

Both ranks tune under the same simulated budget (``tuner_budget.BudgetMode``), then train. Writes
``[micro, accum, trials, engine micro/accum/train_batch_size, global_step, world]`` to ``<out>.<rank>``.
Used by tests/test_tuner_deepspeed.py.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fitcheck.integrations import tune_micro_batch
from gloo_rank import finish_rank
from tuner_budget import SEQ, Config, budget_for, build_trainer
from tuner_deepspeed import MAX_STEPS, ds_config


def main() -> None:
    warnings.filterwarnings("ignore")
    out, budget = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["RANK"])
    config = Config("DeepSpeed ZeRO-2 x2, 8 x 2", 8, 2, extra={"deepspeed": ds_config(2), "bf16": True})
    trainer = build_trainer(config, os.path.dirname(out), max_steps=MAX_STEPS)
    with budget_for(trainer.model, budget):
        result = tune_micro_batch(trainer, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
        output = trainer.train()
    engine = trainer.model_wrapped
    row = [result.micro_batch, result.grad_accum, [(t.micro_batch, t.fits) for t in result.trials],
           [engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
            engine.train_batch_size()], output.global_step, trainer.args.world_size]
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump(row, fh)


if __name__ == "__main__":
    main()
    finish_rank()
