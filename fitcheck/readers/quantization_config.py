"""Read a quantization config: a ``BitsAndBytesConfig`` object or dict, or config.json
``quantization_config``.

bitsandbytes 4/8-bit is modelled (:class:`QuantSpec`), and so are pre-quantized GPTQ, AWQ, FP8,
compressed-tensors FP8 and MXFP4 checkpoints (:mod:`fitcheck.readers.prequant_config`); other methods (HQQ, ...)
are named in a not-modelled finding, never silently read as bitsandbytes. Defaults are transformers
5.23's
``BitsAndBytesConfig`` (``utils/quantization_config.py``: bnb_4bit_quant_type "fp4", compute dtype None =
fp32,
quant storage uint8); ``to_dict()`` writes ``_load_in_4bit`` as well as ``load_in_4bit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.prequant_config import PREQUANT_READ, prequant_from_mapping
from fitcheck.readers.sources import as_bool, as_float, as_str, as_str_list, where
from fitcheck.spec import Dtype, QuantSpec

_BNB_FIELDS = (
    "quant_method",
    "load_in_4bit",
    "load_in_8bit",
    "_load_in_4bit",
    "_load_in_8bit",
    "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant",
    "bnb_4bit_compute_dtype",
    "bnb_4bit_quant_storage",
    "llm_int8_skip_modules",
    "llm_int8_threshold",
    "llm_int8_has_fp16_weight",
)


def _dtype(value: object, at: str) -> Dtype | None:
    if value is None:
        return None
    dtype = Dtype.from_name(value)  # also a torch.dtype, which prints as "torch.bfloat16"
    if dtype is None:
        raise ConfigError(f"{at}: unknown dtype {value!r}; use bfloat16, float16, float32 or uint8")
    return dtype


def quant_from_mapping(
    raw: Mapping[str, object], *, source: str, pre_quantized: bool = False
) -> QuantSpec | Finding | None:
    """A :class:`QuantSpec` from BitsAndBytesConfig fields, a not-modelled finding, or None.

    Args:
        raw: ``BitsAndBytesConfig.to_dict()`` / config.json ``quantization_config`` / keyword arguments.
        source: Where it came from.
        pre_quantized: The mapping came from a checkpoint's config.json (weights already quantized).

    Returns:
        The spec; a warning finding for a method that is not bitsandbytes; None when nothing is quantized.

    Raises:
        ConfigError: Bad values (both 4 and 8 bit, unknown quant type or dtype).
    """
    method = raw.get("quant_method")
    if isinstance(method, Enum):
        method = method.value
    if method is not None and str(method).lower() in PREQUANT_READ:
        return prequant_from_mapping(str(method).lower(), raw, source=source)
    if method is not None and str(method).lower() != "bitsandbytes":
        return Finding(
            "quantization-not-modelled",
            Severity.WARNING,
            f"{where(source, 'quant_method')}: {method} quantization is not "
            "modelled (only bitsandbytes 4/8-bit); "
            "weights are estimated as if unquantized",
            "the estimate over-counts weight memory for this checkpoint",
        )
    four = as_bool(
        raw.get("load_in_4bit", raw.get("_load_in_4bit", False)) or False, at=where(source, "load_in_4bit")
    )
    eight = as_bool(
        raw.get("load_in_8bit", raw.get("_load_in_8bit", False)) or False, at=where(source, "load_in_8bit")
    )
    if four and eight:
        raise ConfigError(
            f"{source}: load_in_4bit and load_in_8bit are both true; choose one (transformers refuses)"
        )
    if not (four or eight):
        return None
    if eight and as_bool(raw.get("llm_int8_has_fp16_weight") or False, at=where(source, "llm_int8_has_fp16_weight")):
        # bitsandbytes 0.50.2 nn/modules.py: Int8Params._quantize returns the fp16 weight unquantized when
        # has_fp16_weights, and MatMul8bitLt quantizes it again into state.CB / SCB on every training forward
        return Finding(
            "quantization-not-modelled",
            Severity.WARNING,
            f"{where(source, 'llm_int8_has_fp16_weight')}: true keeps the 16-bit weights (bitsandbytes "
            "Int8Params._quantize leaves them unquantized) and re-quantizes them on every forward; not modelled: "
            "weights are estimated as if unquantized",
            "the default (false) is what LoRA on an 8-bit base uses; the estimate omits the per-layer int8 copies",
        )
    threshold = raw.get("llm_int8_threshold")
    int8_threshold = (QuantSpec.int8_threshold if threshold is None
                      else as_float(threshold, at=where(source, "llm_int8_threshold")))
    if int8_threshold < 0:
        raise ConfigError(f"{where(source, 'llm_int8_threshold')}: must be >= 0 (bitsandbytes refuses), got "
                          f"{int8_threshold}")
    qtype = as_str(raw.get("bnb_4bit_quant_type") or "fp4", at=where(source, "bnb_4bit_quant_type")).lower()
    if qtype not in ("nf4", "fp4"):
        raise ConfigError(f"{where(source, 'bnb_4bit_quant_type')}: must be nf4 or fp4, got {qtype!r}")
    storage = (
        _dtype(raw.get("bnb_4bit_quant_storage"), where(source, "bnb_4bit_quant_storage")) or Dtype.UINT8
    )
    skip = raw.get("llm_int8_skip_modules")
    return QuantSpec(
        bits=4 if four else 8,
        quant_type=qtype,
        double_quant=as_bool(
            raw.get("bnb_4bit_use_double_quant", False) or False,
            at=where(source, "bnb_4bit_use_double_quant"),
        ),
        quant_storage=storage,
        compute_dtype=_dtype(raw.get("bnb_4bit_compute_dtype"), where(source, "bnb_4bit_compute_dtype")),
        skip_modules=as_str_list(skip, at=where(source, "llm_int8_skip_modules")) if skip else (),
        pre_quantized=pre_quantized,
        int8_threshold=int8_threshold,
    )


def quant_from_object(config: object, *, source: str = "BitsAndBytesConfig") -> QuantSpec | Finding | None:
    """Read a live ``BitsAndBytesConfig`` (or other transformers quantization config) by attribute.

    Raises:
        ConfigError: Bad values.
    """
    raw = {name: getattr(config, name) for name in _BNB_FIELDS if hasattr(config, name)}
    return quant_from_mapping(raw, source=source)


def quant_from_model_config(config: Mapping[str, object], *, source: str) -> QuantSpec | Finding | None:
    """The ``quantization_config`` inside a checkpoint's config.json (pre-quantized weights), if any.

    Raises:
        ConfigError: Bad values.
    """
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise ConfigError(f"{where(source, 'quantization_config')}: expected a mapping, got {qc!r}")
    return quant_from_mapping(qc, source=f"{source}:quantization_config", pre_quantized=True)
