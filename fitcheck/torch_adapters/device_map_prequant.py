"""Placing a pre-quantized (GPTQ / AWQ / FP8) base with ``device_map``: at its packed bytes, not 16-bit sizes.

transformers 5.23 converts a pre-quantized model's linears before it infers the device map
(``quantizers/quantizer_gptq.py`` / ``quantizer_awq.py`` ``_process_model_before_weight_loading`` replace them
by modules holding the packed ``qweight`` / ``qzeros`` / ``scales`` / ``g_idx`` buffers), so
``integrations/accelerate.py`` ``compute_module_sizes`` sizes each layer at its packed bytes. Those quantizers
need gptqmodel / kernels to build the modules, which the meta model here does not have; the same sizes come from
an object with the two methods ``get_balanced_memory`` / ``infer_auto_device_map`` call on ``hf_quantizer``:
``param_element_size`` (bytes per element of a quantized weight = its packed data + scales/zeros/g_idx,
:func:`fitcheck.core.states.quantized_bytes`, divided by its element count) and ``adjust_max_memory``
(identity: neither the GPTQ nor the AWQ quantizer overrides ``quantizers/base.py``'s).
"""

from __future__ import annotations

import re
from typing import Any

from fitcheck.core.states import is_quantized, quantized_bytes
from fitcheck.spec import TrainingSpec


class PackedSizes:
    """The ``hf_quantizer`` interface ``infer_auto_device_map`` reads, sized from the spec's inventory."""

    def __init__(self, spec: TrainingSpec) -> None:
        """Args:
        spec: A run whose ``quant`` is pre-quantized (not bitsandbytes).
        """
        quant = spec.quant
        self._sizes: list[tuple[re.Pattern[str], float]] = []
        if quant is None:
            return
        for entry in spec.model.params:
            if not is_quantized(spec, entry) or not entry.numel_each:
                continue
            qb = quantized_bytes(entry.numel_each, quant, entry.out_features or entry.shape[0])
            pattern = re.compile(re.escape(entry.name).replace(r"\*", r"\d+") + "$")
            self._sizes.append((pattern, (qb.data + qb.meta) / entry.numel_each))

    def element_size(self, name: str) -> float | None:
        """Bytes per element of a parameter stored packed (None: not quantized)."""
        for pattern, size in self._sizes:
            if pattern.search(name):
                return size
        return None

    def param_element_size(self, model: Any, param_name: str, param: Any) -> float:
        """transformers ``HfQuantizer.param_element_size``."""
        size = self.element_size(param_name)
        return float(param.element_size()) if size is None else size

    def adjust_max_memory(self, max_memory: dict[Any, Any]) -> dict[Any, Any]:
        """transformers ``HfQuantizer.adjust_max_memory`` (identity for GPTQ / AWQ / FP8)."""
        return max_memory


def packed_sizes(spec: TrainingSpec) -> PackedSizes | None:
    """A sizes object for a pre-quantized non-bitsandbytes base (None otherwise)."""
    quant = spec.quant
    if quant is None or not quant.pre_quantized or quant.method == "bitsandbytes":
        return None
    return PackedSizes(spec)
