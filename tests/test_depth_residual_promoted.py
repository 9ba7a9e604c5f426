"""fp16 weights under bf16 autocast: the depth extrapolation skips layer 0, which reads another dtype.

Phi-2's config says float16 and TRL trains it under bf16 autocast: layer 0 reads the fp16 embedding, every layer
above an fp32 residual stream (float16 + bfloat16 promotes to float32), so a one-layer trace is no layer of the
deeper stack and the line through 1 and 2 layers under-counts each layer during backward (Phi-2 KTO LoRA 4 x 1024
at 32 layers: 629 MB under the formula and the 32-layer line, with ``pinned: true``). ``BatchTraces``
(``tracer_depth.residual_promoted``) extrapolates from 2 and 3 layers there: the full depth's trace, phase by
phase and category by category. Real widths: the numbers in ``tracer_depth.residual_promoted``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import narrow_catalog_config

from fitcheck.readers import inventory_from_config, spec_from_values
from fitcheck.torch_adapters import activation_trace_kwargs
from fitcheck.torch_adapters.trace_batch import BatchTraces
from fitcheck.torch_adapters.tracer import trace_step


def test_fp16_phi_under_bf16_autocast_extrapolates_to_the_full_depth() -> None:
    cfg = narrow_catalog_config("microsoft/phi-2")  # torch_dtype float16, gelu_new, partial rotary 0.4
    # head_dim 80 as Phi-2's (0.4 of it rotary); at this shape layers 1.. are alike, layer 0 not (1 x 1024:
    # during backward +3,488,640 B from 1 to 2 layers, +4,144,000 B from 2 to 3 and from 3 to 4)
    cfg.update(hidden_size=320, num_attention_heads=4, num_key_value_heads=4, head_dim=80, intermediate_size=1280,
               num_hidden_layers=4)
    values: dict[str, object] = {
        "trainer": "sft", "dtype": "auto", "use_peft": True, "bf16": True, "gradient_checkpointing": True,
        "per_device_train_batch_size": 1, "max_seq_length": 1024, "gpu": "H100",
        "lora_target_modules": ["all-linear"], "lora_dropout": 0.05,
    }
    spec = spec_from_values(values, inventory=inventory_from_config(cfg, "microsoft/phi-2", "test"))[0]
    kw = {k: v for k, v in activation_trace_kwargs(spec).items() if k != "num_layers"}
    assert (kw["dtype"], kw["mixed_precision"]) == ("float16", "bf16")
    full = trace_step(spec.model.config, num_layers=4, **kw)
    traces = BatchTraces(spec.model.config, kw)  # the default path's traces
    assert dict(traces.result(1).phases) == dict(full.phases)
    assert traces.plan == (2, 3)


def test_only_the_other_16_bit_autocast_promotes() -> None:
    from fitcheck.torch_adapters.tracer_depth import residual_promoted

    assert residual_promoted({"dtype": "float16", "mixed_precision": "bf16"})
    assert residual_promoted({"dtype": "bfloat16", "mixed_precision": "fp16"})
    for dtype, mixed in (("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "bf16"), ("float16", "no")):
        assert not residual_promoted({"dtype": dtype, "mixed_precision": mixed})
