"""bitsandbytes 4-bit / 8-bit bases: which parameters transformers quantizes and the exact bytes they take.

Which modules (transformers 5.23):

* ``integrations/bitsandbytes.py::replace_with_bnb_linear`` replaces ``type(module) is nn.Linear`` and GPT-2
  ``Conv1D`` only (:attr:`Kind.LINEAR` weights). Embeddings, norms, routers that are not ``nn.Linear`` and the
  fused 3-D MoE expert tensors stay in the load dtype; biases of quantized Linears stay in the load dtype.
* ``quantizers/base.py::get_keys_to_not_convert``: the output embedding (LM head), tied weights and the
  module of
  the model's last parameter are never converted; ``llm_int8_skip_modules`` are added
  (``quantizers/quantizers_utils.py::should_convert_module``: prefix up to a module boundary, regex, or
  suffix).

Bytes (bitsandbytes 0.50.2 ``functional.py``, ``_ops.py`` fake kernels):

* 4-bit packed: ``(n + 1) // (2 * s)`` elements of the storage dtype (``s`` = its itemsize): ~0.5 B/param
  for any
  ``bnb_4bit_quant_storage``; absmax fp32 per ``blocksize`` block; a 16-value fp32 code table per tensor.
* double quant (``compress_statistics``): absmax becomes uint8 per block, plus
  ``quantize_blockwise(blocksize=256)``
  state: fp32 absmax per 256 blocks, its own 256-value fp32 code copy (``code.to(..., copy=True)``) and an
  fp32
  offset scalar.
* LLM.int8 (``Int8Params``): int8 weight (1 B/param) + fp32 ``SCB`` per output row.

Measured on real bnb tensors (4096x4096, design note 04): nf4/fp4 bs64 0.562504 B/param, + double quant
0.515934, bs128 0.531254, bs128 + double quant 0.508000 — :func:`quantized_bytes` reproduces them exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fitcheck.core.states.prequant import PREQUANT_METHODS, prequant_converts, prequant_layer_bytes
from fitcheck.core.states.trl_adapters import trl_module_cast_dtype
from fitcheck.spec import Dtype, Kind, ParamEntry, QuantSpec, Role, TrainingSpec

SOURCE_4BIT = "bitsandbytes 0.50.2 functional.py quantize_4bit + _ops.py fake quantize_4bit (packed + absmax)"
SOURCE_8BIT = "bitsandbytes 0.50.2 nn/modules.py Int8Params: int8 CB + fp32 SCB per row"
SOURCE_WHICH = "transformers 5.23 integrations/bitsandbytes.py replace_with_bnb_linear + quantizers/base.py"
SOURCE_KBIT = (
    "peft 0.21.2 utils/other.py prepare_model_for_kbit_training (fp16/bf16 -> fp32 for non-Params4bit)"
)

_CODE_4BIT_BYTES = 16 * 4  # functional.get_4bit_type: 16 fp32 values per tensor
_NESTED_BLOCK = 256  # functional.quantize_4bit(compress_statistics=True) -> quantize_blockwise(blocksize=256)
_NESTED_CODE_BYTES = 256 * 4  # create_dynamic_map(): 256 fp32 values, copied per tensor
_OFFSET_BYTES = 4  # _absmax.mean(): fp32 0-d tensor


@dataclass(frozen=True)
class QuantBytes:
    """Bytes of one quantized tensor instance.

    Attributes:
        data: Packed/int8 weight bytes.
        meta: absmax/SCB, code tables, offsets.
    """

    data: int
    meta: int

    @property
    def total(self) -> int:
        """data + meta."""
        return self.data + self.meta


def _ceil_div(a: int, b: int) -> int:
    return -(a // -b)


def quantized_bytes(numel: int, quant: QuantSpec, out_features: int = 0) -> QuantBytes:
    """Bytes bitsandbytes allocates for one quantized weight.

    Args:
        numel: Elements of the weight.
        quant: The quantization settings.
        out_features: Output rows (LLM.int8 keeps one fp32 scale per row).

    Returns:
        Packed data bytes and metadata bytes.
    """
    if quant.method in PREQUANT_METHODS:  # GPTQ / AWQ / FP8 checkpoints (prequant.py)
        rows = out_features or 1
        return QuantBytes(*prequant_layer_bytes(quant, numel // rows, rows))
    if quant.bits == 8:
        rows = out_features or 1
        return QuantBytes(data=numel, meta=4 * rows)
    itemsize = quant.quant_storage.nbytes
    data = ((numel + 1) // (2 * itemsize)) * itemsize
    blocks = _ceil_div(numel, quant.blocksize)
    if quant.double_quant:
        meta = blocks + 4 * _ceil_div(blocks, _NESTED_BLOCK) + _NESTED_CODE_BYTES + _OFFSET_BYTES
    else:
        meta = 4 * blocks
    return QuantBytes(data=data, meta=meta + _CODE_4BIT_BYTES)


def bytes_per_param(numel: int, quant: QuantSpec) -> float:
    """Total bytes per parameter of one quantized tensor (for the report and the design-note table)."""
    return quantized_bytes(numel, quant).total / numel


def _skip_match(name: str, patterns: tuple[str, ...]) -> bool:
    # transformers quantizers_utils.should_convert_module: boundary regex from the start, or suffix.
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    for key in patterns:
        try:
            if re.match(rf"(?:{key}){boundary}", name):
                return True
        except re.error:
            pass
        if name.endswith(key):
            return True
    return False


def _module(entry: ParamEntry) -> str:
    return entry.name.rsplit(".", 1)[0] if "." in entry.name else entry.name


def is_quantized(spec: TrainingSpec, entry: ParamEntry) -> bool:
    """Whether transformers replaces this parameter's module by a bitsandbytes layer.

    Args:
        spec: The training spec (``spec.quant`` set).
        entry: One parameter entry.

    Returns:
        True for the weight of a converted ``nn.Linear``/``Conv1D``.
    """
    quant = spec.quant
    if quant is None or entry.kind is not Kind.LINEAR or not entry.name.endswith(".weight"):
        return False
    if quant.method == "mxfp4":  # only the fused experts are MXFP4, and training loads them dequantized (mxfp4.py)
        return False
    if entry.role in (Role.LM_HEAD, Role.EMBEDDING):  # output embeddings and tied weights
        return False
    params = spec.model.params
    last = bool(params) and params[-1] is entry
    if quant.method in PREQUANT_METHODS and not prequant_converts(quant, entry, last):
        return False
    if last:  # get_keys_to_not_convert: module of the last named parameter
        return False
    module = _module(entry)
    if quant.skip_modules:
        names = (
            [module] if "*" not in module else [module.replace("*", str(i), 1) for i in range(entry.repeat)]
        )
        if any(_skip_match(n, quant.skip_modules) for n in names):
            return False
    return True


@dataclass(frozen=True)
class BaseWeights:
    """Resident bytes of the base model's parameters after loading (and peft's k-bit preparation).

    Attributes:
        quantized_data: Packed 4-bit / int8 bytes.
        quantized_meta: absmax / SCB / code-table bytes.
        quantized_params: Parameters that were quantized.
        unquantized_params: Parameters left in a float dtype.
        upcast_params: Parameters ``prepare_model_for_kbit_training`` cast from 16-bit to fp32.
        dtype_of: Parameter name -> resident float dtype (unquantized entries only).
    """

    quantized_data: int
    quantized_meta: int
    quantized_params: int
    unquantized_params: int
    upcast_params: int
    dtype_of: dict[str, Dtype]


def base_weights(spec: TrainingSpec) -> BaseWeights:
    """Classify every base parameter as quantized or not and give its resident dtype.

    Args:
        spec: The training spec.

    Returns:
        Quantized bytes and the dtype of every unquantized parameter.
    """
    quant = spec.quant
    load = spec.precision.load_dtype
    data = meta = qparams = uparams = upcast = 0
    dtype_of: dict[str, Dtype] = {}
    quantized_modules = {_module(e) for e in spec.model.params if quant is not None and is_quantized(spec, e)}
    for entry in spec.model.params:
        if quant is not None and is_quantized(spec, entry):
            qb = quantized_bytes(entry.numel_each, quant, entry.out_features or entry.shape[0])
            data += qb.data * entry.repeat
            meta += qb.meta * entry.repeat
            qparams += entry.numel
            continue
        dtype = load
        uparams += entry.numel
        if quant is not None and quant.prepare_for_kbit_training and load.is_half:
            dtype = Dtype.FLOAT32
            upcast += entry.numel
        bnb = quant is not None and quant.method == "bitsandbytes"
        if bnb and quant is not None and quant.bits == 4 and _module(entry) in quantized_modules:
            # bitsandbytes nn/modules.py Linear4bit.forward: ``bias.data = bias.data.to(x.dtype)`` with x already
            # cast to bnb_4bit_compute_dtype (None -> fp32): the bias is resident in the compute dtype from step 1
            dtype = quant.compute_dtype or Dtype.FLOAT32
        # TRL 0.7.5-0.25.1 SFTTrainer: peft_module_casting_to_bf16 after the k-bit preparation (trl_adapters.py);
        # what it casts back to the 16-bit load dtype is no longer upcast
        cast = trl_module_cast_dtype(spec, entry, dtype)
        if cast is not dtype and cast is load:
            upcast -= entry.numel
        dtype_of[entry.name] = cast
    return BaseWeights(data, meta, qparams, uparams, upcast, dtype_of)
