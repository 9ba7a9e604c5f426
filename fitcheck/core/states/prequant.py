"""Pre-quantized checkpoints (GPTQ, AWQ, FP8, compressed-tensors): exact bytes per layer and which layers.

Which modules (transformers 5.23):

* GPTQ (``quantizers/quantizer_gptq.py`` -> optimum ``GPTQQuantizer.convert_model``): every ``nn.Linear`` inside
  the repeated decoder blocks (``block_name_to_quantize``, e.g. ``model.layers``) -- never the embeddings or
  the LM head, which live outside the blocks.
* AWQ (``quantizers/quantizer_awq.py`` + ``integrations/awq.py replace_with_awq_linear``), finegrained FP8
  (``quantizer_finegrained_fp8.py``) and compressed-tensors: every ``nn.Linear`` except
  ``modules_to_not_convert`` and the default skips (``quantizers/base.py get_modules_to_not_convert`` with
  ``add_default_skips`` -> ``get_keys_to_not_convert``: the output embeddings / tied weights and the module of
  the last parameter).

Bytes per quantized ``nn.Linear(in, out)`` (checkpoint layouts, which the torch/triton kernels keep as is):

* GPTQ (gptqmodel ``nn_modules/qlinear`` ``BaseQuantLinear`` buffers, the AutoGPTQ v1 format): ``qweight`` int32
  ``[in·bits/32, out]``, ``qzeros`` int32 ``[groups, out·bits/32]``, ``scales`` fp16 ``[groups, out]``,
  ``g_idx`` int32 ``[in]``; ``groups = ceil(in / group_size)`` (one group for ``group_size = -1``).
* AWQ (gptqmodel ``awq_gemm`` / AutoAWQ ``WQLinear_GEMM``): ``qweight`` int32 ``[in, out·bits/32]``, ``qzeros``
  int32 ``[groups, out·bits/32]``, ``scales`` fp16 ``[groups, out]``; no ``g_idx``.
* FP8 (``integrations/finegrained_fp8.py FP8Linear.__init__``): ``weight`` float8_e4m3 ``[out, in]`` (1 B) and
  ``weight_scale_inv`` fp32 ``[ceil(out/b0), ceil(in/b1)]`` for ``weight_block_size (b0, b1)``, else one fp32
  scalar; compressed-tensors FP8 ``strategy: channel`` keeps one fp32 scale per output row.
* biases stay in the load dtype (a fp16 buffer of the quantized layer).

Training on them: the base is frozen and LoRA adapters sit on top (peft ``tuners/lora/gptq.py``,
``awq.py``); transformers' ``FP8Linear`` backward dequantizes the weight for the input gradient
(``_dequantize_fp8_weight``). TRL 1.16 ``SFTTrainer`` does not call ``prepare_model_for_kbit_training`` for
them (``_is_quantized_model`` reads ``is_loaded_in_4bit`` / ``is_loaded_in_8bit``, bitsandbytes only), and
peft's own k-bit preparation skips the fp32 upcast for GPTQ (``utils/other.py``): no upcast is modelled.
"""

from __future__ import annotations

from fitcheck.spec import ParamEntry, QuantSpec, Role

PREQUANT_METHODS = frozenset({"gptq", "awq", "fp8", "compressed-tensors"})
SOURCE = {
    "gptq": "gptqmodel nn_modules/qlinear BaseQuantLinear buffers (qweight/qzeros int32, scales fp16, g_idx int32); "
    "transformers 5.23 quantizers/quantizer_gptq.py",
    "awq": "gptqmodel awq_gemm / AutoAWQ WQLinear_GEMM buffers (qweight/qzeros int32, scales fp16); "
    "transformers 5.23 integrations/awq.py replace_with_awq_linear",
    "fp8": "transformers 5.23 integrations/finegrained_fp8.py FP8Linear (fp8 weight + fp32 weight_scale_inv)",
    "compressed-tensors": "transformers 5.23 quantizers/quantizer_compressed_tensors.py (compressed-tensors FP8: "
    "fp8 weight + fp32 scale)",
}


def _ceil_div(a: int, b: int) -> int:
    return -(a // -b)


def prequant_layer_bytes(quant: QuantSpec, in_features: int, out_features: int) -> tuple[int, int]:
    """(data, metadata) bytes of one quantized ``nn.Linear(in_features, out_features)`` weight.

    Args:
        quant: The checkpoint's scheme (``method`` in :data:`PREQUANT_METHODS`).
        in_features: Input features.
        out_features: Output features.

    Returns:
        Packed weight bytes and the scales / zeros / g_idx bytes.
    """
    method, bits = quant.method, quant.bits
    if method in ("gptq", "awq"):
        group = in_features if quant.group_size <= 0 else quant.group_size
        groups = _ceil_div(in_features, group)
        packed_out = _ceil_div(out_features * bits, 32)
        if method == "gptq":
            data = 4 * _ceil_div(in_features * bits, 32) * out_features
            meta = 4 * groups * packed_out + 2 * groups * out_features + 4 * in_features
        else:
            data = 4 * in_features * packed_out
            meta = 4 * groups * packed_out + 2 * groups * out_features
        return data, meta
    # FP8 (finegrained or compressed-tensors): one byte per weight
    data = in_features * out_features
    if quant.block_size is not None:
        b0, b1 = quant.block_size
        meta = 4 * _ceil_div(out_features, b0) * _ceil_div(in_features, b1)
    elif method == "compressed-tensors":
        meta = 4 * out_features
    else:
        meta = 4
    return data, meta


def prequant_converts(quant: QuantSpec, entry: ParamEntry, is_last: bool) -> bool:
    """Whether the checkpoint stores this ``nn.Linear`` weight quantized.

    Args:
        quant: The scheme.
        entry: A LINEAR weight entry (the caller checked the kind and applied ``modules_to_not_convert``).
        is_last: The entry is the model's last parameter (``get_keys_to_not_convert`` skips its module).
    """
    if entry.role in (Role.LM_HEAD, Role.EMBEDDING):
        return False
    if quant.method == "gptq":
        return entry.per_layer  # optimum converts the linears of the repeated blocks only
    return not is_last
