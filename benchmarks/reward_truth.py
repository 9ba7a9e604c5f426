"""Real TRL 1.16 ``RewardTrainer`` runs on CPU vs the formula (``core/trainers/reward_step.py``).

Each case is ``benchmarks/trl_truth.py``'s reward case (a tiny random model loaded as
``AutoModelForSequenceClassification`` with ``num_labels=1``, 2 pairs of chosen + rejected rows, bf16 + TRL's bf16
autocast, AdamW) on the tiny Llama and the tiny GPT-2 (dropout 0.1, which ``RewardConfig.disable_dropout`` zeroes),
full and LoRA (r 16, all-linear, peft's ``SEQ_CLS`` task), with and without gradient checkpointing; and two cases
of a wider Llama (``trl_replay.WIDE``: h 512, I 1376, 4 layers) at 2 pairs x 192 tokens that the formula's
per-token terms were not read off.

* ``real``: the live-tensor peak over three steps (``trl_replay.measure_run``: the model's parameters, buffers and
  optimizer states and every tensor the steps create);
* ``formula``: ``core.estimate`` of ``trl_truth.spec_for(case)`` (``peak_allocated_bytes``);
* ``replay``: the whole-run replay of the spec (``trl_replay.replay_peaks``: the seq-cls step traced,
  ``replay_step_args.run_trace_kwargs``): its peak and the last step's.

Run: ``PYTHONPATH=. python benchmarks/reward_truth.py [name-substring ...] [--out benchmarks/data/reward_cpu.json]``
(``--out`` keeps the file's rows of the cases not run; ``--no-real`` keeps each row's recorded ``real`` and
recomputes the rest).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_replay import WIDE, measure_run, replay_peaks
from trl_truth import GPT2, LLAMA, TRL_LORA, Case, spec_for

from fitcheck.core import estimate
from fitcheck.spec import TrainerKind

_MODELS = (("llama", LLAMA), ("gpt2", GPT2))
CASES: tuple[Case, ...] = (
    *(Case(f"{name} reward {'LoRA' if lora else 'full'}{'' if ckpt else ' no-ckpt'}", TrainerKind.REWARD,
           length=64, lora=TRL_LORA if lora else None, ckpt=ckpt, model=model)
      for name, model in _MODELS for lora in (False, True) for ckpt in (True, False)),
    Case("wide reward full no-ckpt", TrainerKind.REWARD, length=192, ckpt=False, model=WIDE),
    Case("wide reward LoRA no-ckpt", TrainerKind.REWARD, length=192, lora=TRL_LORA, ckpt=False, model=WIDE),
)
# The cases whose peak the reward step's moments describe (core/trainers/reward_step.py); the others' peaks are
# the plain step's own moments (checkpointed recomputes, the optimizer step) or LayerNorm-block backward moments
# not modelled for this step (the report of branch s18-reward)
MODELLED = ("llama reward full no-ckpt", "llama reward LoRA no-ckpt", "gpt2 reward LoRA no-ckpt",
            "wide reward full no-ckpt", "wide reward LoRA no-ckpt")


def row(case: Case, real: dict[str, int] | None = None) -> dict[str, Any]:
    """One table row (bytes); ``real``: the recorded real peaks instead of a new run."""
    spec = spec_for(case)
    return {"case": case.name, "formula": estimate(spec).peak_allocated_bytes, "replay": replay_peaks(spec),
            "real": real or measure_run(case)}


def main(argv: list[str]) -> int:
    out = None
    if "--out" in argv:
        at = argv.index("--out")
        out, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    recorded = {}
    if "--no-real" in argv:
        argv = [a for a in argv if a != "--no-real"]
        recorded = {r["case"]: r["real"] for r in json.loads(Path(out or "").read_text())["rows"]}
    rows = [row(c, recorded.get(c.name)) for c in CASES if not argv or any(a in c.name for a in argv)]
    print(f"{'case':<32} {'real':>12} {'formula':>12} {'formula/real':>12} {'replay':>12} {'replay/real':>12}")
    for r in rows:
        real, rep = r["real"]["peak"], r["replay"]["peak"]
        print(f"{r['case']:<32} {real:>12,} {r['formula']:>12,} {r['formula'] / real - 1:>+11.2%} {rep:>12,} "
              f"{rep / real - 1:>+11.2%}")
    if out:
        data = json.loads(Path(out).read_text()) if Path(out).exists() else {}
        ran = {r["case"] for r in rows}
        order = [c.name for c in CASES]
        data["rows"] = sorted([r for r in data.get("rows", []) if r["case"] not in ran] + rows,
                              key=lambda r: order.index(r["case"]) if r["case"] in order else len(order))
        Path(out).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
