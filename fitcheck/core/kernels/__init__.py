"""Fused kernels and memory levers users switch on: Liger-Kernel, Cut Cross-Entropy, offloading, compile.

Each module derives what an implementation allocates from that library's source (version in the module).
"""

from fitcheck.core.kernels.cce import CCE_VERSION, cce_bytes
from fitcheck.core.kernels.liger import (
    FLCE_CHUNK_BYTES_PER_LOGIT,
    LIGER_CONFIG_KEYS,
    LIGER_VERSION,
    FusedLossBytes,
    flce_bytes,
    flce_chunk_size,
    liger_applies,
    liger_mlp_delta,
    liger_norm_saved,
)
from fitcheck.core.kernels.loss import LOSSES, effective_loss, fused_loss, head_trained, liger_cross_entropy
from fitcheck.core.kernels.module_cast import (
    activation_view,
    deepspeed_module_view,
    deepspeed_quant_storage_problem,
    fsdp_adapters_16bit,
)
from fitcheck.core.kernels.offloading import lever_findings, offload_applies, offload_split

__all__ = [
    "CCE_VERSION",
    "FLCE_CHUNK_BYTES_PER_LOGIT",
    "LIGER_CONFIG_KEYS",
    "LIGER_VERSION",
    "LOSSES",
    "FusedLossBytes",
    "activation_view",
    "cce_bytes",
    "deepspeed_module_view",
    "deepspeed_quant_storage_problem",
    "effective_loss",
    "flce_bytes",
    "flce_chunk_size",
    "fsdp_adapters_16bit",
    "fused_loss",
    "head_trained",
    "lever_findings",
    "liger_applies",
    "liger_cross_entropy",
    "liger_mlp_delta",
    "liger_norm_saved",
    "offload_applies",
    "offload_split",
]
