"""A real TRL 1.16 ``GRPOTrainer`` under DeepSpeed 0.19.8 ZeRO-2 or ZeRO-3 on the CPU (one gloo process), for
tests/test_tuner_grpo.py (run as a script: DeepSpeed initialises ``torch.distributed`` in the process).

``python tests/grpo_deepspeed_cpu.py PORT OUT [STAGE]`` (stage 2 by default): the real peaks of untuned
``train()`` runs at 2 × 4 and 4 × 2 under the simulated allocator (benchmarks/tuner_budget.py ``budget_for``: a
live-byte limit that raises torch's out-of-memory error), a budget half-way between them (so 2 is the true
maximum), ``tune_micro_batch`` on a fresh Trainer at 8 × 1 under that budget, ``train()`` under it, and an
untuned run at the size found. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any


def main(port: str, out: str, stage: int = 2) -> dict[str, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    warnings.filterwarnings("ignore")
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "benchmarks"), str(root / "tests"), str(root)]
    import torch
    from fitcheck.integrations import tune_micro_batch
    from test_tuner_grpo import SEQ, build_grpo
    from tuner_budget import UNBOUNDED, budget_for
    from tuner_deepspeed import ds_config

    config = ds_config(stage)
    config["bf16"] = {"enabled": False}  # fp32 as tests/test_tuner_grpo.py's runs

    def build(micro: int) -> Any:
        return build_grpo(out, micro, 8 // micro, deepspeed=config)

    def peak(micro: int) -> int:
        trainer = build(micro)
        with budget_for(trainer.model, UNBOUNDED) as mode:
            trainer.train()
        return int(mode.peak)

    low, high = peak(2), peak(4)
    budget = (low + high) // 2
    tuned = build(8)
    row: dict[str, Any] = {"deepspeed": bool(tuned.is_deepspeed_enabled), "peaks": [low, high]}
    rng = torch.get_rng_state()
    with budget_for(tuned.model, budget) as mode:
        result = tune_micro_batch(tuned, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
        row.update(trials=[[t.micro_batch, t.fits, t.peak_bytes] for t in result.trials],
                   predicted=result.predicted_micro_batch,
                   batch=[tuned.args.per_device_train_batch_size, tuned.args.gradient_accumulation_steps,
                          tuned.args.steps_per_generation, tuned.args.generation_batch_size],
                   restored=[tuned._step == 0, tuned._buffered_inputs is None,
                             tuned.generation_config.min_new_tokens is None, tuned.optimizer is None,
                             bool(torch.equal(torch.get_rng_state(), rng))])
        mode.peak = mode.current
        ooms = mode.ooms  # the trial at 4 ran out of memory; train() at the size found must not
        tuned.train()
    row.update(train_ooms=mode.ooms - ooms, steps=tuned.state.global_step)
    untuned = build(result.micro_batch)
    untuned.train()
    a, b = dict(tuned.model.named_parameters()), dict(untuned.model.named_parameters())
    row["equal"] = all(torch.equal(a[n], b[n]) for n in a)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return row


if __name__ == "__main__":
    res = main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    print("GRPO_DS_RESULT " + json.dumps(res), flush=True)
    sys.stderr.flush()
    os._exit(0)
