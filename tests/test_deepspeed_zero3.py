"""ZeRO-3 on one process against a REAL DeepSpeed 0.19.8 engine (CPU, one gloo process, tiny Llama in bf16).

The engine runs in its own process (``benchmarks/deepspeed_cpu.py --zero3-facts``: DeepSpeed initialises
torch.distributed). What it shows, and fitcheck must say:

* ``grad_partitions_flat_buffer`` (stage3.py) is a bf16 flat buffer of the whole partition, allocated at
  ``initialize`` and alive in every phase (the H200 run of ``benchmarks/data/trainer_gpu_nvidia_h200.json`` kept
  2.47e9 B more than fitcheck said in the step, evaluation and save);
* at one process nothing is gathered (``partition_parameters.py`` ``_no_gather_coalesced``): a parameter's data in
  the forward is its partition;
* after a step the live bytes are 16 B per parameter (bf16 partition + bf16 gradient buffer + fp32 master + two
  fp32 Adam states) plus the ipg bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from fitcheck.core import estimate  # noqa: E402
from fitcheck.report import Location, Phase, Report  # noqa: E402
from fitcheck.spec import DeepSpeedSpec, DeviceType, ShardingSpec, Strategy  # noqa: E402


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "deepspeed_cpu.py"), "--zero3-facts"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _report(device: DeviceType = DeviceType.CPU, eval_batch: int | None = None) -> Report:
    from cpu_truth import Row, spec_for
    from deepspeed_cpu import TINY

    spec = spec_for(Row("tiny llama ZeRO-3", TINY, seq=16, batch=2, dtype="bfloat16", mp="bf16"))
    ds = DeepSpeedSpec(stage=3, reduce_bucket_size=10_000, param_persistence_threshold=0, overlap_comm=True,
                       gather_16bit_on_save=True)
    spec = replace(spec, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, ds),
                   hardware=replace(spec.hardware, device_type=device),
                   trainer=replace(spec.trainer, eval_batch_size=eval_batch))
    return estimate(spec)


def _at(report: Report, name: str, phase: Phase) -> int:
    return sum(c.at(phase) for c in report.components if c.name == name)


def test_zero3_gradient_buffer_is_resident_in_every_phase(facts: dict[str, Any]) -> None:
    assert facts["grad_buffer_dtype"] == "torch.bfloat16"
    report = _report(eval_batch=2)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD, Phase.OPTIMIZER_STEP):
        assert _at(report, "gradients", phase) == facts["grad_buffer_bytes"], phase
    # what stays between steps: the real engine's live bytes after a step (no activations then)
    kept = ("weights.trainable", "gradients", "optimizer.states", "optimizer.step_counters", "master.fp32",
            "buffers.deepspeed_reduce_bucket")
    resident = sum(_at(report, n, Phase.FORWARD_END) for n in kept)
    assert resident == pytest.approx(facts["live_after_step"], rel=1e-3)
    # evaluation and saving run over those resident bytes, the gradient buffer included
    device = [c for c in report.components if c.location is Location.DEVICE]
    evaluation = sum(c.at(Phase.EVALUATION) for c in device)
    save = sum(c.at(Phase.SAVE) for c in device)
    assert evaluation > facts["live_after_step"] - _at(report, "buffers.deepspeed_reduce_bucket", Phase.FORWARD_END)
    assert save >= facts["live_after_step"] - _at(report, "buffers.deepspeed_reduce_bucket", Phase.FORWARD_END)


def test_zero3_one_process_gathers_nothing(facts: dict[str, Any]) -> None:
    assert facts["params_seen"] > 0 and not facts["gathered_any"]
    report = _report()
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
        assert _at(report, "buffers.zero3_gathered_params", phase) == 0, phase


@pytest.mark.parametrize("stage", [2, 3])
def test_side_stream_pools_add_to_reserved_on_cuda_only(stage: int) -> None:
    """ZeRO-2 ``overlap_comm``: ``grads_in_partition`` is allocated in ``reduction_stream`` (stage_1_and_2.py
    ``reduce_ipg_grads`` -> ``copy_grads_in_partition``), so its block stays in that stream's pool while the
    default stream peaks; ZeRO-3: one concatenated bucket in ``reduce_and_partition_stream``. CPU has no streams."""
    from cpu_truth import Row, spec_for
    from deepspeed_cpu import TINY

    from fitcheck.core.caching import allocation_size
    from fitcheck.core.loading import allocator_conf
    from fitcheck.core.states import deepspeed_side_pools

    base = spec_for(Row("tiny llama", TINY, seq=16, batch=2, dtype="bfloat16", mp="bf16"))

    def spec(overlap: bool, device: DeviceType = DeviceType.CUDA) -> Any:
        ds = DeepSpeedSpec(stage=stage, reduce_bucket_size=10_000, overlap_comm=overlap)
        return replace(base, sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, ds),
                       hardware=replace(base.hardware, device_type=device))

    on, off = spec(True), spec(False)
    side = deepspeed_side_pools(on, allocator_conf(on))
    assert side is not None and side.gather == 0
    numel = 557_696  # TINY's parameters (the real engine's grad_partitions_flat_buffer / 2 B)
    block = numel * 2 if stage == 2 else 10_000 * 2
    assert side.reduce == allocation_size(block)
    assert deepspeed_side_pools(off, allocator_conf(off)) is None
    assert deepspeed_side_pools(spec(True, DeviceType.CPU), allocator_conf(on)) is None
    with_pool, without = estimate(on), estimate(off)
    assert "deepspeed-side-streams" in {f.code for f in with_pool.findings}
    assert with_pool.peak_reserved_bytes >= without.peak_reserved_bytes + side.reduce - 2 * 2**20


@pytest.mark.slow
def test_zero3_keeps_whole_int8_weights_beside_their_partition() -> None:
    """transformers builds a quantized model outside zero.Init and ZeRO-3 partitions it at ``initialize``, but
    bitsandbytes 0.50.2 ``Int8Params`` keeps its int8 weight as ``CB`` too (``Linear8bitLt`` moves it to
    ``state.CB`` and back into ``weight.data`` every forward): rank 0 of 8 (real engine, fake process group) keeps
    every whole int8 weight plus its 1/8 partition, as ``core/states/zero3_quant.py`` says (before session 20 the
    estimate divided the int8 weights by 8)."""
    pytest.importorskip("bitsandbytes")
    from deepspeed_cpu import TINY, run_spec

    from fitcheck.spec import QuantSpec

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "deepspeed_cpu.py"), "--zero3-quant-facts", "8"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])["8"]
    assert real["data_left"] == 0 and real["dtypes"] == ["torch.bfloat16", "torch.int8"]
    report = estimate(run_spec(3, 16, config=TINY, world=8, quant=QuantSpec(bits=8)))
    assert _at(report, "weights.quantized", Phase.FORWARD_END) == real["whole_int8_bytes"] == real["bytes_before"]
    assert _at(report, "weights.quantized_partition", Phase.FORWARD_END) == real["partition_bytes"]

