"""The report as a JSON-ready dict (``fitcheck estimate --json``).

Field names are a contract other tools rely on: extend, don't rename. ``components`` maps each component's
name to its bytes in the peak phase (device components) or at its largest (outside the allocator, host).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fitcheck.advice import Suggestion
from fitcheck.core import ComputeEstimate
from fitcheck.report import Location, Report, phases_of
from fitcheck.spec import MODELLED_VERSIONS, Strategy, TrainingSpec


def report_to_dict(report: Report) -> dict[str, Any]:
    """Serialise a report.

    Args:
        report: The estimate.

    Returns:
        A dict with ``fits``, ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``device_used_bytes``,
        ``budget_bytes``, ``host_bytes``, ``components`` (name -> bytes), ``findings`` and more detail
        (``peak_phase``, ``phases``, ``component_detail``, ``regime``, parameter counts, ``assumptions``),
        ``versions`` (the environment's library versions and their ``source``: installed or ``--stack``) and
        ``modelled_versions`` (the versions the formulas were read from).
    """
    spec = report.spec
    return {
        "model": spec.model.model_id,
        "trainer": spec.trainer.kind.value,
        "fits": report.fits,
        "pinned": report.pinned,
        "peak_allocated_bytes": report.peak_allocated_bytes,
        "peak_reserved_bytes": report.peak_reserved_bytes,
        "device_used_bytes": report.device_used_bytes,
        "budget_bytes": report.budget_bytes,
        "host_bytes": report.host_bytes,
        "peak_phase": report.peak_phase.value,
        "components": report.at_peak(),
        "phases": {p.value: total for p, total in report.phase_totals(Location.DEVICE).items()},
        "component_detail": [
            {
                "name": c.name,
                "category": c.category.value,
                "location": c.location.value,
                "bytes_by_phase": {p.value: c.at(p) for p in phases_of(report.components)},
                "source": c.source,
                "detail": c.detail,
            }
            for c in report.components
        ],
        "findings": [f.to_dict() for f in report.findings],
        "regime": report.regime,
        "total_params": report.total_params,
        "trainable_params": report.trainable_params,
        "gpu": spec.hardware.gpu_name,
        "num_processes": spec.sharding.num_processes,
        "strategy": spec.sharding.strategy.value,
        "parallelism": _parallelism(spec),
        "micro_batch": spec.batch.micro_batch,
        "seq_len": spec.batch.seq_len,
        "gradient_accumulation_steps": spec.batch.grad_accum,
        "assumptions": list(report.assumptions),
        "versions": {"source": spec.stack.source or "unknown", **dict(spec.stack.versions)},
        "modelled_versions": dict(MODELLED_VERSIONS),
    }


def advice_to_dict(
    max_micro_batch: int, suggestions: Sequence[Suggestion], compute: ComputeEstimate
) -> dict[str, Any]:
    """The advice fields of ``--json``: ``max_micro_batch``, ``suggestions`` and ``compute``.

    Args:
        max_micro_batch: The largest micro-batch that fits (0: none).
        suggestions: The advisor's ranked suggestions.
        compute: The compute estimate of the run.

    Returns:
        The three fields, JSON-ready.
    """
    return {
        "max_micro_batch": max_micro_batch,
        "suggestions": [s.to_dict() for s in suggestions],
        "compute": compute.to_dict(),
    }


def _parallelism(spec: TrainingSpec) -> dict[str, int]:
    """The layout as applied: accelerate's ``ParallelismConfig`` sizes, or the data-parallel split the strategy
    makes without one (DDP and ZeRO-0 replicate; ZeRO >= 1 and FSDP shard; HYBRID_SHARD shards within a node)."""
    sh = spec.sharding
    if sh.parallelism is not None:
        return sh.parallelism.as_dict()
    n = sh.num_processes
    replicate, shard = n, 1
    if sh.strategy is Strategy.FSDP:
        fs = sh.fsdp
        kind = fs.sharding_strategy if fs is not None else "FULL_SHARD"
        if kind.startswith("HYBRID"):
            replicate, shard = sh.num_machines, sh.processes_per_machine
        elif kind != "NO_SHARD":
            replicate, shard = 1, n
    elif sh.strategy is Strategy.DEEPSPEED and sh.deepspeed is not None and sh.deepspeed.stage >= 1:
        replicate, shard = 1, n
    return {"dp_replicate": replicate, "dp_shard": shard, "tp": 1, "cp": 1, "sp": 1}
