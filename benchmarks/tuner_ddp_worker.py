"""One rank of a 2-process DDP tuning run on CPU (gloo), started by ``torch.distributed.run``.

Rank r tunes under its own simulated budget (rank 1's is smaller); every rank must set the same micro-batch,
the one that fits on the tightest rank. Writes ``{rank: [micro, accum, trials, params_equal]}`` lines to the
file given as the first argument. Used by tests/test_tuner_trainer.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from fitcheck.integrations import tune_micro_batch
from gloo_rank import finish_rank
from tuner_budget import CONFIGS, SEQ, budget_for, build_trainer


def main() -> None:
    out, budgets = sys.argv[1], [int(b) for b in sys.argv[2:4]]
    rank = int(os.environ["RANK"])
    trainer = build_trainer(CONFIGS[0], os.path.dirname(out))
    initial = [p.detach().clone() for p in trainer.model.parameters()]
    with budget_for(trainer.model, budgets[rank]):
        result = tune_micro_batch(trainer, gpu_memory=budgets[rank], device_type="cpu", max_seq_length=SEQ)
    same = all(torch.equal(a, p) for a, p in zip(initial, trainer.model.parameters(), strict=True))
    args = trainer.args
    import torch.distributed as dist

    row = [args.per_device_train_batch_size, args.gradient_accumulation_steps, len(result.trials), same,
           dist.is_initialized(), args.world_size, str(trainer.accelerator.distributed_type)]
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump(row, fh)


if __name__ == "__main__":
    main()
    finish_rank()
