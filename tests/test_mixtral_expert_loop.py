"""transformers 4.x's per-expert Mixtral MoE loop (``core/activations/moe_expert_loop.py``) against what the real
4.48.1 loop keeps, recorded in the old-stack environment (CI runs no old stack):

- saved-tensor hooks on one ``MixtralSparseMoeBlock`` (h 128, I 256, 4 experts, top-2, 128 tokens): bytes per token;
- ``benchmarks/mixtral_old_moe.py``: fitcheck's tracer on real tensors, tiny Mixtral and the same Mistral without
  the MoE, at the fms settings; the MoE's share of each phase is the Mixtral trace less the Mistral one.

The last test reruns the benchmark where ``/work/venvs/old`` (or ``FITCHECK_OLD_STACK_PYTHON``) exists.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from benchmark_module import load_benchmark

from fitcheck.core.activations import expert_loop_applies
from fitcheck.core.activations.decoder import activation_components
from fitcheck.core.activations.moe_expert_loop import expert_loop_saved
from fitcheck.readers.versions import parse_stack
from fitcheck.report import Phase
from fitcheck.torch_adapters.run_scope import untraced_parts

ROOT = Path(__file__).resolve().parents[1]
OLD_PYTHON = Path(os.environ.get("FITCHECK_OLD_STACK_PYTHON", "/work/venvs/old/bin/python"))
PHASES = (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD)
# saved-tensor hooks, transformers 4.48.1 (bitsandbytes 0.50.2 CPU for the 4-bit experts): bytes per token
HOOKED = {"bf16 frozen": 4176, "bf16 full": 5968, "nf4 experts, fp32 input, bf16 autocast": 8276}
# benchmarks/mixtral_old_moe.py (4.48.1 / peft 0.13.2 / bitsandbytes 0.50.2 CPU): traced Mixtral - traced Mistral,
# end of forward, start of backward, during backward
TRACED_MOE = {
    "lora": (675840, 675840, 675840), "lora-ckpt": (0, 0, 287084),
    "qlora": (1332224, 1332224, 1266688), "qlora-ckpt": (0, 0, 547544),
}


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("mixtral_old_moe")


def _moe_part(bench: Any) -> dict[str, tuple[int, ...]]:
    mixtral, mistral = bench.specs(), bench.specs(family="mistral")
    out = {}
    for case in TRACED_MOE:
        a, b = activation_components(mixtral[case]), activation_components(mistral[case])
        out[case] = tuple(sum(c.at(ph) for c in a) - sum(c.at(ph) for c in b) for ph in PHASES)
    return out


def test_expert_loop_saved_matches_the_hooked_block(bench: Any) -> None:
    shape = bench.specs()["lora"].model.shape
    assert expert_loop_saved(shape, e=2, r=2, linears_out=2, full=False, autocast=False) == HOOKED["bf16 frozen"]
    assert expert_loop_saved(shape, e=2, r=2, linears_out=2, full=True, autocast=False) == HOOKED["bf16 full"]
    nf4 = expert_loop_saved(shape, e=2, r=4, linears_out=4, full=False, autocast=True)
    assert nf4 == HOOKED["nf4 experts, fp32 input, bf16 autocast"]


def test_formula_moe_share_matches_the_recorded_trace(bench: Any) -> None:
    """Forward end and start of backward: equal to the byte. During backward the share depends on which moment is
    the peak of each model: checkpointed, the recomputed top layer's (QLoRA +304 B; LoRA -14,700 B, +50,836 B with
    the dense MLP's working set for every token instead of one expert's); without checkpointing the 4.48 Mistral
    trace peaks elsewhere than the formula's (its own during-backward error -1.6 / -2.3 %)."""
    got = _moe_part(bench)
    over = {"lora": -65536, "lora-ckpt": -14700, "qlora": 65536, "qlora-ckpt": 304}
    for case, traced in TRACED_MOE.items():
        assert got[case][:2] == traced[:2], case
        assert got[case][2] - traced[2] == over[case], case


def test_loop_only_below_transformers_5_and_answered_from_the_formula(bench: Any) -> None:
    import dataclasses

    spec = bench.specs()["qlora"]
    assert expert_loop_applies(spec)
    assert any("per-expert nn.Linear MoE loop" in p for p in untraced_parts(spec))
    for stack in ("transformers=5.0.0", "transformers=5.23.0"):
        assert not expert_loop_applies(dataclasses.replace(spec, stack=parse_stack(stack)))
    assert not expert_loop_applies(bench.specs(family="mistral")["qlora"])


@pytest.mark.skipif(not OLD_PYTHON.exists(), reason=f"no old-stack environment at {OLD_PYTHON}")
def test_real_transformers_448_loop_matches_the_formula(bench: Any, tmp_path: Path) -> None:
    import importlib.util

    found = importlib.util.find_spec("bitsandbytes")
    if found is None or found.origin is None:
        pytest.skip("bitsandbytes (0.50.2, CPU backend) is needed for the old stack's 4-bit experts")
    package = Path(found.origin).parent
    for src in (package, *package.parent.glob("bitsandbytes-*.dist-info")):
        (tmp_path / src.name).symlink_to(src)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "HF_HUB_OFFLINE": "1"}
    traced: dict[str, Any] = {}
    for family in ("mixtral", "mistral"):
        run = subprocess.run([str(OLD_PYTHON), str(ROOT / "benchmarks" / "mixtral_old_moe.py"), "--json", "--family",
                              family, "--cases", "lora,qlora", "--bnb-path", str(tmp_path)],
                             capture_output=True, text=True, env=env, timeout=600, check=True)
        traced[family] = json.loads(run.stdout.strip().splitlines()[-1])["rows"]
    got = _moe_part(bench)
    for case in ("lora", "qlora"):
        share = [traced["mixtral"][case][ph.value][0] - traced["mistral"][case][ph.value][0] for ph in PHASES]
        assert tuple(share[:2]) == got[case][:2] == TRACED_MOE[case][:2], case
