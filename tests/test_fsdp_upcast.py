"""accelerate 1.15 upcasts trainable low-precision parameters to fp32 under FSDP1/FSDP2 mixed precision.

The real ``Accelerator.prepare`` runs on 2 gloo ranks on CPU (``benchmarks/fsdp_upcast_cpu.py``); each rank's
trainable shards and AdamW states after one step are compared with fitcheck's components. Before the upcast was
modelled, a bf16-loaded model under FSDP + bf16 was estimated with bf16 shards and states (half the bytes), and
Llama-3.1-8B on 4 x H100 (8 x 4096, FSDP2) was a false "fits" (75.6 GiB vs 86.8 GiB loaded in fp32).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from benchmarks.fsdp_upcast_cpu import component, estimate_for, measure

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "accelerate"


@pytest.mark.parametrize("version", [1, 2])
def test_real_prepare_upcasts_a_bf16_model_and_the_estimate_follows(version: int) -> None:
    ranks = measure(version, "bfloat16", "bf16")
    report = estimate_for(version, "bfloat16", "bf16")
    for real in ranks:
        assert set(real["params"]) == {"float32"}, real  # accelerate left no bf16 trainable shard
        assert set(real["states"]) == {"float32"}, real
        assert component(report, "weights.trainable") == real["params"]["float32"]
        assert component(report, "optimizer.states") == real["states"]["float32"]
    assert any(f.code == "fsdp-fp32-upcast" for f in report.findings)


def test_without_mixed_precision_nothing_is_upcast() -> None:
    real = measure(2, "bfloat16", "no")[0]
    report = estimate_for(2, "bfloat16", "no")
    assert set(real["params"]) == {"bfloat16"}
    assert component(report, "weights.trainable") == real["params"]["bfloat16"]
    assert not any(f.code == "fsdp-fp32-upcast" for f in report.findings)


def _cli(dtype: str, config: str) -> tuple[int, dict[str, object]]:
    """The CLI's default path in this process (a subprocess per call paid a fresh torch/transformers import)."""
    import contextlib
    import io

    from fitcheck.cli.main import main

    argv = ["estimate", "--model_name_or_path", "meta-llama/Llama-3.1-8B",
            "--dtype", dtype, "--bf16", "--per_device_train_batch_size", "8", "--max_seq_length", "4096",
            "--gpu", "H100-80GB", "--num_processes", "4", "--config_file", str(FIXTURES / config),
            "--gradient_checkpointing", "--json"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code in (0, 1), err.getvalue()[-2000:]
    return code, json.loads(out.getvalue())


@pytest.mark.parametrize("config", ["trl_fsdp2.yaml", "fsdp1.yaml"])
def test_bf16_and_fp32_loads_give_one_estimate_and_verdict(config: str) -> None:
    rc16, bf16 = _cli("bfloat16", config)
    rc32, fp32 = _cli("float32", config)  # fsdp1.yaml + fp32 was refused (exit 2, bnb_4bit_quant_storage)
    used16, used32 = int(str(bf16["device_used_bytes"])), int(str(fp32["device_used_bytes"]))
    assert abs(used16 - used32) <= 0.01 * used32
    assert rc16 == rc32 == 1 and bf16["fits"] is fp32["fits"] is False


def test_qlora_lever_under_fsdp_stores_4bit_weights_in_a_float_dtype() -> None:
    from fitcheck.advice.advisor_changes import levers
    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core import estimate

    spec = spec_from_values({"model_name_or_path": "meta-llama/Llama-3.1-8B", "dtype": "float32", "bf16": True,
                             "per_device_train_batch_size": 8, "max_seq_length": 4096, "gpu": "H100-80GB",
                             "num_processes": 4, "config_file": str(FIXTURES / "fsdp1.yaml")}, env={})[0]
    qlora = [lever for lever in levers(spec, estimate(spec)) if lever.key == "qlora"]
    assert len(qlora) == 1
    argv = list(qlora[0].argv)
    assert argv[argv.index("--bnb_4bit_quant_storage") + 1] == "float32"
    estimate(qlora[0].apply(spec))  # FSDP1 used to refuse the lever's uint8 storage (ConfigError)
