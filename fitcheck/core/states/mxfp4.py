"""MXFP4 checkpoints (gpt-oss): the packed expert bytes, why training holds them dequantized, the load-time spike.

transformers 5.23:

* ``integrations/mxfp4.py Mxfp4GptOssExperts.__init__``: only the fused experts are MXFP4 -- per projection a
  uint8 ``*_blocks`` tensor ``[E, out, in/32, 16]`` (two FP4 values per byte: ``E·out·in/2`` bytes) and a uint8
  ``*_scales`` tensor ``[E, out, in/32]`` (one E8M0 exponent per 32 values); biases stay fp32. Attention,
  router, embeddings and the LM head are not quantized (``quantization_config.modules_to_not_convert``).
* ``quantizers/quantizer_mxfp4.py``: ``is_trainable`` is False ("please consider dequantizing the model first by
  passing quantization_config=Mxfp4Config(dequantize=True)"), and without the triton kernels (or on CPU) the
  quantizer sets ``dequantize = True`` itself. Either way a training run holds the experts as dense tensors in
  the load dtype: the estimate counts them unquantized and says so.
* Dequantization at load (``_convert_moe_packed_tensors``, one expert tensor at a time, ``rows_per_chunk``
  = 32M rows of 32 values, one chunk for gpt-oss): besides the ``out`` tensor (the dequantized result, 64 B per
  row in bf16) the int32 scales (4 B/row), the int32 nibble indices ``idx_lo``/``idx_hi`` (64 B/row) and the
  ``lut[idx]`` gather (32 B/row) are alive at once: 100 B per row of 32 values above the result, plus the packed
  blocks and scales being read. That spike lands on the device the tensor is loaded to.
"""

from __future__ import annotations

from fitcheck.findings import Finding, Severity
from fitcheck.spec import Dtype, Kind, ModelInventory
from fitcheck.units import format_bytes

SOURCE = "transformers 5.23 integrations/mxfp4.py (Mxfp4GptOssExperts, _convert_moe_packed_tensors), " \
    "quantizers/quantizer_mxfp4.py (is_trainable False)"
_VALUES_PER_ROW = 32  # one E8M0 scale per 32 FP4 values (a row of 16 packed bytes)
_TRANSIENT_PER_ROW = 4 + 64 + 32  # int32 scales, int32 nibble indices, bf16 lut gather (see module docstring)
_LUT_BYTES = 16 * 2  # the 16-entry FP4_VALUES lookup table in bf16


def mxfp4_packed_bytes(numel: int) -> tuple[int, int]:
    """(blocks, scales) bytes of one MXFP4 tensor of ``numel`` values."""
    rows = -(numel // -_VALUES_PER_ROW)
    return rows * 16, rows


def mxfp4_load_spike(numel: int) -> int:
    """Bytes above the dequantized result while one MXFP4 tensor of ``numel`` values is dequantized."""
    blocks, scales = mxfp4_packed_bytes(numel)
    return blocks + scales + _TRANSIENT_PER_ROW * scales + _LUT_BYTES


def mxfp4_findings(inventory: ModelInventory, load: Dtype) -> tuple[Finding, ...]:
    """What an MXFP4 checkpoint changes for a training run that loads ``inventory`` in ``load``.

    The caller drops the quantized base: the experts are counted dense, in the load dtype.
    """
    experts = [p for p in inventory.params if p.kind is Kind.FUSED_EXPERTS]
    if not experts:
        return ()
    dense = sum(p.numel for p in experts) * load.nbytes
    packed = sum(sum(mxfp4_packed_bytes(p.numel_each)) * p.repeat for p in experts)
    spike = max(mxfp4_load_spike(p.numel_each) for p in experts)
    return (
        Finding(
            "mxfp4-dequantized-for-training",
            Severity.WARNING,
            f"the MXFP4 experts ({format_bytes(packed)} packed) cannot be trained as MXFP4: transformers 5.23 "
            f"quantizer_mxfp4.py is_trainable is False, so training loads them dequantized "
            f"(Mxfp4Config(dequantize=True)): {format_bytes(dense)} of experts in "
            f"{load.value}, counted as such; loading dequantizes one expert tensor at a "
            f"time, {format_bytes(spike)} above the loaded weights on the load device",
            "load with dtype=torch.bfloat16 and Mxfp4Config(dequantize=True), then LoRA (target_parameters on "
            "the experts, or attention only); the step estimate already assumes the dequantized experts",
        ),
    )
