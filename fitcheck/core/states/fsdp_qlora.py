"""FSDP over a bitsandbytes 4-bit base (FSDP-QLoRA): which quantized bytes are sharded, gathered, replicated,
offloaded, and where the model is loaded.

Sources (the installed versions):

* bitsandbytes 0.50.2 ``nn/modules.py``: ``Params4bit`` holds the packed weight in ``quant_storage`` (``[n /
  (2 * itemsize), 1]`` elements); the quantization state (absmax, nested absmax/code, the 4-bit code table) is a
  ``QuantState`` attribute of the parameter and of its ``Linear4bit`` module -- not a parameter or buffer, so FSDP
  neither shards nor offloads it. ``fix_4bit_weight_quant_state_from_module`` re-attaches it to the
  all-gathered weight ("the quant state got lost when the parameter got converted. This happens for example for
  fsdp"). Every rank therefore keeps the whole model's quantization state on its GPU.
* bitsandbytes 0.50.2 ``docs/source/fsdp_qlora.md``: "FSDP only supports sharding float data types"; with a
  float ``bnb_4bit_quant_storage`` the packed bytes are flattened, sharded and all-gathered like any weight: a
  gathered 4-bit weight is its packed bytes (~0.5 B/param), the quantization state is not gathered.
* torch 2.13 ``distributed/fsdp/_flat_param.py`` ``_validate_tensors_to_flatten`` (FSDP1): "Cannot flatten
  integer dtype tensors" / "Must flatten tensors with uniform dtype": a uint8-stored 4-bit weight cannot be
  wrapped (refused here).
* accelerate 1.15 ``utils/fsdp_utils.py`` ``fsdp2_prepare_model`` (FSDP2): frozen non-floating ``Params4bit``
  are passed to ``fully_shard`` as ``ignored_params`` ("Excluding from FSDP2 sharding to prevent quant_state
  corruption ... set bnb_4bit_quant_storage to a floating dtype"): with uint8 storage every GPU keeps the whole
  packed model, never gathered. ``cpu_ram_efficient_loading`` is skipped for models with ``Params4bit``
  (``and not model_has_params4bit``; "bypassing the move to meta will still cause the VRAM spike").
* transformers 5.23 ``quantizers/quantizer_bnb_4bit.py`` ``update_device_map``: ``device_map=None`` becomes
  ``{"": torch.cuda.current_device()}``, and ``modeling_utils.py`` ``_move_missing_keys_from_meta_to_device``
  keeps the rank-0-only path for unquantized models (``and not is_quantized``): every rank loads and quantizes
  the whole model on its own GPU before FSDP shards it. ``distributed/fsdp.py`` ``update_fsdp_plugin_peft``
  sets FSDP mixed precision to a float ``bnb_4bit_quant_storage`` (``override=True``), whatever
  ``mixed_precision`` says.
* accelerate 1.15 ``utils/dataclasses.py`` ``cpu_ram_efficient_loading``: "only the first process loads the
  pretrained model checkpoint while all other processes have empty weights"; without it every process loads
  a full copy into host RAM (``utils/fsdp_utils.py``: "has model be on CPU on all ranks").
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.states.quantization import base_weights, is_quantized, quantized_bytes
from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.spec import Dtype, Strategy, TrainingSpec
from fitcheck.units import format_bytes

SOURCE = (
    "bitsandbytes 0.50.2 nn/modules.py (QuantState is a module attribute: not sharded) + docs fsdp_qlora.md; "
    "accelerate 1.15 utils/fsdp_utils.py fsdp2_prepare_model (uint8 Params4bit ignored by fully_shard)"
)
_FLOAT_STORAGE = (Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.FLOAT32)


@dataclass(frozen=True)
class QuantPlacement:
    """Where the 4-bit base lives on one GPU under FSDP.

    Attributes:
        data_divisor: Divisor of the packed 4-bit bytes resident per GPU (N when sharded, 1 when replicated).
        data_on_host: The packed shard follows FSDP parameter offload to host RAM.
        gathered: FSDP all-gathers the packed bytes unit by unit (float ``quant_storage``).
        detail: One line for the report.
    """

    data_divisor: int
    data_on_host: bool
    gathered: bool
    detail: str


def is_fsdp_4bit(spec: TrainingSpec) -> bool:
    """A bitsandbytes 4-bit base trained under FSDP over more than one process."""
    q = spec.quant
    return (
        spec.sharding.strategy is Strategy.FSDP
        and q is not None
        and q.method == "bitsandbytes"
        and q.bits == 4
        and spec.data_parallel_size > 1
    )


def quant_placement(spec: TrainingSpec, divisor: int, params_on_host: bool) -> QuantPlacement | None:
    """How the packed 4-bit weights are placed under FSDP (None outside FSDP-QLoRA, or when nothing is sharded).

    Args:
        spec: The training spec.
        divisor: The FSDP weight divisor (``partition(spec).weights``).
        params_on_host: FSDP parameter offload.

    Returns:
        The placement of the packed bytes; the quantization state is always whole on every GPU.

    Raises:
        ConfigError: FSDP1 with an integer ``bnb_4bit_quant_storage`` (torch refuses to flatten it).
    """
    if not is_fsdp_4bit(spec) or divisor <= 1 or spec.quant is None:
        return None
    fs = spec.sharding.fsdp
    storage = spec.quant.quant_storage
    if storage in _FLOAT_STORAGE:
        return QuantPlacement(divisor, params_on_host, True, f"packed in {storage.value}, sharded")
    if fs is not None and fs.version == 1:
        raise ConfigError(
            f"bnb_4bit_quant_storage={storage.value} with FSDP1: torch 2.13 FSDP cannot flatten the "
            "integer-stored 4-bit weights ('Cannot flatten integer dtype tensors', "
            "distributed/fsdp/_flat_param.py); set bnb_4bit_quant_storage to bfloat16 (the dtype the model "
            "is loaded in), as the FSDP-QLoRA recipe does"
        )
    return QuantPlacement(1, False, False, f"packed in {storage.value}: excluded from FSDP2 sharding, whole per GPU")


def compute_dtype_override(spec: TrainingSpec) -> Dtype | None:
    """The FSDP mixed-precision dtype transformers forces for FSDP-QLoRA (a float ``quant_storage``), if any."""
    if is_fsdp_4bit(spec) and spec.quant is not None and spec.quant.quant_storage in _FLOAT_STORAGE:
        return spec.quant.quant_storage
    return None


def gathered_layer_bytes(spec: TrainingSpec, compute_bytes: int) -> int:
    """Bytes of one decoder layer as FSDP all-gathers it under FSDP-QLoRA: packed bytes of the quantized weights
    (float storage; none when they are excluded from sharding) plus the other parameters in the compute dtype."""
    q = spec.quant
    placement_gathers = q is not None and q.quant_storage in _FLOAT_STORAGE
    total = 0
    for entry in spec.model.params:
        if not entry.per_layer:
            continue
        if q is not None and is_quantized(spec, entry):
            if placement_gathers:
                total += quantized_bytes(entry.numel_each, q, entry.out_features or entry.shape[0]).data
            continue
        total += entry.numel_each * compute_bytes
    return total


@dataclass(frozen=True)
class LoadPeak:
    """Memory while ``from_pretrained`` loads the model, before FSDP shards it.

    Attributes:
        gpu_bytes: Bytes on each GPU at the end of loading (a quantized model is loaded whole on every GPU).
        host_bytes: Host RAM per node for the loaded copies (0 when the model is loaded straight to the GPU).
        detail: How it was counted.
    """

    gpu_bytes: int
    host_bytes: int
    detail: str


def load_peak(spec: TrainingSpec) -> LoadPeak | None:
    """What loading needs under FSDP (None outside FSDP).

    Args:
        spec: The training spec.

    Returns:
        GPU bytes per rank and host RAM per node while the checkpoint is loaded.
    """
    fs = spec.sharding.fsdp
    if spec.sharding.strategy is not Strategy.FSDP or spec.data_parallel_size <= 1:
        return None
    per_node = spec.sharding.processes_per_machine
    load = spec.precision.load_dtype
    if is_fsdp_4bit(spec) and spec.quant is not None:
        bw = base_weights(spec)
        quantized = [e for e in spec.model.params if is_quantized(spec, e)]
        largest = max((e.numel_each for e in quantized), default=0) * load.nbytes
        gpu = bw.quantized_data + bw.quantized_meta + bw.unquantized_params * load.nbytes + largest
        return LoadPeak(
            gpu,
            0,
            f"every rank loads and quantizes the whole model on its own GPU: {format_bytes(bw.quantized_data)} "
            f"packed + {format_bytes(bw.quantized_meta)} quantization state + {bw.unquantized_params:,} "
            f"unquantized params in {load.value} + one {load.value} weight being quantized "
            f"({format_bytes(largest)})",
        )
    model = spec.model.total_params * load.nbytes
    copies = 1 if fs is not None and fs.cpu_ram_efficient_loading else per_node
    how = (
        "cpu_ram_efficient_loading: local rank 0 loads the checkpoint, the other ranks hold empty weights"
        if copies == 1
        else f"each of the {per_node} processes on a node loads a full copy (set fsdp_cpu_ram_efficient_loading)"
    )
    return LoadPeak(0, copies * model, f"{how}: {copies} x {format_bytes(model)}")


def fsdp_qlora_findings(spec: TrainingSpec, budget: int, host_limit: int | None) -> tuple[Finding, ...]:
    """What the user should know about FSDP-QLoRA and FSDP loading.

    Args:
        spec: The training spec.
        budget: GPU memory per device.
        host_limit: Host RAM per node, if known.

    Returns:
        Findings: replicated quantization state, uint8 storage excluded from sharding, the mixed-precision
        override, and the load-time GPU / host peaks.
    """
    out: list[Finding] = []
    q = spec.quant
    if is_fsdp_4bit(spec) and q is not None:
        meta = base_weights(spec).quantized_meta
        out.append(
            Finding(
                "fsdp-quant-state-replicated",
                Severity.INFO,
                f"the 4-bit quantization state ({format_bytes(meta)}: absmax, code tables) is a module "
                "attribute, not a parameter: FSDP neither shards nor offloads it, every GPU keeps all of it "
                f"({SOURCE})",
                "bnb_4bit_use_double_quant (use_bnb_nested_quant) shrinks it about 4x",
            )
        )
        if q.quant_storage not in _FLOAT_STORAGE:
            out.append(
                Finding(
                    "fsdp-4bit-not-sharded",
                    Severity.WARNING,
                    f"bnb_4bit_quant_storage={q.quant_storage.value}: accelerate 1.15 excludes the 4-bit weights "
                    "from FSDP2 sharding (fsdp2_prepare_model ignored_params), so every GPU holds the whole "
                    "packed model",
                    "set bnb_4bit_quant_storage=bfloat16 (and load the model in bfloat16) to shard them",
                )
            )
        override = compute_dtype_override(spec)
        if override is not None:
            out.append(
                Finding(
                    "fsdp-qlora-mixed-precision",
                    Severity.INFO,
                    f"transformers 5.23 update_fsdp_plugin_peft sets FSDP mixed precision to the quant storage "
                    f"dtype ({override.value}, override=True): the adapters are gathered and computed in "
                    f"{override.value}",
                    "",
                )
            )
    out.extend(_load_findings(spec, budget, host_limit))
    return tuple(out)


def _load_findings(spec: TrainingSpec, budget: int, host_limit: int | None) -> list[Finding]:
    peak = load_peak(spec)
    if peak is None:
        return []
    out: list[Finding] = []
    if peak.gpu_bytes:
        over = peak.gpu_bytes > budget
        out.append(
            Finding(
                "fsdp-load-gpu-peak" if not over else "load-does-not-fit",
                Severity.ERROR if over else Severity.INFO,
                f"loading needs {format_bytes(peak.gpu_bytes)} on each GPU before FSDP shards it"
                + (f", more than the {format_bytes(budget)} it has" if over else "")
                + f" ({peak.detail}; transformers 5.23 quantizer_bnb_4bit.py update_device_map, "
                "accelerate 1.15 fsdp_utils.py: cpu_ram_efficient_loading is skipped for Params4bit)",
                "load on GPUs that hold the whole quantized model, or use a pre-sharded/offloaded loading path; "
                "fsdp_cpu_ram_efficient_loading does not apply to bitsandbytes models in these versions"
                if over
                else "",
            )
        )
    if peak.host_bytes:
        over = host_limit is not None and peak.host_bytes > host_limit
        out.append(
            Finding(
                "fsdp-load-host-ram",
                Severity.WARNING if over else Severity.INFO,
                f"loading needs {format_bytes(peak.host_bytes)} of host RAM per node ({peak.detail})"
                + (f", more than --host_memory {format_bytes(host_limit or 0)}" if over else ""),
                "set fsdp_cpu_ram_efficient_loading: true (with fsdp_sync_module_states: true)"
                if over and not (spec.sharding.fsdp and spec.sharding.fsdp.cpu_ram_efficient_loading)
                else "",
            )
        )
    return out
