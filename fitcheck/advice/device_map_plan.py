"""What a ``device_map`` plans for, and what it leaves out (pure).

``from_pretrained(device_map="auto" | "balanced" | "sequential")`` places *weights* only: transformers'
``_get_device_map`` (transformers/integrations/accelerate.py) gives accelerate's ``infer_auto_device_map`` the
``max_memory`` as a budget for parameters and buffers. Nothing reserves room for gradients, optimizer states
or activations, so a model whose weights fit the budget is put entirely on the GPU and a full fine-tune can
still run out of memory at the first step. The torch adapter ``fitcheck.torch_adapters.device_map`` computes
the placement; this module turns "everything trainable stayed on the GPU, but the step does not fit" into a
finding.
"""

from __future__ import annotations

from fitcheck.findings import Finding, Severity
from fitcheck.report import Report
from fitcheck.units import format_bytes

OFFLOAD_CODES = frozenset({"trainable-offloaded", "quantized-offload-refused"})


def weights_only_finding(report: Report, device_map: str) -> Finding | None:
    """A finding when a device_map keeps every trainable parameter on the GPU but the step does not fit.

    Args:
        report: The estimate of the run as it would be loaded with ``device_map``.
        device_map: The strategy string (``"auto"``, ``"balanced"``, ``"sequential"``).

    Returns:
        The finding, or None when an offload finding already explains the placement or the run fits.
    """
    if report.fits or any(f.code in OFFLOAD_CODES for f in report.findings):
        return None
    weights = sum(v for name, v in report.at_peak().items() if name.startswith("weights"))
    return Finding(
        "device-map-plans-weights-only",
        Severity.WARNING,
        f'device_map="{device_map}" places weights only: they fit the budget ({format_bytes(weights)} of '
        f"weights), so every trainable parameter stays on the GPU, but the training step needs "
        f"{format_bytes(report.device_used_bytes)} of {format_bytes(report.budget_bytes)}: the first step "
        "would run out of memory rather than offload",
        "device_map does not make training fit: use LoRA/QLoRA, gradient checkpointing, a smaller micro-batch, "
        "or ZeRO-3 / FSDP with CPU offload (not device_map) to spread or offload training state",
    )
