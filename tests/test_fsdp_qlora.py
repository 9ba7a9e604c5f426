"""FSDP over a bitsandbytes 4-bit base (fitcheck/core/states/fsdp_qlora.py) and FSDP2 units (fsdp2_units.py).

Real libraries where the claim is about them: a real ``Params4bit`` with ``quant_storage=bfloat16`` quantized on
CPU (bytes, and that the quantization state is not a parameter or buffer FSDP could shard), torch FSDP1 refusing
a uint8-stored weight, and a real 2-process FSDP2 step on CPU (slow).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from fitcheck.cli.estimate import spec_from_values
from fitcheck.core import estimate
from fitcheck.core.states.fsdp_qlora import gathered_layer_bytes, load_peak, quant_placement
from fitcheck.core.states.quantization import base_weights, quantized_bytes
from fitcheck.core.states.sharding import buffer_components, param_compute_bytes, partition
from fitcheck.errors import ConfigError
from fitcheck.readers.fsdp_config import fsdp_from_config
from fitcheck.readers.model_config import inventory_from_config
from fitcheck.report import Location, Phase
from fitcheck.spec import (
    BatchSpec,
    Dtype,
    FsdpSpec,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    ModelInventory,
    PrecisionSpec,
    QuantSpec,
    ShardingSpec,
    Strategy,
    TrainingSpec,
)

_CATALOG = Path(__file__).resolve().parents[1] / "fitcheck/catalog/models/meta-llama"
GIB = 2**30


def _inventory(name: str) -> ModelInventory:
    import json

    cfg = json.loads((_CATALOG / name / "config.json").read_text())
    return inventory_from_config(cfg, f"meta-llama/{name}", "catalog")


@pytest.fixture(scope="module")
def llama70b() -> ModelInventory:
    return _inventory("Llama-2-70b-hf")


def qlora_spec(
    inv: ModelInventory,
    *,
    storage: Dtype = Dtype.BFLOAT16,
    version: int = 2,
    offload: bool = False,
    gpu_gib: int = 80,
    processes: int = 2,
    ram_efficient: bool = False,
) -> TrainingSpec:
    """The FSDP-QLoRA recipe (nf4 + double quant, bf16 compute, all-linear LoRA r8) on ``processes`` GPUs."""
    fs = FsdpSpec(version=version, offload_params=offload, cpu_ram_efficient_loading=ram_efficient)
    return TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16),
        batch=BatchSpec(micro_batch=1, seq_len=1024),
        sharding=ShardingSpec(Strategy.FSDP, processes, 1, fsdp=fs),
        hardware=HardwareSpec(gpu_memory_bytes=gpu_gib * GIB),
        lora=LoraSpec(r=8, alpha=16, target_modules=("all-linear",)),
        quant=QuantSpec(double_quant=True, compute_dtype=Dtype.BFLOAT16, quant_storage=storage,
                        prepare_for_kbit_training=False),
    )


def component(report_or_comps: object, name: str) -> object:
    comps = getattr(report_or_comps, "components", report_or_comps)
    return next(c for c in comps if c.name == name)  # type: ignore[attr-defined]


def test_real_params4bit_bf16_storage_bytes_and_state_outside_parameters() -> None:
    """bitsandbytes 0.50.2 on CPU: the packed bf16-stored weight and its QuantState are the bytes fitcheck counts,
    and the state is neither a parameter nor a buffer of the module (so FSDP cannot shard it)."""
    import bitsandbytes as bnb
    import torch

    out_f, in_f = 1376, 512
    torch.manual_seed(0)
    lin = bnb.nn.Linear4bit(in_f, out_f, bias=False, compute_dtype=torch.bfloat16, compress_statistics=True,
                            quant_type="nf4", quant_storage=torch.bfloat16)
    w = torch.randn(out_f, in_f, dtype=torch.bfloat16)
    lin.weight = bnb.nn.Params4bit(w, requires_grad=False, **lin.weight.__dict__).to("cpu")
    weight = lin.weight
    assert weight.dtype == torch.bfloat16 and weight.is_floating_point() and weight.shape[1] == 1
    state = weight.quant_state
    spec = QuantSpec(double_quant=True, quant_storage=Dtype.BFLOAT16)
    qb = quantized_bytes(out_f * in_f, spec)
    assert weight.untyped_storage().nbytes() == qb.data == out_f * in_f // 2
    meta = state.absmax.nbytes + state.code.nbytes + state.state2.absmax.nbytes + state.state2.code.nbytes
    meta += state.offset.nbytes
    assert meta == qb.meta
    assert [n for n, _ in lin.named_parameters()] == ["weight"] and not list(lin.named_buffers())


@pytest.mark.slow
def test_fsdp1_refuses_uint8_storage_for_real_and_fitcheck_says_so(llama70b: ModelInventory) -> None:
    """torch 2.13 FSDP1 (world size 1, gloo) cannot flatten a uint8-stored Params4bit; bf16 storage flattens."""
    code = textwrap.dedent(
        """
        import os, torch, torch.distributed as dist, bitsandbytes as bnb
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        import tempfile
        store = tempfile.mktemp()
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        for storage in (torch.uint8, torch.bfloat16):
            lin = bnb.nn.Linear4bit(64, 64, bias=False, quant_storage=storage)
            lin.weight = bnb.nn.Params4bit(torch.randn(64, 64), requires_grad=False,
                                           **lin.weight.__dict__).to("cpu")
            try:
                FSDP(lin, use_orig_params=False, device_id=torch.device("cpu"))
                print(storage, "ok")
            except ValueError as exc:
                print(storage, "error", exc)
        dist.destroy_process_group()
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("torch.")]
    assert lines[0].startswith("torch.uint8 error") and "integer dtype" in lines[0]
    assert lines[1] == "torch.bfloat16 ok"
    with pytest.raises(ConfigError, match="Cannot flatten integer dtype"):
        estimate(qlora_spec(llama70b, storage=Dtype.UINT8, version=1))


def test_float_storage_shards_packed_bytes_but_not_the_quant_state(llama70b: ModelInventory) -> None:
    spec = qlora_spec(llama70b)
    bw = base_weights(spec)
    report = estimate(spec)
    packed = component(report, "weights.quantized")
    meta = component(report, "quantization.metadata")
    assert packed.at(Phase.BACKWARD) == -(bw.quantized_data // -2)  # type: ignore[attr-defined]
    assert meta.at(Phase.BACKWARD) == bw.quantized_meta  # type: ignore[attr-defined]
    assert meta.location is Location.DEVICE  # type: ignore[attr-defined]
    codes = {f.code for f in report.findings}
    assert {"fsdp-quant-state-replicated", "fsdp-qlora-mixed-precision"} <= codes


def test_offload_moves_the_packed_shard_to_host_and_keeps_the_state_on_gpu(llama70b: ModelInventory) -> None:
    report = estimate(qlora_spec(llama70b, offload=True))
    assert component(report, "weights.quantized").location is Location.HOST  # type: ignore[attr-defined]
    assert component(report, "quantization.metadata").location is Location.DEVICE  # type: ignore[attr-defined]
    # FSDP parameter offload: parameters, adapters, gradients and optimizer states on host; on the GPU only the
    # quantization state, the gathered units and the step's own tensors
    on_gpu = {c.name for c in report.components if c.location is Location.DEVICE}
    for name in ("weights.frozen", "adapters.lora", "gradients", "optimizer.states"):
        assert name not in on_gpu and component(report, name).location is Location.HOST  # type: ignore[attr-defined]
    assert "buffers.fsdp_unsharded_params" in on_gpu


def test_uint8_storage_under_fsdp2_is_not_sharded(llama70b: ModelInventory) -> None:
    """accelerate 1.15 fsdp2_prepare_model passes uint8 Params4bit to fully_shard as ignored_params."""
    spec = qlora_spec(llama70b, storage=Dtype.UINT8)
    report = estimate(spec)
    assert component(report, "weights.quantized").at(Phase.BACKWARD) == base_weights(spec).quantized_data  # type: ignore[attr-defined]
    assert any(f.code == "fsdp-4bit-not-sharded" for f in report.findings)
    placement = quant_placement(spec, partition(spec).weights, False)
    assert placement is not None and placement.data_divisor == 1 and not placement.gathered
    # nothing quantized is gathered: a layer unit is its norms
    norms = sum(e.numel_each for e in spec.model.params if e.per_layer and "norm" in e.name) * 2
    assert gathered_layer_bytes(spec, 2) == norms


def test_gathered_unit_is_the_packed_layer(llama70b: ModelInventory) -> None:
    spec = qlora_spec(llama70b)
    q = spec.quant
    assert q is not None
    layer = [e for e in spec.model.params if e.per_layer]
    packed = sum(quantized_bytes(e.numel_each, q).data for e in layer if e.name.endswith("proj.weight"))
    norms = sum(e.numel_each for e in layer if "norm" in e.name) * 2
    assert gathered_layer_bytes(spec, 2) == packed + norms
    buf = component(buffer_components(spec), "buffers.fsdp_unsharded_params")
    # the Trainer's FSDP2 units for a peft model are accelerate's layer units (core/states/fsdp2_units.py): in
    # backward the packed layer being computed and the prefetched next one
    assert buf.at(Phase.BACKWARD) == 2 * (packed + norms)  # type: ignore[attr-defined]


def test_compute_dtype_follows_float_quant_storage(llama70b: ModelInventory) -> None:
    """transformers 5.23 update_fsdp_plugin_peft: FSDP mixed precision = quant storage dtype."""
    spec = qlora_spec(llama70b, storage=Dtype.FLOAT32)
    assert param_compute_bytes(spec) == 4
    assert param_compute_bytes(qlora_spec(llama70b)) == 2


def test_a_70b_4bit_model_is_loaded_whole_on_each_gpu(llama70b: ModelInventory) -> None:
    """transformers 5.23 loads a bnb model to cuda.current_device() on every rank; 24 GB cannot hold it."""
    small = qlora_spec(llama70b, offload=True, gpu_gib=24)
    peak = load_peak(small)
    bw = base_weights(small)
    assert peak is not None and peak.gpu_bytes > bw.quantized_data + bw.quantized_meta > 24 * GIB
    report = estimate(small)
    assert not report.fits and any(f.code == "load-does-not-fit" for f in report.findings)
    big = estimate(qlora_spec(llama70b, gpu_gib=80))
    assert any(f.code == "fsdp-load-gpu-peak" for f in big.findings)


def test_cpu_ram_efficient_loading_host_copies(llama70b: ModelInventory) -> None:
    base = TrainingSpec(model=llama70b, precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16),
                        sharding=ShardingSpec(Strategy.FSDP, 8, 1, fsdp=FsdpSpec()))
    every = load_peak(base)
    rank0 = load_peak(replace(base, sharding=ShardingSpec(Strategy.FSDP, 8, 1,
                                                          fsdp=FsdpSpec(cpu_ram_efficient_loading=True))))
    assert every is not None and rank0 is not None
    assert every.host_bytes == 8 * rank0.host_bytes == 8 * llama70b.total_params * 2
    tight = replace(base, hardware=HardwareSpec(host_memory_bytes=400 * GIB))
    report = estimate(tight)
    assert not report.fits and any(f.code == "fsdp-load-host-ram" for f in report.findings)


def test_reader_takes_cpu_ram_efficient_loading_and_skips_kbit_upcast_for_fsdp_qlora() -> None:
    read = fsdp_from_config({"fsdp_cpu_ram_efficient_loading": True, "fsdp_offload_params": True},
                            source="cfg.yaml", flavour="accelerate")
    assert read.spec.cpu_ram_efficient_loading and read.spec.offload_params
    values = {"model_name_or_path": "meta-llama/Llama-2-7b-hf", "use_peft": True, "load_in_4bit": True,
              "bnb_4bit_quant_storage": "bfloat16", "num_processes": 2}
    fsdp, _ = spec_from_values({**values, "fsdp": "full_shard"}, env={})
    plain, _ = spec_from_values(values, env={})
    assert fsdp.quant is not None and not fsdp.quant.prepare_for_kbit_training
    assert plain.quant is not None and plain.quant.prepare_for_kbit_training


@pytest.mark.slow
def test_real_fsdp2_step_on_cpu_matches_the_estimate() -> None:
    """A real 2-process FSDP2 step (gloo, MixedPrecisionPolicy bf16): each rank's live-tensor peak within 2 %.

    160 tokens a row (the benchmark's table: 256): the peak is still the end of forward, where the activations and
    logits are 54.9 of the estimate's 186.9 MB (256: 87.8 of 219.8 MB); measured -0.00 % as at 256, 2 ranks' CPU
    73.8 s instead of 112.6 s. At 64 the peak moved to backward with 0.13 MB of activations (not this check)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.fsdp_cpu import estimate_for, measure

    report = estimate_for("bf16", seq=160)
    assert report.peak_phase is Phase.FORWARD_END  # the activations' moment, not the states' alone
    est = report.peak_allocated_bytes
    for peaks in measure("bf16", seq=160):
        real = max(peaks.values())
        assert abs(est - real) / real <= 0.02, (est, peaks)
