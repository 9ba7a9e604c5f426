"""DeepSpeed ZeRO-3 over a bitsandbytes base: what the engine partitions and what stays whole on every GPU; pure.

transformers 5.23 builds a quantized model outside ``zero.Init`` (``modeling_utils.py`` ``get_init_context``: the
``zero.Init`` context only ``if not is_quantized``), so every rank loads and quantizes the whole base on its GPU and
``deepspeed.initialize`` partitions it afterwards (deepspeed 0.19.8 ``runtime/zero/parameter_offload.py``
``_convert_to_zero_parameters`` -> ``partition_parameters.py`` ``Init(module=...)``): each parameter keeps a
``ds_tensor`` of ``1/N`` of its elements and ``param.data`` becomes an empty tensor. DeepSpeed accepts both
bitsandbytes parameter classes (the all-gather groups the partitions by dtype, ``_all_gather_dtype`` /
``dtype_params``, so a ``uint8`` or ``int8`` partition gathers beside the bf16 ones). What that frees differs:

* 4-bit (``Params4bit``, bitsandbytes 0.50.2 ``nn/modules.py``): the packed weight is only the parameter's data, so
  the packed bytes are partitioned. Its ``QuantState`` (absmax, nested absmax and code, the code table) is an
  attribute of the parameter and of ``Linear4bit``, not a parameter: whole on every GPU.
* 8-bit (``Int8Params``): ``Int8Params._quantize`` keeps the int8 weight twice, as ``data`` and as the attribute
  ``CB``; ``Linear8bitLt.init_8bit_state`` moves ``CB`` / ``SCB`` to ``state`` in the first forward and sets
  ``self.weight.data = self.state.CB`` after each. So every whole int8 weight stays on every GPU, and the ZeRO-3
  partition is an extra ``1/N`` copy.

Measured on the real engine (CPU, torch's fake process group, 8 ranks, tiny Llama h128 2 layers, q/v LoRA, ZeRO-3):
4-bit: every ``Params4bit`` has ``data.numel() == 0`` after ``initialize`` and after a step, its partitions sum to
21,504 B of the 172,032 packed; 8-bit: the partitions sum to 43,008 B and ``state.CB`` keeps all 294,912 int8 B
alive after a step (``SCB``: 8,192 B).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.spec import Strategy, TrainingSpec

SOURCE = ("deepspeed 0.19.8 runtime/zero/partition_parameters.py (ds_tensor partitions) + bitsandbytes 0.50.2 "
          "nn/modules.py (QuantState attribute; Int8Params.CB / Linear8bitLt.state.CB keep the whole int8 weight); "
          "real engine, 8 fake ranks (core/states/zero3_quant.py)")


@dataclass(frozen=True)
class Zero3QuantPlacement:
    """Where a bitsandbytes base lives on one GPU under ZeRO-3.

    Attributes:
        data_whole: Every whole quantized weight stays on every GPU (8-bit: ``state.CB``), beside its partition.
        detail: One line for the report.
    """

    data_whole: bool
    detail: str


def zero3_quant_placement(spec: TrainingSpec, divisor: int) -> Zero3QuantPlacement | None:
    """How ZeRO-3 places the run's bitsandbytes base (None outside ZeRO-3 over more than one process or without one).

    Args:
        spec: The training spec.
        divisor: ZeRO-3's weight divisor (``partition(spec).weights``).

    Returns:
        The placement; the quantization state (absmax / code / SCB) is whole on every GPU either way.
    """
    quant = spec.quant
    if (spec.sharding.strategy is not Strategy.DEEPSPEED or spec.sharding.zero_stage != 3 or divisor <= 1
            or quant is None or quant.method != "bitsandbytes"):
        return None
    if quant.bits == 8:
        return Zero3QuantPlacement(True, "whole int8 weights on every GPU (Linear8bitLt state.CB) + ZeRO-3's "
                                         f"1/{divisor} partition")
    return Zero3QuantPlacement(False, f"packed bytes partitioned 1/{divisor}; quantization state whole")
