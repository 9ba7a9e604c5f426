"""What the Trainer's save paths gather, on rank 0 (the busiest rank while saving).

``Trainer.save_model`` (transformers 5.23 trainer.py) under FSDP with ``FULL_STATE_DICT`` calls
``Accelerator.get_state_dict(model)``; under DeepSpeed ZeRO-3 it calls ``engine._zero3_consolidated_16bit_state_dict``
(``accelerator.get_state_dict`` for a full model), which raises when ``stage3_gather_16bit_weights_on_model_save``
is false (then each rank saves its own partitions: nothing is gathered). Read from the installed sources:

- **FSDP2, full** (accelerate 1.15 accelerator.py ``get_state_dict``: ``StateDictOptions(full_state_dict=True,
  cpu_offload=True)``; torch 2.13 distributed/_state_dict_utils.py ``_iterate_state_dict``): one parameter at a time
  is all-gathered on the device and, on rank 0, copied to the host (other ranks drop it). Device: the largest
  parameter, full (an unevenly sharded one is also narrowed out of a padded buffer: up to one more copy, not
  modelled). Host (rank 0): the whole model.
- **FSDP1, full** (``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``; torch 2.13
  distributed/fsdp/_unshard_param_utils.py ``_unshard_params_for_summon``: ``handle.to_cpu()`` moves each
  unsharded unit to the CPU and frees the device copy; ``_state_dict_utils.py`` ``_full_post_state_dict_hook``
  clones every parameter there). Device: the largest FSDP unit's flat parameter, full (the root unit holds the
  embeddings, final norm and LM head). Host (rank 0): the whole model plus that unit's CPU copy.
- **Sharded** (``SHARDED_STATE_DICT``, accelerate ``save_fsdp_model`` with DCP; the plugin's
  ``ShardedStateDictConfig(offload_to_cpu=True)``): each rank writes its own shards; nothing is gathered.
- **ZeRO-3, 16-bit** (deepspeed 0.19.8 runtime/engine.py ``_zero3_consolidated_16bit_state_dict``): one module's
  own parameters (``recurse=False``) gathered at a time in the engine's 16-bit dtype, copied to rank 0's CPU;
  with peft only the trainable ones are kept (``exclude_frozen_parameters=True``, trainer.py). Device: the largest
  module's parameters, full (modelled as the largest parameter: a bias beside it is < 0.1 %). Host (rank 0): the
  16-bit model (its trainable part under peft).

The gathered dtype under FSDP is the sharded parameters' (fp32 where accelerate upcast them:
``core/states/fsdp_upcast.py``). Pure: no torch, no files.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.states import adapter_param_count, fsdp_fp32_upcast, fsdp_unit_params
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import MixedPrecision, Strategy, TrainingSpec
from fitcheck.units import format_bytes

SOURCE = ("transformers 5.23 trainer.py save_model; accelerate 1.15 accelerator.py get_state_dict; torch 2.13 "
          "distributed/_state_dict_utils.py, distributed/fsdp/_state_dict_utils.py; deepspeed 0.19.8 "
          "runtime/engine.py _zero3_consolidated_16bit_state_dict")

# Categories whose bytes stay on the device between steps (what is there when the Trainer saves: after
# optimizer.step() and zero_grad(set_to_none=True), no gradients, activations or step temporaries).
_RESIDENT = (Category.WEIGHTS, Category.ADAPTERS, Category.QUANT_META, Category.OPTIMIZER, Category.MASTER)


@dataclass(frozen=True)
class SaveCost:
    """Rank 0's memory while the Trainer saves the model.

    Attributes:
        path: The save path, in words.
        device_gather: Bytes gathered at once on the device, over the resident states.
        host: Bytes of the state dict rank 0 holds on the host.
    """

    path: str
    device_gather: int
    host: int


def _largest_param(spec: TrainingSpec) -> int:
    return max((p.numel_each for p in spec.model.params), default=0)


def _root_params(spec: TrainingSpec) -> int:
    return sum(p.numel for p in spec.model.params if not p.per_layer)


def _fsdp_elem(spec: TrainingSpec) -> int:
    """Bytes per element of the sharded parameters (fp32 after accelerate's upcast, else the load dtype)."""
    return 4 if fsdp_fp32_upcast(spec) and spec.lora is None else spec.precision.load_dtype.nbytes


def save_cost(spec: TrainingSpec) -> SaveCost | None:
    """Rank 0's gather and host copy when the Trainer saves this run's model.

    Args:
        spec: The training spec.

    Returns:
        The cost, or None where saving gathers nothing (one process, DDP, ZeRO-0/1/2, sharded FSDP, ZeRO-3
        without ``stage3_gather_16bit_weights_on_model_save``; quantized bases are left out).
    """
    sh = spec.sharding
    if spec.quant is not None:
        return None
    if sh.strategy is Strategy.FSDP and sh.fsdp is not None and sh.fsdp.saves_full_state_dict:
        elem = _fsdp_elem(spec)
        whole = spec.model.total_params * elem
        if sh.fsdp.version == 2:
            return SaveCost("FSDP2 FULL_STATE_DICT: one parameter gathered at a time, copied to rank 0's host",
                            _largest_param(spec) * elem, whole)
        unit = max(fsdp_unit_params(spec), _root_params(spec)) * elem
        return SaveCost("FSDP1 FULL_STATE_DICT: one unit unsharded at a time, moved to rank 0's host and cloned",
                        unit, whole + unit)
    ds = sh.deepspeed
    if sh.strategy is Strategy.DEEPSPEED and ds is not None and ds.stage == 3 and ds.gather_16bit_on_save:
        elem = 2 if spec.precision.mixed_precision is not MixedPrecision.NO else spec.precision.load_dtype.nbytes
        kept = adapter_param_count(spec) if spec.lora is not None else spec.model.total_params
        return SaveCost("ZeRO-3 stage3_gather_16bit_weights_on_model_save: one module gathered at a time, copied "
                        "to rank 0's host", _largest_param(spec) * elem, kept * elem)
    return None


def save_components(cost: SaveCost | None, components: tuple[Component, ...]) -> tuple[Component, ...]:
    """``Phase.SAVE``: the resident device states plus the gather (device), and rank 0's host copy.

    Args:
        cost: :func:`save_cost`'s answer.
        components: The step's components (their resident states at the optimizer step are what is on the
            device when the Trainer saves).

    Returns:
        ``save.gather`` (device, the whole phase's allocated bytes) and ``save.host_state_dict`` (host), or nothing.
    """
    if cost is None:
        return ()
    resident = sum(c.at(Phase.OPTIMIZER_STEP) for c in components
                   if c.location is Location.DEVICE and c.category in _RESIDENT)
    return (
        Component("save.gather", Category.WEIGHTS, Location.DEVICE, {Phase.SAVE: resident + cost.device_gather},
                  SOURCE, f"{cost.path}: {format_bytes(cost.device_gather)} gathered over "
                  f"{format_bytes(resident)} of resident states"),
        Component("save.host_state_dict", Category.WEIGHTS, Location.HOST, {Phase.SAVE: cost.host}, SOURCE,
                  f"{cost.path}: the state dict rank 0 holds in host RAM while it writes it"),
    )


def save_findings(cost: SaveCost | None, host_limit: int | None) -> tuple[Finding, ...]:
    """An INFO saying what saving costs rank 0, a WARNING when its host copy does not fit the host memory given."""
    if cost is None:
        return ()
    if host_limit is not None and cost.host > host_limit:
        return (Finding("save-host", Severity.WARNING,
                        f"saving gathers {format_bytes(cost.host)} on rank 0's host ({cost.path}), above the "
                        f"{format_bytes(host_limit)} of host memory given",
                        "save a sharded checkpoint (fsdp_state_dict_type SHARDED_STATE_DICT) or, under ZeRO-3, set "
                        "stage3_gather_16bit_weights_on_model_save false and run zero_to_fp32.py afterwards"),)
    return (Finding("save-gather", Severity.INFO,
                    f"saving the model: {cost.path}; {format_bytes(cost.device_gather)} on the device at once, "
                    f"{format_bytes(cost.host)} in rank 0's host RAM", ""),)
