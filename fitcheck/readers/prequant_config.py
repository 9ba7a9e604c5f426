"""config.json ``quantization_config`` of pre-quantized checkpoints: GPTQ, AWQ, FP8, compressed-tensors, MXFP4.

Field names and defaults are transformers 5.23 ``utils/quantization_config.py`` (``GPTQConfig``: bits,
group_size 128, desc_act False, sym True; ``AwqConfig``: bits 4, group_size 128, zero_point True,
modules_to_not_convert; ``FineGrainedFP8Config``: weight_block_size (128, 128), modules_to_not_convert;
``Mxfp4Config``: modules_to_not_convert, dequantize False) and compressed-tensors' ``config_groups`` /
``ignore`` (FP8 weights: ``num_bits`` 8, ``type`` float, ``strategy`` tensor / channel / block).
The byte math lives in :mod:`fitcheck.core.states.prequant` and :mod:`fitcheck.core.states.mxfp4`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import as_bool, as_str_list, where
from fitcheck.spec import QuantSpec

PREQUANT_READ = frozenset({"gptq", "awq", "fp8", "compressed-tensors", "mxfp4"})


def _int(raw: Mapping[str, object], key: str, default: int, at: str) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where(at, key)}: expected an integer, got {value!r}")
    return value


def _skips(raw: Mapping[str, object], key: str, at: str) -> tuple[str, ...]:
    value = raw.get(key)
    return as_str_list(value, at=where(at, key)) if value else ()


def _block(value: object, at: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return int(value[0]), int(value[1])
    raise ConfigError(f"{at}: expected two positive integers [out, in], got {value!r}")


def _not_modelled(method: str, why: str, source: str) -> Finding:
    return Finding(
        "quantization-not-modelled",
        Severity.WARNING,
        f"{where(source, 'quant_method')}: {method} ({why}) is not modelled; weights are estimated as if "
        "unquantized",
        "the estimate over-counts weight memory for this checkpoint",
    )


def _ct_int_refusal(w: Mapping[str, object], raw: Mapping[str, object], source: str) -> str:
    """Why integer compressed-tensors weights (pack-quantized int4, W4A16/W8A16) are refused (branch i12place).

    The checkpoint layout is known (compressed-tensors ``compressors/quantized_compressors/pack_quantized.py``
    ``compression_param_info``: ``weight_packed`` int32 ``[out, ceil(in·bits/32)]``, ``weight_shape``, a
    ``weight_scale`` per group, ``weight_zero_point`` int32 ``[ceil(out·bits/32), in/group]`` when asymmetric,
    ``weight_g_idx`` with group act-order), but what stays resident while training is not: transformers 5.23
    ``quantizers/quantizer_compressed_tensors.py`` either dequantizes at load (``dequantize=True``) or leaves the
    weights packed "and lets compressed-tensors decompress them on the first forward pass", which the installed
    stack does not include (compressed-tensors is not installed), so neither the packed nor the dense size can
    be checked.
    """
    fmt = raw.get("format") or "?"
    return (
        f"{where(source, 'config_groups')}: compressed-tensors {w.get('num_bits')}-bit integer weights (format "
        f"{fmt}, group_size {w.get('group_size')}, symmetric {w.get('symmetric')}) are not modelled: transformers "
        "5.23 decompresses them through compressed-tensors on the first forward pass (or at load with "
        "CompressedTensorsConfig(dequantize=True)), and what that keeps resident is not pinned. Estimate the "
        "unquantized base model instead (its dense weights are the upper bound), or a GPTQ/AWQ export of it"
    )


def _compressed_tensors(raw: Mapping[str, object], source: str) -> QuantSpec | Finding:
    groups = raw.get("config_groups")
    found: list[Mapping[str, object]] = []
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping):
                found.append(weights)
    if not found:
        return _not_modelled("compressed-tensors", "no config_groups weights", source)
    w = found[0]
    if w.get("type") == "int":
        raise ConfigError(_ct_int_refusal(w, raw, source))
    if w.get("num_bits") != 8 or w.get("type") != "float":
        return _not_modelled("compressed-tensors", f"{w.get('num_bits')}-bit {w.get('type')} weights", source)
    strategy = str(w.get("strategy") or "tensor")
    block = _block(w.get("block_structure"), where(source, "block_structure")) if strategy == "block" else None
    return QuantSpec(
        bits=8, method="compressed-tensors", pre_quantized=True, prepare_for_kbit_training=False,
        block_size=block, group_size=0 if strategy == "channel" else -1,
        skip_modules=_skips(raw, "ignore", source),
    )


def prequant_from_mapping(method: str, raw: Mapping[str, object], *, source: str) -> QuantSpec | Finding:
    """A :class:`QuantSpec` for a pre-quantized scheme (``method`` in :data:`PREQUANT_READ`).

    Raises:
        ConfigError: A field of the wrong type.
    """
    if method == "gptq":
        return QuantSpec(
            bits=_int(raw, "bits", 4, source), method="gptq", group_size=_int(raw, "group_size", 128, source),
            desc_act=as_bool(raw.get("desc_act", False) or False, at=where(source, "desc_act")),
            pre_quantized=True, prepare_for_kbit_training=False,
        )
    if method == "awq":
        return QuantSpec(
            bits=_int(raw, "bits", 4, source), method="awq", group_size=_int(raw, "group_size", 128, source),
            zero_point=as_bool(raw.get("zero_point", True), at=where(source, "zero_point")),
            skip_modules=_skips(raw, "modules_to_not_convert", source),
            pre_quantized=True, prepare_for_kbit_training=False,
        )
    if method == "fp8":
        block = raw.get("weight_block_size", [128, 128])
        return QuantSpec(
            bits=8, method="fp8", block_size=_block(block, where(source, "weight_block_size")),
            skip_modules=_skips(raw, "modules_to_not_convert", source),
            pre_quantized=True, prepare_for_kbit_training=False,
        )
    if method == "mxfp4":
        return QuantSpec(
            bits=4, method="mxfp4", dequantize=True, skip_modules=_skips(raw, "modules_to_not_convert", source),
            pre_quantized=True, prepare_for_kbit_training=False,
        )
    return _compressed_tensors(raw, source)
