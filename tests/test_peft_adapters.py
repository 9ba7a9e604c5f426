"""PEFT adapters other than LoRA: read, refused where the formulas cannot answer, estimated from peft's own model.

The estimate (``PinnedPath("always")`` on a CPU spec: the adapter's tensors from peft 0.21.2 ``get_peft_model`` plus
the traced step) is checked against a real CPU step of the same peft model (``tracer.trace_step(fake=False)``) for
every type of ``TRACED_PEFT_TYPES``, with the ``peft_config`` its peft MetaMathQA row ran
(``benchmarks/peft_adapters_cpu.py`` writes the same comparison at a larger step).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.errors import NotModelledError
from fitcheck.readers import TRACED_PEFT_TYPES, adapter_from_mapping, read_adapter_config
from fitcheck.spec import LoraSpec, PeftAdapterSpec

ROWS = Path(__file__).resolve().parents[1] / "benchmarks" / "calibration" / "published_measurements.json"
TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}


# smaller sizes than the rows' (200 virtual tokens, p-tuning's 3072-wide encoder) keep the test at seconds; the
# benchmark runs the rows' own
_SMALLER = {"num_virtual_tokens": 8, "encoder_hidden_size": 64}


def _row_config(peft_type: str) -> dict[str, Any]:
    for row in json.loads(ROWS.read_text()):
        cfg = row.get("peft_config")
        if str(row.get("id", "")).startswith("MMQA") and cfg and cfg.get("peft_type") == peft_type:
            return {k: _SMALLER.get(k, v) for k, v in cfg.items()}
    raise AssertionError(f"no MMQA row of {peft_type}")


def test_reader_reads_traced_types_and_refuses_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": []}))
    read = read_adapter_config(str(path))
    assert isinstance(read, PeftAdapterSpec) and read.peft_type == "IA3" and read.config["target_modules"] == ["k_proj"]
    assert isinstance(adapter_from_mapping({"peft_type": "LORA", "r": 4}, source="a.json"), LoraSpec)
    with pytest.raises(NotModelledError, match=r"a.json:peft_type: C3A adapters are not modelled; LoRA .* IA3"):
        adapter_from_mapping({"peft_type": "C3A"}, source="a.json")


def test_formula_refuses_an_adapter_it_cannot_build() -> None:
    """No tensor inventory (no torch, --no_trace): exit-2 error naming file, key and fix; never LoRA or full FT."""
    from tiny_models import spec_from_config  # type: ignore[import-not-found]

    from fitcheck.core import estimate

    spec = dataclasses.replace(spec_from_config(TINY), peft=adapter_from_mapping(
        {"peft_type": "LOHA", "target_modules": ["q_proj"]}, source="adapter_config.json"))
    with pytest.raises(NotModelledError, match=r"adapter_config.json:peft_type: LOHA .* drop --no_trace"):
        estimate(spec)


@pytest.mark.parametrize("peft_type", TRACED_PEFT_TYPES)
def test_estimate_matches_a_real_cpu_step(peft_type: str) -> None:
    pytest.importorskip("peft")
    from tiny_models import spec_from_config

    from fitcheck.torch_adapters import PinnedPath, trace_step

    adapter = adapter_from_mapping(_row_config(peft_type), source="adapter_config.json")
    assert isinstance(adapter, PeftAdapterSpec)
    real = trace_step(TINY, seq_len=32, micro_batch=1, dtype="bfloat16", optimizer="adamw_torch", fake=False,
                      adapter=adapter)
    spec = dataclasses.replace(spec_from_config(TINY, seq=32), peft=adapter)
    report = PinnedPath("always")(spec)
    totals = report.phase_totals()
    assert not report.pinned and any(f.code == "peft-adapter-traced" for f in report.findings)
    for phase in real.phases:
        assert totals[phase] == pytest.approx(real.phases[phase].total, rel=0.02), phase
    trainable = {f.message.split(" trainable")[0].rsplit(" ", 1)[-1] for f in report.findings
                 if f.code == "peft-adapter-traced"}
    assert trainable == {f"{report.trainable_params:,}"}
