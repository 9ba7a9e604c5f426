"""A real TRL 1.16 ``GRPOTrainer`` under DeepSpeed 0.19.8 (ZeRO-2/3) or accelerate FSDP (2/1) on the CPU (one gloo
process), for tests/test_tuner_grpo.py (run as a script: DeepSpeed and FSDP initialise ``torch.distributed``).

``python tests/grpo_sharded_cpu.py PORT OUT BACKEND`` (``zero2``, ``zero3``, ``fsdp2``, ``fsdp1``; FSDP with what
accelerate sets only on GPUs set on the CPU, benchmarks/gloo_rank.py ``fsdp_on_cpu``, as tests/fsdp_trainer_cpu.py
does): the real peaks of untuned ``train()`` runs at 2 × 4 and 4 × 2 under the simulated allocator
(benchmarks/tuner_budget.py ``budget_for``: a live-byte limit that raises torch's out-of-memory error), a budget
half-way between them (so 2 is the true maximum), ``tune_micro_batch`` on a fresh Trainer at 8 × 1 under that
budget, ``train()`` under it, and an untuned run at the size found. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any


def main(port: str, out: str, backend: str) -> dict[str, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    warnings.filterwarnings("ignore")
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "benchmarks"), str(root / "tests"), str(root)]
    import torch
    from fitcheck.integrations import tune_micro_batch
    from test_tuner_grpo import SEQ, build_grpo
    from tuner_budget import UNBOUNDED, budget_for
    from tuner_deepspeed import ds_config

    extra: dict[str, Any]
    if backend.startswith("zero"):
        config = ds_config(int(backend[-1]))
        config["bf16"] = {"enabled": False}  # fp32 as tests/test_tuner_grpo.py's runs
        extra = {"deepspeed": config}
        from gloo_rank import without_deepspeed_shm_comm

        without_deepspeed_shm_comm()
    else:
        from gloo_rank import install_fsdp_on_cpu_trainer

        install_fsdp_on_cpu_trainer()
        version = int(backend[-1])
        fsdp_config: dict[str, Any] = {"fsdp_version": version, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
        if version == 1:
            fsdp_config["sync_module_states"] = False  # see tests/fsdp_trainer_cpu.py
        extra = {"fsdp": "full_shard auto_wrap", "fsdp_config": fsdp_config}

    def build(micro: int) -> Any:
        return build_grpo(out, micro, 8 // micro, **extra)

    def peak(micro: int) -> int:
        trainer = build(micro)
        with budget_for(trainer.model, UNBOUNDED) as mode:
            trainer.train()
        return int(mode.peak)

    low, high = peak(2), peak(4)
    budget = (low + high) // 2
    tuned = build(8)
    row: dict[str, Any] = {"sharded": bool(tuned.is_deepspeed_enabled or tuned.is_fsdp_enabled), "peaks": [low, high]}
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
    from torch.distributed.tensor import DTensor

    def full(model: Any) -> dict[str, Any]:
        return {n: p.full_tensor() if isinstance(p, DTensor) else p for n, p in model.named_parameters()}

    a, b = full(tuned.model), full(untuned.model)
    row["equal"] = a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return row


if __name__ == "__main__":
    res = main(sys.argv[1], sys.argv[2], sys.argv[3])
    print("GRPO_SHARDED_RESULT " + json.dumps(res), flush=True)
    sys.stderr.flush()
    os._exit(0)
