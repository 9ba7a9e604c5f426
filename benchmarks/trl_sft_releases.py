"""A real ``SFTTrainer`` of an older TRL release on CPU vs the fitcheck estimate at ``--stack trl=<that release>``.

TRL 0.15 - 1.6's ``SFTTrainer.compute_loss`` runs the model's own loss and then its metrics (token accuracy,
entropy from 0.22) over the full logits (``fitcheck/core/trainers/sft_metrics.py``). The installed TRL is 1.16 (the
fused LM head), so the real old trainer runs in a side virtual environment that reuses the main venv's torch
through a ``.pth`` file (never another torch), e.g. for TRL 0.24.0::

    python -m venv /tmp/venv_trl24
    echo /work/venvs/main/lib/python3.11/site-packages > /tmp/venv_trl24/lib/python3.11/site-packages/zz_main.pth
    /tmp/venv_trl24/bin/pip install trl==0.24.0 transformers==4.57.1 accelerate==1.10.1 peft==0.17.1 \\
        "huggingface_hub<1.0" "tokenizers>=0.22,<0.23"
    PYTHONPATH=. /tmp/venv_trl24/bin/python benchmarks/trl_sft_releases.py --record

``--record`` measures each case with ``benchmarks/trl_truth.py``'s harness (tiny Llama, bf16 weights, TRL's bf16
autocast, live-tensor peak of the second optimizer step) and writes ``benchmarks/data/trl_sft_releases.json``
(with the side venv's versions). Without it, the recorded peaks are compared with ``fitcheck.core.estimate`` at the
recorded stack (main venv): the formula, and the plain Trainer's estimate for reference.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from trl_truth import TRL_LORA, Case, measure, spec_for

from fitcheck.core import estimate
from fitcheck.readers import parse_stack
from fitcheck.spec import TrainerKind, TrainerSpec, TrainingSpec

DATA = Path(__file__).resolve().parent / "data" / "trl_sft_releases.json"
SFT = TrainerKind.SFT
CASES: tuple[Case, ...] = (
    Case("sft full", SFT),
    Case("sft full no-ckpt", SFT, ckpt=False),
    Case("sft LoRA", SFT, lora=TRL_LORA),
    Case("sft LoRA b1 s256", SFT, batch=1, length=256, lora=TRL_LORA),
    Case("sft LoRA b4 s64", SFT, batch=4, length=64, lora=TRL_LORA),
    Case("sft LoRA V8000", SFT, lora=TRL_LORA, vocab=8000),
    Case("sft LoRA V8000 b1 s256", SFT, batch=1, length=256, lora=TRL_LORA, vocab=8000),
    Case("sft full V8000 b4 s64 no-ckpt", SFT, batch=4, length=64, vocab=8000, ckpt=False),
)


def recorded() -> dict[str, dict[str, Any]]:
    """The recordings by TRL release: ``{"0.24.0": {"versions": ..., "rows": {case: {"peak": ...}}}}``."""
    data: dict[str, dict[str, Any]] = json.loads(DATA.read_text())["releases"]
    return data


def spec_at_recorded_stack(case: Case, versions: dict[str, str]) -> TrainingSpec:
    """The case's spec (``trl_truth.spec_for``) on the recorded stack."""
    stack = parse_stack(",".join(f"{k}={versions[k]}" for k in ("trl", "transformers", "peft", "accelerate")))
    return dataclasses.replace(spec_for(case), stack=stack)


def _record() -> int:
    import accelerate
    import peft
    import torch
    import transformers
    import trl

    rows = {}
    for case in CASES:
        rows[case.name] = measure(case)
        print(case.name, rows[case.name], flush=True)
    versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                "peft": peft.__version__, "accelerate": accelerate.__version__}
    data = json.loads(DATA.read_text()) if DATA.exists() else {"schema": "", "releases": {}}
    data["releases"][trl.__version__] = {"versions": versions, "rows": rows}
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    return 0


def main(argv: list[str]) -> int:
    if "--record" in argv:
        return _record()
    for release, data in recorded().items():
        print(f"TRL {release} SFTTrainer on CPU (recorded) vs fitcheck at that stack")
        print(f"{'case':32} {'real MiB':>9} {'est MiB':>9} {'error':>8} {'plain':>8}  phase")
        for case in CASES:
            real = data["rows"][case.name]["peak"]
            spec = spec_at_recorded_stack(case, data["versions"])
            est = estimate(spec)
            plain = estimate(dataclasses.replace(spec, trainer=TrainerSpec())).peak_allocated_bytes
            print(f"{case.name:32} {real / 2**20:9.3f} {est.peak_allocated_bytes / 2**20:9.3f} "
                  f"{(est.peak_allocated_bytes - real) / real * 100:+7.2f}% {(plain - real) / real * 100:+7.2f}%  "
                  f"{est.peak_phase.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
