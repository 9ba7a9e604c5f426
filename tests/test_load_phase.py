"""The load phase (``fitcheck.core.loading``): ``from_pretrained``'s device allocations, checked against a REAL
``from_pretrained`` of checkpoints saved to a temporary directory (``benchmarks/load_cpu.py``), and its place in the
report (``Phase.LOAD``, the run's reserved peak). Before this, fitcheck had no load phase outside FSDP: every test
here fails on that code (no ``fitcheck.core.loading``, no ``Phase.LOAD``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from benchmarks.load_cpu import KINDS, events_for, measure
from fitcheck.cli.estimate import spec_from_values
from fitcheck.core import estimate
from fitcheck.core.loading import load_phase
from fitcheck.report import Location, Phase

QLORA = {"model_name_or_path": "Qwen/Qwen3-8B", "dtype": "bfloat16", "bf16": True, "gpu": "A100-40GB",
         "per_device_train_batch_size": 1, "max_seq_length": 64, "gradient_checkpointing": True,
         "load_in_4bit": True, "use_bnb_nested_quant": True, "use_peft": True, "lora_target_modules": "all-linear"}


@pytest.mark.parametrize("kind", KINDS)
def test_loaded_bytes_match_a_real_from_pretrained(kind: str) -> None:
    real, model = measure(kind), events_for(kind)
    assert model["end"] == real["end"]  # parameters, packed weights and every quantization-state tensor
    if not kind.startswith(("4bit", "8bit")):  # unquantized: one tensor per parameter, none freed
        assert model["peak"] == real["peak"] - 256  # the recorder also sees rotary inv_freq (a buffer)


def _spec(**extra: object) -> object:
    return spec_from_values({**QLORA, **extra}, env={})[0]


def test_qlora_load_phase_in_the_report() -> None:
    spec = _spec()
    report = estimate(spec)  # type: ignore[arg-type]
    lp = load_phase(spec)  # type: ignore[arg-type]
    assert lp is not None
    totals = report.phase_totals()
    assert totals[Phase.LOAD] == lp.peak_allocated
    # quantize-on-load: one bf16 weight (and its statistics) on top of what is already loaded
    assert lp.peak_allocated > lp.end_allocated
    # the load ends with the resident weights the step counts (the allocator rounds each tensor up to 512 B)
    weights = sum(c.at(Phase.FORWARD_END) for c in report.components
                  if c.location is Location.DEVICE and c.name.startswith(("weights.", "quantization.")))
    tensors = 36 * 7 * 7 + 36 * 4 + 3  # per quantized weight: packed, code, offset, nested absmax/code/absmax2
    assert 0 <= lp.end_allocated - weights <= 512 * tensors
    # the freed 16-bit copies stay cached: reserved after loading is above allocated
    assert lp.end_reserved > lp.end_allocated


def test_short_sequences_peak_at_load() -> None:
    report = estimate(_spec())  # type: ignore[arg-type]
    lp = load_phase(report.spec)
    assert lp is not None
    assert report.peak_reserved_bytes >= lp.peak_reserved
    codes = {f.code for f in report.findings}
    assert "load-peak" in codes


def test_expandable_segments_change_the_load_cache() -> None:
    spec = _spec()
    plain = load_phase(spec)  # type: ignore[arg-type]
    conf = replace(spec.hardware, cuda_alloc_conf="expandable_segments:True")  # type: ignore[attr-defined]
    grown = load_phase(replace(spec, hardware=conf))  # type: ignore[type-var]
    assert plain is not None and grown is not None
    assert grown.end_allocated == plain.end_allocated
    assert grown.peak_reserved != plain.peak_reserved
    assert grown.stuck == 0  # free pages of an expandable segment can be unmapped (not inactive_split)


def test_no_load_phase_where_other_rules_apply() -> None:
    spec = _spec(load_in_4bit=False, use_peft=False)
    cpu = replace(spec, hardware=replace(spec.hardware, device_type=spec.hardware.device_type.__class__("cpu")))  # type: ignore[attr-defined]
    assert load_phase(cpu) is None  # type: ignore[arg-type]
    assert Phase.LOAD not in estimate(cpu).phase_totals()  # type: ignore[arg-type]


def test_alloc_conf_flag_and_environment() -> None:
    import subprocess
    import sys

    base = [sys.executable, "-m", "fitcheck.cli.main", "estimate", "--model_name_or_path", "Qwen/Qwen3-8B",
            "--gpu", "A100-40GB", "--no_trace"]
    bad = subprocess.run([*base, "--cuda_alloc_conf", "max_split_size_mb:10"], capture_output=True, text=True,
                         timeout=300, check=False)
    assert bad.returncode == 2 and "max_split_size_mb" in bad.stderr and "Traceback" not in bad.stderr
    import os

    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe"}
    read = subprocess.run(base, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert read.returncode == 2 and "PYTORCH_CUDA_ALLOC_CONF" in read.stderr
    spec = _spec(cuda_alloc_conf="expandable_segments:True")
    assert spec.hardware.expandable_segments  # type: ignore[attr-defined]


@pytest.mark.parametrize("change", [{"per_device_train_batch_size": 7}, {"optim": "adamw_8bit"},
                                    {"use_bnb_nested_quant": False}, {"dtype": "float16", "bf16": False, "fp16": True},
                                    {"load_in_4bit": False, "load_in_8bit": True},
                                    {"cuda_alloc_conf": "expandable_segments:True"},
                                    {"model_name_or_path": "openai/gpt-oss-20b", "load_in_4bit": False}])
def test_memoised_replay_equals_a_fresh_one(change: dict[str, object]) -> None:
    """The advisor estimates 100+ candidates; ``load_phase`` replays once per (model, quantization, load dtype,
    allocator settings, capacity). A memo hit must equal a fresh replay for every spec it serves."""
    from fitcheck.core.loading import phase

    load_phase(_spec())  # type: ignore[arg-type]  # fill the memo with the base run
    spec = _spec(**change)
    served = load_phase(spec)  # type: ignore[arg-type]
    assert served is not None
    phase._MEMO.clear()
    assert served == load_phase(spec)  # type: ignore[arg-type]


def test_deepspeed_over_a_4bit_base_loads_it_whole_on_every_gpu() -> None:
    """transformers 5.23 builds a quantized model outside ``zero.Init`` (recorded on the real libraries,
    ``benchmarks/deepspeed_cpu.py --zero3-quant-load-facts``: under a ZeRO-3 config the plain tiny Llama comes out
    partitioned, the nf4 one whole), on the bitsandbytes quantizer's ``{"": current device}``: every rank loads the
    whole 4-bit base on its GPU before ``deepspeed.initialize`` partitions it, and DeepSpeed calls no ``empty_cache``
    there. So the run's reserved peak is at least the load's (the published Llama-2-70B QLoRA ZeRO-3 row on 2 x 40 GB:
    -18.3 % -> -2.0 %); main had no load phase under DeepSpeed."""
    import json
    from pathlib import Path

    facts = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "data"
                        / "deepspeed_zero3_quant_load_cpu.json").read_text(encoding="utf-8"))
    assert facts["plain"]["partitioned"] == facts["plain"]["params"] and facts["plain"]["data_elements"] == 0
    assert facts["nf4"]["partitioned"] == 0 and facts["nf4"]["data_elements"] > 0
    assert "Params4bit" in facts["nf4"]["classes"]
    whole = load_phase(_spec())  # type: ignore[arg-type]
    for stage in (2, 3):
        spec = _spec(zero_stage=stage, num_processes=2)
        lp = load_phase(spec)  # type: ignore[arg-type]
        assert lp is not None and whole is not None and lp.peak_allocated == whole.peak_allocated
        report = estimate(spec)  # type: ignore[arg-type]
        assert report.phase_totals()[Phase.LOAD] == lp.peak_allocated
        assert report.peak_reserved_bytes >= lp.peak_reserved
    assert load_phase(_spec(zero_stage=3, num_processes=2, load_in_4bit=False, use_peft=False)) is None  # type: ignore[arg-type]
