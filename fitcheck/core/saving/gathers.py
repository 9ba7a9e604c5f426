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
  embeddings, final norm and LM head), beside the gradient shard FSDP1 still holds after ``zero_grad`` under
  ``use_orig_params`` (``_fsdp1_kept_grads``). Host (rank 0): the whole model plus that unit's CPU copy.
- **Sharded** (``SHARDED_STATE_DICT``, accelerate ``save_fsdp_model`` with DCP; the plugin's
  ``ShardedStateDictConfig(offload_to_cpu=True)``): each rank writes its own shards; nothing is gathered.
- **ZeRO-3, 16-bit** (deepspeed 0.19.8 runtime/engine.py ``_zero3_consolidated_16bit_state_dict``): one module's
  own parameters (``recurse=False``) gathered at a time in the engine's 16-bit dtype, copied to rank 0's CPU;
  with peft only the trainable ones are kept (``exclude_frozen_parameters=True``, trainer.py). Device: the largest
  module's parameters, full (modelled as the largest parameter: a bias beside it is < 0.1 %). Host (rank 0): the
  16-bit model (its trainable part under peft).

The gathered dtype under FSDP is the sharded parameters' (fp32 where accelerate upcast them:
``core/states/fsdp_upcast.py``).

A checkpoint (``Trainer._save_checkpoint``, every ``save_steps`` under the default ``save_strategy="steps"``) also
runs ``_save_optimizer_and_scheduler`` unless ``save_only_model`` (``TrainerSpec.save_only_model``; with
``save_strategy="no"`` only the final ``save_model`` runs: pass ``--save_only_model`` for it too). Read from the
installed sources and measured on CPU (``benchmarks/save_cpu.py``):

- **FSDP, full, optimizer** (accelerate 1.15 fsdp_utils.py ``save_fsdp_optimizer``; FSDP2: torch 2.13
  ``get_optimizer_state_dict`` with ``StateDictOptions(full_state_dict=True, cpu_offload=True)`` from
  ``_prepare_sd_options``; FSDP1: ``FSDP.optim_state_dict`` under ``FullOptimStateDictConfig(offload_to_cpu=True,
  rank0_only=True)``, accelerate dataclasses.py): the whole optimizer state dict on rank 0's host (AdamW: twice the
  trainable tensors), after the model's state dict is gone (sequential calls): host = the larger of the two.
  FSDP2's device gather is one state tensor at a time, the size of the largest trainable tensor. FSDP1's optimizer
  gather on the device is not modelled (its model gather, one unit, is).
- **Sharded, optimizer and model** (``SHARDED_STATE_DICT``, DCP; accelerate's ``ShardedStateDictConfig(
  offload_to_cpu=True)``): every rank copies its own shards to the host (``cpu_offload=True``), model then optimizer
  (peft: adapters only, transformers 5.23 distributed/fsdp.py ``get_fsdp_ckpt_kwargs``); nothing is gathered on
  the device (measured: a few KB of DCP's pickled save plans in object collectives).
- **ZeRO-0/1/2** (accelerate 1.15 accelerator.py ``get_state_dict``: ``clone_tensors_for_torch_save(
  unwrap_model(model).state_dict())``, deepspeed 0.19.8 checkpoint/utils.py: ``.detach().to("cpu")`` of every
  tensor): every rank (no rank check) holds the whole 16-bit module state dict on the host while rank 0 writes it;
  nothing on the device. ``engine.save_checkpoint`` then saves views of the flat partitions with ``torch.save``
  (storage by storage to the host): on the device only ``_checkpoint_tag_validation``'s 20-byte hash tensors
  (measured 80 B; not modelled).
- **One process / DDP, full or peft** (transformers 5.23 modeling_utils.py ``save_pretrained``, peft 0.21
  peft_model.py ``save_pretrained`` / ``get_peft_model_state_dict``, safetensors 0.8 ``_to_ndarray``, torch 2.13
  serialization.py ``_save``): the state dict is views of the parameters, safetensors and ``torch.save`` copy
  tensor by tensor to the host; nothing new on the device (measured 0 B for the model, the adapters and the
  optimizer): no save phase.

Host bytes are per node (rank 0's node for rank-0-only copies; every rank's for per-rank copies), as the other host
components. Pure: no torch, no files.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.states import (
    adapter_param_count,
    all_trainable,
    build_layout,
    fsdp_fp32_upcast,
    fsdp_unit_params,
    optimizer_for,
    partition,
)
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import MixedPrecision, Strategy, TrainingSpec
from fitcheck.units import format_bytes

SOURCE = ("transformers 5.23 trainer.py save_model, _save_optimizer_and_scheduler; accelerate 1.15 accelerator.py "
          "get_state_dict, utils/fsdp_utils.py save_fsdp_model/save_fsdp_optimizer; torch 2.13 "
          "distributed/_state_dict_utils.py, distributed/fsdp/_state_dict_utils.py; deepspeed 0.19.8 "
          "runtime/engine.py _zero3_consolidated_16bit_state_dict, checkpoint/utils.py clone_tensors_for_torch_save")

# Categories whose bytes stay on the device between steps (what is there when the Trainer saves: after
# optimizer.step() and zero_grad(set_to_none=True), no gradients, activations or step temporaries).
_RESIDENT = (Category.WEIGHTS, Category.ADAPTERS, Category.QUANT_META, Category.OPTIMIZER, Category.MASTER)


@dataclass(frozen=True)
class SaveCost:
    """Rank 0's memory while the Trainer saves the model (``save_model``) and a checkpoint's optimizer state dict
    (``_save_optimizer_and_scheduler``), one after the other.

    Attributes:
        path: The save path, in words.
        model_gather: Bytes gathered at once on the device for the model's state dict, over the resident states.
        model_host: Bytes of the model's state dicts held on the host at once, per node.
        hint: How to save with less host memory.
        optimizer_gather: Bytes gathered at once on the device for the optimizer's state dict.
        optimizer_host: Bytes of the optimizer's state dicts held on the host at once, per node.
        gradients_resident: The gradient partition stays on the device while saving (ZeRO-3's flat buffer:
            ``core/states/sharding.py`` ``Partition.gradients_resident``).
    """

    path: str
    model_gather: int
    model_host: int
    hint: str = ("save a sharded checkpoint (fsdp_state_dict_type SHARDED_STATE_DICT) or, under ZeRO-3, set "
                 "stage3_gather_16bit_weights_on_model_save false and run zero_to_fp32.py afterwards")
    optimizer_gather: int = 0
    optimizer_host: int = 0
    gradients_resident: bool = False

    @property
    def device_gather(self) -> int:
        """The larger gather of the two calls (they run one after the other)."""
        return max(self.model_gather, self.optimizer_gather)

    @property
    def host(self) -> int:
        """The larger host copy of the two calls (the model's state dict is freed before the optimizer's)."""
        return max(self.model_host, self.optimizer_host)


def _largest_param(spec: TrainingSpec) -> int:
    return max((p.numel_each for p in spec.model.params), default=0)


def _root_params(spec: TrainingSpec) -> int:
    return sum(p.numel for p in spec.model.params if not p.per_layer)


def _fsdp_elem(spec: TrainingSpec) -> int:
    """Bytes per element of the sharded parameters (fp32 after accelerate's upcast, else the load dtype)."""
    return 4 if fsdp_fp32_upcast(spec) and spec.lora is None else spec.precision.load_dtype.nbytes


def _optimizer_state(spec: TrainingSpec) -> tuple[int, int]:
    """The full (unsharded) optimizer state dict's bytes and its largest tensor's (the largest trainable tensor:
    torch's Adam-family states have the parameter's shape and dtype); nothing under ``save_only_model``."""
    if spec.trainer.save_only_model:
        return 0, 0
    groups = all_trainable(build_layout(spec))
    mem = optimizer_for(spec, groups)
    return mem.states + mem.managed, max((g.nbytes_each for g in groups), default=0)


def _fsdp1_kept_grads(spec: TrainingSpec) -> int:
    """The sharded gradient FSDP1 still holds on the device when ``save_model`` runs after training.

    With ``use_orig_params=True`` (transformers 5.23 training_args.py: the Trainer's default), ``zero_grad(
    set_to_none=True)`` clears the original parameters' ``.grad`` only; the flat parameter's ``.grad`` is freed
    later, by ``_reset_flat_param_grad_info_if_needed`` (torch 2.13 distributed/fsdp/_flat_param.py), which runs
    in the next pre-forward or state-dict hook. Measured on the H100 (``benchmarks/data/
    fsdp_gpu_nvidia_h100_80gb_hbm3.json``, FSDP1, Llama-3.2-1B, bf16 mixed precision, one GPU): 19,840,216,064 B
    allocated after ``train()`` against FSDP2's 14,896,957,952 (4,943,257,600 B more: every trainable parameter in
    fp32), and ``save_model``'s peak is 20,890,889,216 B = the resident states + those gradients + the fp32
    embedding unit (1,050,673,152 B), to the byte; after the save they are gone. Without ``use_orig_params`` the
    optimizer clears the flat gradient itself; with parameter offload it is on the host.
    """
    fsdp = spec.sharding.fsdp
    if fsdp is None or not fsdp.use_orig_params or fsdp.offload_params:
        return 0
    sh = spec.sharding
    group = sh.processes_per_machine if fsdp.sharding_strategy.startswith("HYBRID") else sh.num_processes
    group = 1 if fsdp.sharding_strategy == "NO_SHARD" else max(group, 1)
    grads = sum(g.nbytes_each * g.repeat for g in all_trainable(build_layout(spec)))
    return -(-grads // group)


def _sharded_cost(spec: TrainingSpec) -> SaveCost:
    """``SHARDED_STATE_DICT``: each rank's model then optimizer shards copied to its host, nothing gathered."""
    sh = spec.sharding
    fsdp = sh.fsdp
    assert fsdp is not None
    group = sh.processes_per_machine if fsdp.sharding_strategy.startswith("HYBRID") else sh.num_processes
    group = 1 if fsdp.sharding_strategy == "NO_SHARD" else max(group, 1)
    model = (adapter_param_count(spec) * 4 if spec.lora is not None
             else spec.model.total_params * _fsdp_elem(spec))  # peft: adapter_only (fp32 adapters)
    optim, _ = _optimizer_state(spec)
    ranks = sh.processes_per_machine
    return SaveCost("SHARDED_STATE_DICT: each rank copies its own model and optimizer shards to its host "
                    "(cpu_offload), nothing gathered", 0, -(-model // group) * ranks,
                    "save less often, or on nodes with more host RAM", 0, -(-optim // group) * ranks)


def save_cost(spec: TrainingSpec) -> SaveCost | None:
    """Rank 0's gather and host copy when the Trainer saves this run's model.

    Args:
        spec: The training spec.

    Returns:
        The cost, or None where saving holds nothing beyond the resident states on the device and no host copy is
        modelled (one process, DDP, ZeRO-3 without ``stage3_gather_16bit_weights_on_model_save``; quantized bases
        are left out).
    """
    sh = spec.sharding
    if spec.quant is not None:
        return None
    if sh.strategy is Strategy.FSDP and sh.fsdp is not None and not sh.fsdp.saves_full_state_dict:
        return _sharded_cost(spec)
    if sh.strategy is Strategy.FSDP and sh.fsdp is not None:
        elem = _fsdp_elem(spec)
        whole = spec.model.total_params * elem
        optim, optim_largest = _optimizer_state(spec)  # save_fsdp_optimizer, after save_fsdp_model
        if sh.fsdp.version == 2:
            return SaveCost("FSDP2 FULL_STATE_DICT: one parameter, then one optimizer state, gathered at a time and "
                            "copied to rank 0's host", _largest_param(spec) * elem, whole,
                            optimizer_gather=optim_largest, optimizer_host=optim)
        unit = max(fsdp_unit_params(spec), _root_params(spec)) * elem
        return SaveCost("FSDP1 FULL_STATE_DICT: one unit unsharded at a time, moved to rank 0's host and cloned, "
                        "beside the gradient FSDP1 keeps after zero_grad; then the optimizer state dict on rank 0's "
                        "host", unit + _fsdp1_kept_grads(spec), whole + unit, optimizer_host=optim)
    ds = sh.deepspeed
    if sh.strategy is Strategy.DEEPSPEED and ds is not None and ds.stage < 3:
        elem = 2 if spec.precision.mixed_precision is not MixedPrecision.NO else spec.precision.load_dtype.nbytes
        params = spec.model.total_params + (adapter_param_count(spec) if spec.lora is not None else 0)
        return SaveCost(f"ZeRO-{ds.stage} save_model: accelerate's get_state_dict clones the 16-bit state dict to "
                        "every rank's host, nothing gathered", 0, params * elem * sh.processes_per_machine,
                        "save less often (save_steps), or on nodes with more host RAM")
    if sh.strategy is Strategy.DEEPSPEED and ds is not None and ds.stage == 3 and ds.gather_16bit_on_save:
        elem = 2 if spec.precision.mixed_precision is not MixedPrecision.NO else spec.precision.load_dtype.nbytes
        kept = adapter_param_count(spec) if spec.lora is not None else spec.model.total_params
        return SaveCost("ZeRO-3 stage3_gather_16bit_weights_on_model_save: one module gathered at a time, copied "
                        "to rank 0's host", _largest_param(spec) * elem, kept * elem,
                        gradients_resident=partition(spec).gradients_resident)
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
    # ZeRO-3's flat gradient partition buffer stays (core/states/sharding.py Partition.gradients_resident)
    resident = sum(c.at(Phase.OPTIMIZER_STEP) for c in components if c.location is Location.DEVICE
                   and (c.category in _RESIDENT or (cost.gradients_resident and c.name == "gradients")))
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
                        f"saving holds {format_bytes(cost.host)} of host RAM per node ({cost.path}), above the "
                        f"{format_bytes(host_limit)} of host memory given", cost.hint),)
    return (Finding("save-gather", Severity.INFO,
                    f"saving the model: {cost.path}; {format_bytes(cost.device_gather)} on the device at once, "
                    f"{format_bytes(cost.host)} of host RAM per node", ""),)
