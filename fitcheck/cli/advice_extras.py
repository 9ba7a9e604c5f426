"""What ``fitcheck estimate`` and ``fitcheck launch`` print beside the report: the largest micro-batch that fits
(with the smaller one where the published gap decides it unreplayed), the advisor's suggestions and the compute
estimate, as JSON fields (:func:`extras_to_json`) or table lines (:func:`extras_renderables`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fitcheck.report import Report
from fitcheck.spec import TrainingSpec


def advice_extras(
    report: Report,
    *,
    mfu: float | None,
    estimate_fn: Callable[[TrainingSpec], Report] | None = None,
    device_map: str | None = None,
) -> dict[str, object]:
    """``max_micro_batch``, ``suggestions`` and ``compute`` for the JSON and the table.

    ``estimate_fn`` is the path the headline number took (``fitcheck.torch_adapters.pinned_path``): the
    largest micro-batch and every suggestion are estimated the same way.
    """
    from fitcheck.advice import advise, max_micro_batch
    from fitcheck.core import compute_estimate

    compute = compute_estimate(report.spec, mfu=mfu)
    search, boundary = estimate_fn, None
    if estimate_fn is not None:  # near the budget the boundary is replayed, not every probe (verdict_replay)
        from fitcheck.torch_adapters import search_and_boundary

        search, boundary = search_and_boundary(estimate_fn)
    largest = max_micro_batch(report.spec, search, boundary_fn=boundary)  # before the advisor: replays are capped
    band_low = None
    if search is not None:  # the largest micro-batch's verdict on the published gap, inside its band, unreplayed
        from fitcheck.torch_adapters import band_low_micro_batch

        band_low = band_low_micro_batch(report.spec, largest, boundary or search, search)
    suggestions = advise(report.spec, report, estimate_fn=estimate_fn)
    if device_map:
        suggestions = tuple(s for s in suggestions if s.spec is None or not distributed_mode(s.spec))
    extras: dict[str, object] = {
        "max_micro_batch": largest,
        "suggestions": suggestions,
        "compute": compute,
    }
    if band_low is not None:
        extras["max_micro_batch_if_reserved_high"], extras["max_micro_batch_warning"] = band_low
    return extras


def largest_line(extras: Mapping[str, object]) -> str:
    """The largest micro-batch, with the smaller one that fits if reserved is as far above the published gap as
    measured, where that gap decides it unreplayed (``torch_adapters.band_low_micro_batch``)."""
    line = f"largest micro-batch that fits at this sequence length: {extras['max_micro_batch']}"
    low = extras.get("max_micro_batch_if_reserved_high")
    if low is None:
        return line
    return (f"{line}, or {low or 'none'} if reserved is as far above the published 11 % gap as measured; at "
            f"{extras['max_micro_batch']}, {extras['max_micro_batch_warning']}")


def distributed_mode(spec: TrainingSpec) -> bool:
    """The run is in one of accelerate's distributed modes (DeepSpeed, FSDP, several processes).

    A ``device_map`` model cannot be trained in any of them: accelerate 1.15 accelerator.py ``prepare_model``
    raises "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode", and
    transformers 5.23 integrations/accelerate.py raises "DeepSpeed Zero-3 is not compatible with passing a
    `device_map`". Such a suggestion is not printed for a device_map run.
    """
    from fitcheck.spec import Strategy

    sharding = spec.sharding
    return sharding.strategy in (Strategy.DEEPSPEED, Strategy.FSDP) or sharding.num_processes > 1


def extras_to_json(extras: Mapping[str, object]) -> dict[str, object]:
    """The advisor/compute extras as JSON fields (``max_micro_batch``, ``suggestions``, ``compute``)."""
    from fitcheck.render import advice_to_dict

    out = advice_to_dict(
        extras["max_micro_batch"],  # type: ignore[arg-type]
        extras["suggestions"],  # type: ignore[arg-type]
        extras["compute"],  # type: ignore[arg-type]
    )
    if "max_micro_batch_if_reserved_high" in extras:  # torch_adapters.band_low_micro_batch
        out["max_micro_batch_if_reserved_high"] = extras["max_micro_batch_if_reserved_high"]
        out["max_micro_batch_warning"] = extras["max_micro_batch_warning"]
    if "device_map_gpus" in extras:  # multi-GPU device_map: one entry per GPU (advice/device_map_gpus.py)
        out["device_map_gpus"] = extras["device_map_gpus"]
    return out


def extras_renderables(extras: Mapping[str, object]) -> list[Any]:
    """The advisor/compute extras as rich renderables for the table output."""
    from fitcheck.render import compute_line, suggestions_table

    return [
        largest_line(extras),
        compute_line(extras["compute"]),  # type: ignore[arg-type]
        suggestions_table(extras["suggestions"]),  # type: ignore[arg-type]
    ]
