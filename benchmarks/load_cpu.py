"""A REAL ``from_pretrained`` of small checkpoints saved to a temporary directory, on CPU, under the live-tensor
recorder (``fitcheck.torch_adapters.tracer_recorder``), vs fitcheck's load events (``fitcheck.core.loading``).

Checkpoints: a tiny Llama saved in bf16 as 5 shards (``max_shard_size="1MB"``), loaded in bf16; the same loaded
with ``BitsAndBytesConfig(load_in_4bit=True, nf4, double quant)`` and ``load_in_8bit=True`` (quantized on load);
and a pre-quantized 4-bit checkpoint (the 4-bit model saved, then loaded again).

What the CPU can check: the bytes the loaded model keeps (end of loading), and, for unquantized checkpoints, the
peak (parameters materialised one by one, none freed). What it cannot: the CUDA path of bitsandbytes'
quantize-on-load, whose temporaries differ on CPU (bitsandbytes 0.50.2 repacks 4-bit weights for its CPU kernels,
``_convert_weight_packed_for_cpu``); the CUDA sequence is modelled from source (``core/loading/events.py``) and
its CPU peak is printed for information only.

Run: ``PYTHONPATH=. python benchmarks/load_cpu.py`` (exit 1 when an end-of-load row is off by more than 1 %).
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import warnings
from dataclasses import replace
from typing import Any

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
KINDS = ("bf16", "bf16-sharded-fp32", "4bit", "8bit", "4bit-prequantized")


def _bnb(kind: str) -> Any:
    import torch
    import transformers

    if kind.startswith("4bit"):
        return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_use_double_quant=True,
                                               bnb_4bit_compute_dtype=torch.bfloat16)
    if kind == "8bit":
        return transformers.BitsAndBytesConfig(load_in_8bit=True)
    return None


def _save(dirname: str, kind: str) -> None:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    dtype = torch.float32 if kind == "bf16-sharded-fp32" else torch.bfloat16
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(dirname, max_shard_size="1MB")
    if kind == "4bit-prequantized":
        del model
        gc.collect()
        q = transformers.AutoModelForCausalLM.from_pretrained(dirname, dtype=torch.bfloat16, device_map="cpu",
                                                              quantization_config=_bnb(kind))
        q.save_pretrained(dirname)


def measure(kind: str) -> dict[str, int]:
    """Live storage bytes during a real ``from_pretrained`` on CPU: ``peak`` and ``end`` (the loaded model)."""
    import torch
    import transformers

    from fitcheck.torch_adapters import LiveTensorRecorder

    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as d:
        _save(d, kind)
        gc.collect()
        rec = LiveTensorRecorder()
        kw: dict[str, Any] = {}
        if kind in ("4bit", "8bit"):
            kw["quantization_config"] = _bnb(kind)
        with rec:
            model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cpu",
                                                                      **kw)
        gc.collect()
        kept = _resident_bytes(model)
        peak = rec.regions["setup"].peak
        del model
        gc.collect()
    return {"peak": peak, "end": kept}


def _resident_bytes(model: Any) -> int:
    """Storages the loaded model holds: parameters, buffers, bitsandbytes quantization state (deduplicated)."""
    import torch

    seen: dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor) and not t.is_meta:
            st = t.untyped_storage()
            seen[st.data_ptr()] = int(st.nbytes())

    for p in model.parameters():
        add(p)
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            for v in (qs.absmax, qs.code, getattr(qs, "offset", None)):
                add(v)
            if getattr(qs, "state2", None) is not None:
                add(qs.state2.absmax)
                add(qs.state2.code)
        add(getattr(p, "SCB", None))
    return sum(seen.values())


def events_for(kind: str) -> dict[str, int]:
    """fitcheck's load events for the same checkpoint, replayed as live bytes (no allocator rounding)."""
    from benchmarks.cpu_truth import Row, spec_for
    from fitcheck.core.loading import load_events
    from fitcheck.spec import DeviceType, QuantSpec

    quant = None
    if kind.startswith("4bit"):
        quant = QuantSpec(quant_type="nf4", double_quant=True, compute_dtype=None,
                          pre_quantized=kind == "4bit-prequantized")
    elif kind == "8bit":
        quant = QuantSpec(bits=8)
    spec = spec_for(Row("load", TINY, dtype="bfloat16", quant=quant))
    spec = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))
    live = peak = 0
    sizes: dict[int, int] = {}
    for ev in load_events(spec):
        if ev.kind == "alloc":
            sizes[ev.handle] = ev.nbytes
            live += ev.nbytes
            peak = max(peak, live)
        else:
            live -= sizes.pop(ev.handle)
    return {"peak": peak, "end": live}


def main() -> int:
    """Print real vs modelled peak and end-of-load bytes per checkpoint kind."""
    print(f"{'checkpoint':20} {'real peak':>10} {'model peak':>10} {'real end':>10} {'model end':>10} {'end err':>8}")
    worst = 0.0
    for kind in KINDS:
        real, model = measure(kind), events_for(kind)
        err = (model["end"] - real["end"]) / real["end"]
        worst = max(worst, abs(err))
        print(f"{kind:20} {real['peak']:>10} {model['peak']:>10} {real['end']:>10} {model['end']:>10} {err:+8.2%}")
    print(f"worst end-of-load |error| {worst:.2%}")
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
