"""The ``device_map`` check's findings: trainable parameters on ``cpu``/``disk``, and maps accelerate refuses.

``from_pretrained(..., device_map="auto")`` places *weights* only. A model trained in one process with layers on
CPU gets no error from accelerate (it refuses only in distributed mode, ``Accelerator.prepare_model``, or for
4/8-bit models); the offloaded layers are moved to the GPU for every forward and backward, and their gradients
and optimizer states live on the CPU. :func:`device_map_findings` predicts the placement offline
(:func:`fitcheck.torch_adapters.device_map.predict_placement`) and turns it into findings;
:func:`placement_findings` does the same for an observed placement
(``fitcheck.torch_adapters.live_model.live_device_map_findings``).

torch, transformers and accelerate are imported lazily, by the placement code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from fitcheck.findings import Finding, Severity
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.device_map import UNBOUNDED_CPU, Placement, parse_max_memory, predict_placement
from fitcheck.units import format_bytes

_FIX_HINT = (
    "For training, do not load with device_map='auto': load on one device per process and shard with "
    "DeepSpeed ZeRO-3 or FSDP (with CPU offload if it must spill), use QLoRA/LoRA so that the trainable part is "
    "small and stays on the GPU, or give a max_memory under which every trainable layer fits on the GPUs."
)


def summarize_modules(names: Iterable[str], limit: int = 12) -> str:
    """Collapse ``model.layers.20`` ... ``model.layers.31`` into ``model.layers.20-31`` for a message."""
    groups: dict[tuple[str, str], list[int]] = {}
    order: list[tuple[str, str]] = []
    singles: list[str] = []
    for name in names:
        match = re.match(r"^(.*?\.)(\d+)((?:\..*)?)$", name)
        if match is None:
            singles.append(name)
            continue
        key = (match.group(1), match.group(3))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(match.group(2)))
    parts: list[str] = []
    for prefix, suffix in order:
        idx = sorted(set(groups[(prefix, suffix)]))
        runs: list[str] = []
        start = prev = idx[0]
        for i in [*idx[1:], None]:
            if i is not None and i == prev + 1:
                prev = i
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            if i is not None:
                start = prev = i
        parts.append(f"{prefix}{','.join(runs)}{suffix}" if len(runs) == 1 else f"{prefix}{{{','.join(runs)}}}{suffix}")
    parts.extend(singles)
    if len(parts) > limit:
        parts = [*parts[:limit], f"... ({len(parts) - limit} more)"]
    return ", ".join(parts)


def _format_memory(mem: Mapping[int | str, int]) -> str:
    return ", ".join(f"{k}={format_bytes(v)}" for k, v in mem.items() if v < UNBOUNDED_CPU)


def placement_findings(placement: Placement, *, label: str, num_processes: int = 1) -> tuple[Finding, ...]:
    """Findings for a (predicted or observed) placement.

    Args:
        placement: The placement.
        label: How the map came about, e.g. ``"device_map='auto' with max_memory 0=24.00 GiB"``.
        num_processes: Processes the run is launched with.
    """
    out: list[Finding] = []
    if placement.offloaded_modules:
        where = sorted({str(placement.device_map.get(m, "cpu")) for m in placement.offloaded_modules})
        out.append(
            Finding(
                "trainable-offloaded",
                Severity.ERROR,
                f"{label} puts {placement.offloaded_trainable_params:,} of {placement.trainable_params:,} "
                f"trainable parameters on {'/'.join(where)}, in {len(placement.offloaded_modules)} module(s): "
                f"{summarize_modules(placement.offloaded_modules)}. device_map places weights for inference: "
                "offloaded layers are copied to the GPU in every forward and backward and their gradients and "
                "optimizer states stay on the CPU (very slow, or it fails when the optimizer mixes devices); "
                "accelerate refuses such a model outright in distributed mode.",
                _FIX_HINT,
            )
        )
    if placement.quantizer_error:
        out.append(Finding("quantized-offload-refused", Severity.ERROR, f"{label}: {placement.quantizer_error}",
                           "Give the GPUs more max_memory, or use a smaller model or a 4-bit base that fits."))
    multi_device = len(placement.devices) > 1
    if multi_device and num_processes > 1:
        # accelerate/accelerator.py prepare_model: "You can't train a model that has been loaded with
        # `device_map='auto'` in any distributed mode."
        out.append(
            Finding(
                "device-map-distributed",
                Severity.ERROR,
                f"{label} spreads the model over {len(placement.devices)} devices, and the run is launched on "
                f"{num_processes} processes: accelerate raises \"You can't train a model that has been loaded with "
                "`device_map='auto'` in any distributed mode\".",
                "Launch one process (`--num_processes 1`) for naive model parallelism, or drop device_map and "
                "use DeepSpeed ZeRO-3 / FSDP across the processes.",
            )
        )
    return tuple(out)


def device_map_findings(
    spec: TrainingSpec,
    device_map: str,
    max_memory: str | Mapping[str, int] | Mapping[int | str, int] | None,
) -> tuple[Finding, ...]:
    """Predict the ``device_map`` placement offline and report trainable parameters it offloads.

    Args:
        spec: The run.
        device_map: ``"auto"``, ``"balanced"``, ``"balanced_low_0"`` or ``"sequential"``.
        max_memory: ``{"0": bytes, "cpu": bytes, ...}`` as the user would pass it, or None (see
            :func:`predict_placement`).

    Returns:
        ``trainable-offloaded`` (error) naming the modules and the trainable count, ``quantized-offload-refused``
        and ``device-map-distributed`` where they apply; a ``device-map-not-checked`` warning when the model
        cannot be built offline.
    """
    try:
        placement = predict_placement(spec, device_map, max_memory)
    except ImportError as exc:
        return (Finding("device-map-not-checked", Severity.WARNING,
                        f"device_map={device_map!r} was not checked: {exc}", "pip install 'fitcheck[hf]'"),)
    except (ValueError, KeyError, AttributeError, TypeError, RuntimeError) as exc:
        return (Finding("device-map-not-checked", Severity.WARNING,
                        f"device_map={device_map!r} was not checked: {spec.model.model_id} could not be built "
                        f"on the meta device ({type(exc).__name__}: {exc})."),)
    label = f"device_map={device_map!r}"
    if max_memory:
        label += f" with max_memory {_format_memory(parse_max_memory(max_memory))}"
    else:
        label += f" with max_memory {_format_memory(placement.max_memory)} (assumed)"
    return placement_findings(placement, label=label, num_processes=spec.sharding.num_processes)
