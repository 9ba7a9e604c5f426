"""A CUDA spec's trace answers peft's ``torch.is_autocast_enabled()`` as the GPU does (``cuda_emulation`` item 5).

peft 0.21.2 ``tuners/lora/bnb.py`` ``Linear4bit.forward`` / ``Linear8bitLt.forward``: ``requires_conversion = not
torch.is_autocast_enabled()``; without autocast the LoRA input is cast to the adapter dtype (fp32 for peft's own
adapters). The argument-less call is CUDA's (torch 2.13 ``torch/csrc/autograd/init.cpp`` ``is_autocast_enabled``:
``device_type = at::kCUDA``), so under the trace's ``torch.autocast("cpu")`` it said False and the CUDA-emulating trace
ran an fp32 branch a GPU never runs (s13: Qwen2.5-0.5B width, 2 layers, all-linear, 4 x 1024: 836.3 MB traced vs
676.9 MB with the call answered). On main the first two fail (the CUDA trace takes the branch); main's formula
(``qlora16`` 10·I + 6·h) against the fixed trace fails the last (+38.8 %; now +2.3 %). About ten seconds together.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tiny_models import narrow_catalog_config

from fitcheck.report import Phase
from fitcheck.spec import DeviceType
from fitcheck.torch_adapters import Cell, activation_trace_kwargs, cell_spec, components_from_trace, phase_errors

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")


def test_argument_less_call_reports_the_traced_autocast() -> None:
    """Inside the emulation the argument-less call reports CPU autocast (what ``torch.autocast("cuda")`` is on a GPU);
    outside it torch's own answer (CUDA only: False under CPU autocast); a call naming a device is untouched."""
    from fitcheck.torch_adapters.cuda_emulation import cuda_kernels

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled() is False  # torch 2.13: the argument-less call is CUDA's
        with cuda_kernels():
            assert torch.is_autocast_enabled() is True
            assert torch.is_autocast_enabled("cpu") is True and torch.is_autocast_enabled("cuda") is False
            with torch.autocast("cpu", enabled=False):  # e.g. the rotary embeddings' disabled region
                assert torch.is_autocast_enabled() is False
        assert torch.is_autocast_enabled() is False  # restored
    with cuda_kernels():
        assert torch.is_autocast_enabled() is False  # no autocast: nothing to report


def _spec(device: DeviceType, hidden: int = 256, inter: int = 688, seq: int = 256) -> tuple[Any, dict[str, Any]]:
    cfg = narrow_catalog_config("meta-llama/Llama-3.1-8B", bos_token_id=1, eos_token_id=2)
    cfg.pop("rope_scaling", None)
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_attention_heads=hidden // 64)
    spec = cell_spec(Cell("llama", "qlora_noprep", True, "sdpa", "autocast", seq, 2), cfg)
    spec = dataclasses.replace(spec, hardware=dataclasses.replace(spec.hardware, device_type=device))
    return spec, cfg


@pytest.mark.parametrize(("device", "converts"), [(DeviceType.CUDA, False), (DeviceType.CPU, True)])
def test_peft_conversion_branch_only_where_the_device_takes_it(
        monkeypatch: pytest.MonkeyPatch, device: DeviceType, converts: bool) -> None:
    """QLoRA without k-bit preparation under bf16 autocast: a CUDA trace never casts a LoRA input to the fp32
    adapters (a GPU's ``torch.is_autocast_enabled()`` is True); a CPU trace does, as a real CPU step does."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from fitcheck.torch_adapters.tracer import trace_step

    spec, cfg = _spec(device)
    casts: list[tuple[Any, Any]] = []
    original = BaseTunerLayer._cast_input_dtype

    def spy(self: Any, x: Any, dtype: Any) -> Any:
        if x is not None:
            casts.append((x.dtype, dtype))
        return original(self, x, dtype)

    monkeypatch.setattr(BaseTunerLayer, "_cast_input_dtype", spy)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    assert kw["cuda_kernels"] is (device is DeviceType.CUDA) and kw["mixed_precision"] == "bf16"
    trace_step(cfg, num_layers=1, **{**kw, "seq_len": 32, "micro_batch": 1})
    assert bool(casts) is converts, casts[:3]
    if converts:
        assert (torch.bfloat16, torch.float32) in casts


def test_cuda_first_recomputed_layer_equals_the_fixed_trace() -> None:
    """The formula's checkpointed backward of a plain-Trainer QLoRA (no k-bit prep, fp32 adapters, dropout) on a
    CUDA spec against the CUDA trace: the branch runs in 16 bits (``qlora16`` 2·I + 6·h, was 10·I + 6·h: +38.8 %)."""
    from fitcheck.torch_adapters.tracer import trace_step

    spec, cfg = _spec(DeviceType.CUDA, 512, 2048, 512)
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    kw["cublas_workspaces"] = ()
    errs = phase_errors(spec, components_from_trace(trace_step(cfg, num_layers=2, **kw)))
    assert abs(errs[Phase.BACKWARD]) <= 0.04, errs
