"""A DeepSpeed config's own ``optimizer`` / ``scheduler`` sections on the REAL engine (deepspeed 0.19.8, CPU, gloo, one
process), against ``fitcheck/readers/deepspeed_optimizer.py``: what ``deepspeed.initialize`` builds or refuses, and
the tiny Llama's live-tensor peaks with the section's optimizer (``benchmarks/deepspeed_cpu.py`` ``CASES``
``zero2-fusedadam-optim-8bit``, ``zero2-sgd-momentum``, ``zero1-adagrad``) against the estimate, before (the run's
``optim``, two Trainer parameter groups) and after (the section's optimizer, one group).

What runs here: FusedAdam (deepspeed's CPU ``fused_adam`` op, prebuilt), torch SGD / Adagrad / AdamW. What does not:
DeepSpeedCPUAdam / CPUAdagrad / CPULion (their ops are not built here), FusedLion ("This op had not been implemented
on CPU backend"), FusedLamb (CUDA only), MuonWithAuxAdam, mup's optimizers (mup not installed).

Run: ``PYTHONPATH=. python benchmarks/deepspeed_optimizer_cpu.py [--record]`` (``--record`` writes
``benchmarks/data/deepspeed_optimizer_cpu.json``, read by ``tests/test_deepspeed_optimizer.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "deepspeed_optimizer_cpu.json"

# Configs deepspeed.initialize is given (with train_micro_batch_size_per_gpu 1) over a tiny nn.Linear.
REFUSALS: dict[str, dict[str, Any]] = {
    "sgd-zero2-untested": {"zero_optimization": {"stage": 2}, "optimizer": {"type": "SGD", "params": {"lr": 1e-3}}},
    "sgd-zero2-allowed": {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
                          "optimizer": {"type": "SGD", "params": {"lr": 1e-3, "momentum": 0.9}}},
    "sgd-lower-case": {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
                       "optimizer": {"type": "sgd", "params": {"lr": 1e-3}}},
    "onebitadam": {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
                   "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}}},
    "max-grad-norm": {"zero_optimization": {"stage": 2},
                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}},
    "fusedadam-amsgrad": {"zero_optimization": {"stage": 2},
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "amsgrad": True}}},
    "unknown-scheduler": {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                          "scheduler": {"type": "WarmupLinear", "params": {}}},
    "adamw-warmuplr": {"zero_optimization": {"stage": 2}, "optimizer": {"type": "ADAMW", "params": {"lr": 1e-3}},
                       "scheduler": {"type": "WarmupLR", "params": {}}},
    "adam-torch-adam": {"zero_optimization": {"stage": 1},
                        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True,
                                                                 "adam_w_mode": False}}},
    "adagrad-zero1": {"zero_optimization": {"stage": 1}, "optimizer": {"type": "Adagrad", "params": {"lr": 1e-3}}},
    "rmsprop-stage0": {"zero_optimization": {"stage": 0}, "optimizer": {"type": "RMSprop", "params": {"lr": 1e-3}}},
}
CASES = ("zero2-fusedadam-optim-8bit", "zero2-sgd-momentum", "zero1-adagrad")


def real_outcomes() -> dict[str, str]:
    """What the real ``deepspeed.initialize`` does with each :data:`REFUSALS` config: the exception's type and
    message, or ``built <basic optimizer class>``."""
    from benchmarks.gloo_rank import free_port, without_deepspeed_shm_comm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    warnings.filterwarnings("ignore")
    without_deepspeed_shm_comm()
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    out: dict[str, str] = {}
    for name, cfg in REFUSALS.items():
        model = torch.nn.Linear(8, 8)
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                              config={"train_micro_batch_size_per_gpu": 1, **cfg})
            out[name] = f"built {type(engine.basic_optimizer).__name__}"
        except Exception as exc:  # the outcome is what is recorded
            out[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return out


def estimates(case: str) -> dict[str, list[int]]:
    """Forward, backward and optimizer-step device bytes of a case's estimate, before and after."""
    from dataclasses import replace

    from benchmarks.deepspeed_cpu import CASES as DS_CASES
    from benchmarks.deepspeed_cpu import TINY, run_spec
    from fitcheck.core import estimate
    from fitcheck.report import Location, Phase
    from fitcheck.spec import OptimizerSpec

    kw = {"config": TINY, **DS_CASES[case]}
    after = run_spec(**kw)
    ds = replace(after.sharding.deepspeed, optimizer_class=None)
    before = replace(after, optimizer=OptimizerSpec(kw["optim"]), sharding=replace(after.sharding, deepspeed=ds))
    out = {}
    for label, spec in (("before", before), ("after", after)):
        rep = estimate(spec)
        tot = {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}
        out[label] = [tot[Phase.FORWARD_END], max(tot[Phase.BACKWARD_START], tot[Phase.BACKWARD]),
                      tot[Phase.OPTIMIZER_STEP]]
    return out


def main(argv: list[str]) -> int:
    """Print (and with ``--record`` write) the real outcomes and the peaks against the estimates."""
    script = Path(__file__).parent / "deepspeed_cpu.py"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.run([sys.executable, __file__, "--outcomes"], capture_output=True, text=True, check=True,
                          env=env)
    outcomes = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, what in outcomes.items():
        print(f"{name:22} {what}")
    peaks: dict[str, list[int]] = {}
    for case in CASES:
        proc = subprocess.run([sys.executable, str(script), "--measure-case", case], capture_output=True, text=True,
                              check=True, env=env)
        peaks[case] = [int(x) for x in proc.stdout.strip().splitlines()[-1].split()]
        est = estimates(case)
        for i, phase in enumerate(("forward", "backward", "optimizer")):
            real = peaks[case][i]
            print(f"{case:28} {phase:10} real {real:>10,} " + "  ".join(
                f"{k} {v[i]:>10,} ({(v[i] - real) / real * 100:+6.2f} %)" for k, v in est.items()))
    if "--record" in argv:
        DATA.write_text(json.dumps({"deepspeed": "0.19.8", "outcomes": outcomes, "peaks": peaks}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--outcomes"]:
        print(json.dumps(real_outcomes()))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
