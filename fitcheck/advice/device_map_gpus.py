"""Naive model parallelism (``device_map="auto"`` over several GPUs): one estimate per GPU.

With a multi-GPU device map one process drives every GPU, each holding a contiguous run of decoder layers
(accelerate ``infer_auto_device_map`` never splits a ``_no_split_modules`` layer) and the activations of those
layers; the forward walks the GPUs in turn (accelerate ``hooks.AlignDevicesHook`` moves the hidden state to the
next GPU), the LM head and its vocabulary-sized logits and loss live on the GPU of ``lm_head``. Gradients and
optimizer states of trainable parameters live with the parameter (torch optimizers keep states on the
parameter's device). Each GPU is its own caching allocator and CUDA context.

So each GPU is estimated as its own run: the model restricted to the parameters placed on it (per-layer
entries repeated once per layer it holds), the same batch, the logits only on the head's GPU. The busiest GPU
(the largest share of its budget) decides the verdict. Each GPU's budget is the card's memory, as for one GPU:
``--max_memory`` bounds only where accelerate places the weights, not what the training step may use.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fitcheck.core import estimate
from fitcheck.core.activations import activation_components
from fitcheck.report import Report
from fitcheck.spec import Kind, ParamEntry, Role, TrainingSpec

DeviceOf = Callable[[str], "int | str | None"]
_PLACEHOLDER = ParamEntry("_fitcheck_rest_of_model", (0,), Role.OTHER, Kind.OTHER)


@dataclass(frozen=True)
class GpuShare:
    """One GPU of a naive-model-parallel run.

    Attributes:
        device: GPU index.
        layers: Decoder layers placed on it.
        holds_head: The LM head (and so the logits and loss) is on it.
        report: The estimate of this GPU alone (budget = its budget).
        weights_bytes: Resident weights (parameters, quantized data and metadata) on it.
    """

    device: int
    layers: tuple[int, ...]
    holds_head: bool
    report: Report
    weights_bytes: int

    @property
    def load(self) -> float:
        """Device-used bytes as a share of the budget."""
        return self.report.device_used_bytes / max(self.report.budget_bytes, 1)

    def to_dict(self) -> dict[str, object]:
        """The ``device_map_gpus`` JSON entry."""
        r = self.report
        return {
            "device": self.device,
            "layers": [min(self.layers), max(self.layers)] if self.layers else [],
            "holds_head": self.holds_head,
            "weights_bytes": self.weights_bytes,
            "peak_allocated_bytes": r.peak_allocated_bytes,
            "device_used_bytes": r.device_used_bytes,
            "budget_bytes": r.budget_bytes,
            "peak_phase": r.peak_phase.value,
            "fits": r.fits,
        }


def _instance(name: str, index: int) -> str:
    return name.replace("*", str(index), 1)


def _layer_devices(spec: TrainingSpec, device_of: DeviceOf) -> dict[int, int | str | None]:
    """Decoder-layer index -> device, read off the first per-layer parameter name."""
    per_layer = next((p for p in spec.model.params if p.per_layer), None)
    if per_layer is None:
        return {}
    return {i: device_of(_instance(per_layer.name, i)) for i in range(spec.model.shape.num_layers)}


def _sub_spec(spec: TrainingSpec, device: int, layers: list[int], device_of: DeviceOf) -> TrainingSpec:
    params: list[ParamEntry] = []
    for p in spec.model.params:
        if p.per_layer:
            if layers:
                params.append(dataclasses.replace(p, repeat=len(layers)))
        elif device_of(p.name) == device:
            params.append(p)
    last = spec.model.params[-1] if spec.model.params else None
    if last is not None and (not params or params[-1].name != last.name):
        # quantizers skip the module of the model's last parameter (get_keys_to_not_convert): keep "last" meaning
        # the whole model's last parameter, not this GPU's
        params.append(_PLACEHOLDER)
    shape = dataclasses.replace(spec.model.shape, num_layers=max(len(layers), 1))
    model = dataclasses.replace(spec.model, params=tuple(params), shape=shape)
    return dataclasses.replace(spec, model=model)


def _head_device(spec: TrainingSpec, device_of: DeviceOf) -> int | str | None:
    head = next((p for p in spec.model.params if p.role is Role.LM_HEAD), None)
    if head is None:  # tied head: it runs where the embedding weight is
        head = next((p for p in spec.model.params if p.role is Role.EMBEDDING), None)
    return device_of(head.name) if head is not None else None


def gpu_shares(spec: TrainingSpec, device_of: DeviceOf, budgets: Mapping[int, int]) -> tuple[GpuShare, ...]:
    """One estimate per GPU of a multi-GPU device map.

    Args:
        spec: The run (single process).
        device_of: Parameter name (layer index filled in) -> device the map gives it.
        budgets: GPU index -> budget bytes.

    Returns:
        The GPUs holding any parameter, in index order (empty when fewer than two GPUs hold parameters).
    """
    by_layer = _layer_devices(spec, device_of)
    devices = {d for d in by_layer.values() if isinstance(d, int)}
    devices |= {d for p in spec.model.params if not p.per_layer for d in [device_of(p.name)] if isinstance(d, int)}
    if len(devices) < 2:
        return ()
    head = _head_device(spec, device_of)
    shares = []
    for device in sorted(devices):
        layers = [i for i, d in by_layer.items() if d == device]
        sub = _sub_spec(spec, device, layers, device_of)
        budget = budgets.get(device, spec.hardware.gpu_memory_bytes)
        sub = dataclasses.replace(sub, hardware=dataclasses.replace(sub.hardware, gpu_memory_bytes=budget))
        acts = activation_components(sub)
        if device != head:
            acts = tuple(c for c in acts if not c.name.startswith("logits"))
        if not layers:
            acts = tuple(c for c in acts if c.name in ("inputs.ids",) or c.name.startswith("logits"))
        report = estimate(sub, activations=acts)
        weights = sum(b for name, b in report.at_peak().items()
                      if name.startswith(("weights", "quantization", "adapters")))
        shares.append(GpuShare(device, tuple(layers), device == head, report, weights))
    return tuple(shares)


def busiest(shares: tuple[GpuShare, ...]) -> GpuShare:
    """The GPU with the largest share of its budget in use (ties: the lower index)."""
    return max(shares, key=lambda s: (s.load, -s.device))


def device_of_map(device_map: Mapping[str, int | str]) -> DeviceOf:
    """``device_of`` for a from_pretrained device map: the longest key that is a module prefix of the name."""
    keys = sorted(device_map, key=len, reverse=True)

    def device_of(name: str) -> int | str | None:
        for key in keys:
            if key == "" or name == key or re.match(re.escape(key) + r"(\.|$)", name):
                return device_map[key]
        return None

    return device_of
