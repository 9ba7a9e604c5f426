"""What the tracer describes (``pinned_path.untraced_parts``, ``trace_arguments.activation_trace_kwargs``).

- ``--trace`` on a run whose activations the plain Trainer step does not describe (Liger kernels, a fused loss,
  one rank of a sequence-parallel layout) is refused with exit 2 naming the flag. Before, the plain step was traced
  and printed as this run's number: Qwen2.5-14B LoRA, ZeRO-3, 4 x 12800 with ``--use_liger_kernel`` said
  151.5 GiB, DOES NOT FIT, where the Liger run's formulas say 45.7 GiB.
- DeepSpeed bf16 runs the module cast to bf16 with no autocast (deepspeed 0.19.8 ``runtime/engine.py``
  ``_cast_module_mixed_precision``; accelerate 1.15 leaves native AMP off: ``core/kernels/module_cast.py``). The
  default path now traces a DeepSpeed run whose formula is not pinned, as that 16-bit module: its traced
  activations equal the bf16-loaded model's trace without autocast. Before, DeepSpeed was never traced by
  default and the unpinned formula answered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import family_config

from fitcheck.cli.main import main

# a tiny Llama (the TRL-head tests' widths, a small vocabulary, fp32 weights)
TINY = family_config("llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=False,
                     torch_dtype="float32")
BASE = ("--max_seq_length", "128", "--per_device_train_batch_size", "2", "--gpu", "A100-80GB")


def _model(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return str(tmp_path)


@pytest.mark.parametrize(("flags", "named"), [
    (("--use_liger_kernel", "true"), "--use_liger_kernel"),
    (("--loss", "cce"), "--loss"),
    (("--num_processes", "2", "--tp_size", "2"), "--tp_size"),
])
def test_trace_refuses_what_it_does_not_describe(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 flags: tuple[str, ...], named: str) -> None:
    code = main(["estimate", "--model_name_or_path", _model(tmp_path), *BASE, "--bf16", *flags, "--trace"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--trace" in err and named in err and "Traceback" not in err


def _traced(spec: Any, mode: str) -> tuple[dict[Any, int], Any]:
    """Per phase, the traced activation, logits and temporary bytes of the answer on a path; and the report."""
    from fitcheck.torch_adapters import PinnedPath

    report = PinnedPath(mode)(spec)
    out: dict[Any, int] = {}
    for comp in report.components:
        if comp.name.endswith(".traced"):
            for phase, nbytes in comp.by_phase.items():
                out[phase] = out.get(phase, 0) + nbytes
    return out, report


def test_deepspeed_traced_as_its_16bit_module(tmp_path: Path) -> None:
    from fitcheck.cli.estimate import spec_from_values

    base = {"model_name_or_path": _model(tmp_path), "max_seq_length": 128, "per_device_train_batch_size": 2,
            "gpu": "A100-80GB", "attn_implementation": "eager"}

    def spec(**extra: object) -> Any:
        return spec_from_values({**base, **extra}, {})[0]

    # the default path: the formula is not pinned at this width, so the DeepSpeed run is traced
    deepspeed, report = _traced(spec(dtype="float32", bf16=True, zero_stage=2), "auto")
    assert deepspeed
    # (on the CPU device: the same traced tensors, without the whole-run allocator replay a CUDA answer adds)
    bf16_module, _ = _traced(spec(dtype="bfloat16", device_type="cpu"), "always")  # bf16 weights, no autocast
    autocast, _ = _traced(spec(dtype="float32", bf16=True, device_type="cpu"), "always")  # fp32 + autocast
    assert deepspeed == bf16_module
    assert deepspeed != autocast
    # the whole-run replay composes the plain Trainer's run only: DeepSpeed's reserved keeps the published gap
    assert "reserved-published-gap" in {f.code for f in report.findings}
    formula = spec_from_values({**base, "dtype": "float32", "bf16": True, "zero_stage": 2}, {})[0]
    from fitcheck.core import estimate

    plain = estimate(formula, activations=tuple(c for c in report.components if c.name.endswith(".traced")))
    assert plain.peak_reserved_bytes == report.peak_reserved_bytes
