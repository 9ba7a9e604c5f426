"""Which FSDP runs ``fsdp2_run_events`` / ``fsdp1_run_events`` replay, and what their rewrites need of one (a plan).

The units are accelerate 1.15's (``utils/fsdp_utils.py`` ``fsdp2_prepare_model``, as
``core/states/fsdp2_units.py`` describes them): every decoder layer (``reshard_after_forward`` from the config), an
untied input embedding, the tail ``[final norm, (tied embedding,) lm_head]`` with ``reshard_after_forward=False``,
and the root with what is left (``reshard_after_forward=None`` -> False for the root). Each parameter is sharded on
dim 0, padded to a multiple of the world size (torch 2.13 ``_fsdp_param.py`` ``_init_sharded_param``:
``padded_sharded_size = chunks[0].size()``). A peft model under the Trainer keeps these units
(``core/states/fsdp2_units.py``: the Trainer never installs peft's wrap policy under FSDP2).

FSDP1 (:func:`fsdp1_plan`): accelerate 1.15 ``accelerator.py`` ``prepare_model`` wraps the model once with
``transformer_based_wrap`` (``FullyShardedDataParallelPlugin.set_auto_wrap_policy``): every decoder layer its own
FSDP unit, the root the rest (embedding, final norm, LM head). Each unit holds one ``FlatParameter`` (torch 2.13
``_flat_param.py``), laid out by :func:`flat_layout`.

Also :func:`replays` and :func:`replay_key`. The plan's types are :mod:`fitcheck.torch_adapters.fsdp_plan_types`',
the parameters it shards :mod:`fitcheck.torch_adapters.fsdp_params`' and the event walk both rewrites share
:mod:`fitcheck.torch_adapters.fsdp_run_walk`'; importers take those names from there. Pure Python, no torch.
"""

from __future__ import annotations

from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.fsdp_params import FP32, lora_not_replayed, model_params
from fitcheck.torch_adapters.fsdp_plan_types import Fsdp1Plan, FsdpPlan, Unit

__all__ = ["fsdp1_plan", "fsdp2_plan", "not_replayed", "partition_weights", "replay_key", "replays"]


def not_replayed(spec: TrainingSpec) -> str:
    """What of an FSDP run :func:`fsdp2_run_events.fsdp2_run` does not describe ("" when it describes the run).

    Args:
        spec: An FSDP spec.

    Returns:
        The part not replayed, for the ``reserved-published-gap`` INFO, or "".
    """
    from fitcheck.spec import MixedPrecision
    from fitcheck.torch_adapters.deepspeed_run_plan import FUSED_ADAM

    fs = spec.sharding.fsdp
    parts = []
    if fs is None:
        return "no FSDP settings"
    if fs.version == 1:
        parts += _fsdp1_not_replayed(spec)
    elif fs.sharding_strategy not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        parts.append(f"the {fs.sharding_strategy} strategy")
    if fs.offload_params:
        parts.append("CPU offload of parameters")
    if fs.auto_wrap_policy != "TRANSFORMER_BASED_WRAP" or fs.wrap_unit_params:
        parts.append("a wrap policy other than one decoder layer per unit")
    if spec.precision.mixed_precision is MixedPrecision.NO:
        parts.append("no mixed precision (the plain run's replay answers)")
    if spec.quant is not None and (spec.lora is None or fs.version != 1):
        # FSDP2 over a 4-bit base: fsdp2_run's prepare replays the H200's 5.23 rows (Llama-2-70B 4 layers /
        # Mistral-7B 8 layers QLoRA: 5.26 / 2.66 GiB reserved vs 5.24 / 2.66), its step not (9.52 / 10.73 vs
        # 9.08 / 11.71: benchmarks/fsdp1_lora_trace.py --rewrite)
        parts.append("a quantized base" if fs.version == 1 else "a quantized base (FSDP2's QLoRA step is not checked)")
    elif spec.quant is not None:
        parts += _quant_not_replayed(spec)
    if spec.freeze is not None:
        parts.append("frozen parameters without peft (freeze)")
    if lora_left_out := lora_not_replayed(spec):
        parts.append(lora_left_out)
    if spec.optimizer.name not in FUSED_ADAM:
        parts.append(f"the {spec.optimizer.name} optimizer on the shards (replayed: {FUSED_ADAM[0]})")
    if spec.sharding.parallelism is not None and spec.sharding.parallelism.active:
        parts.append("a tp/cp/sp layout")
    return "; ".join(parts)


def _fsdp1_not_replayed(spec: TrainingSpec) -> list[str]:
    """FSDP1's own exclusions (:func:`not_replayed` adds the ones FSDP2 shares)."""
    fs = spec.sharding.fsdp
    parts = []
    if fs is None:
        return ["no FSDP settings"]
    if not fs.use_orig_params:
        parts.append("use_orig_params=False (the flat parameters handed to the optimizer)")
    # torch 2.13 _init_utils.py _init_core_state: one process is NO_SHARD whatever the strategy
    if partition_weights(spec) > 1 and fs.sharding_strategy != "FULL_SHARD":
        parts.append(f"the {fs.sharding_strategy} strategy")
    from fitcheck.core.states import has_params4bit

    if fs.cpu_ram_efficient_loading and not has_params4bit(spec):  # a 4-bit base loads on every GPU anyway
        parts.append("cpu_ram_efficient_loading (meta-device initialisation on the other ranks)")
    if fs.frozen_shares_units:
        parts.append("frozen parameters sharing a unit")
    if fs.backward_prefetch != "NO_PREFETCH":  # the rewrite gathers each unit at its own pre-backward only
        parts.append(f"backward_prefetch {fs.backward_prefetch}")
    if fs.forward_prefetch and partition_weights(spec) > 1:  # ... and each at its own pre-forward
        parts.append("forward_prefetch")
    if not fs.limit_all_gathers and partition_weights(spec) > 1:  # its side pools keep two gathers in flight
        parts.append("limit_all_gathers=False")
    return parts


def _quant_not_replayed(spec: TrainingSpec) -> list[str]:
    """What of an FSDP QLoRA run the rewrites do not describe: they replay a bitsandbytes 4-bit base whose
    ``bnb_4bit_quant_storage`` is the load dtype (FSDP1, torch 2.13 ``_flat_param.py``
    ``_validate_tensors_to_flatten``: one dtype per flat parameter, the packed weights flattened with the layer's
    norms; FSDP2: accelerate 1.15 ``fsdp2_prepare_model`` shards a float-stored ``Params4bit`` like any weight;
    ``fsdp_params.packed_param``) and the dtype FSDP computes in (transformers 5.23 ``update_fsdp_plugin_peft`` sets
    ``param_dtype`` to the quant storage: no cast of the packed bytes)."""
    from fitcheck.core.states import param_compute_bytes

    quant = spec.quant
    if quant is None:
        return []
    if quant.method != "bitsandbytes" or quant.bits != 4:
        return [f"a {quant.method} {quant.bits}-bit base (the FSDP1 replay flattens bitsandbytes 4-bit weights)"]
    storage = quant.quant_storage
    if quant.prepare_for_kbit_training:  # peft 0.21.2 utils/other.py: the unquantized parameters made fp32
        return ["peft's k-bit preparation (fp32 norms and embeddings beside the 4-bit weights: FSDP1 flattens one "
                "dtype per unit)"]
    if storage is not spec.precision.load_dtype or storage.nbytes != param_compute_bytes(spec):
        return [f"a 4-bit base stored as {storage.value} beside {spec.precision.load_dtype.value} parameters "
                "(FSDP1 flattens one dtype per unit)"]
    return []


def partition_weights(spec: TrainingSpec) -> int:
    """The processes a parameter is sharded over (``core/states`` ``partition``), at least 1."""
    from fitcheck.core.states import partition

    return max(partition(spec).weights, 1)


def _dtypes(spec: TrainingSpec) -> tuple[int, int, int]:
    """Bytes of the sharded parameters (fp32 after accelerate's upcast), of the compute (and reduce) dtype and of
    the traced module's parameters."""
    from fitcheck.core.kernels import deepspeed_module_view
    from fitcheck.core.states import fsdp_fp32_upcast, param_compute_bytes

    orig = FP32 if fsdp_fp32_upcast(spec) else spec.precision.load_dtype.nbytes
    return orig, param_compute_bytes(spec), deepspeed_module_view(spec).precision.load_dtype.nbytes


def fsdp2_plan(spec: TrainingSpec) -> FsdpPlan:
    """The plan of an FSDP2 spec :func:`not_replayed` accepts.

    Args:
        spec: The training spec.

    Returns:
        Its units, world size and dtypes.
    """
    fs = spec.sharding.fsdp
    reshard = fs.reshard_after_forward if fs is not None else True
    layer, roles, tied = model_params(spec)
    embed, head, norms, rest = roles["embed"], roles["head"], roles["norms"], roles["rest"]
    from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches

    orig, compute, traced = _dtypes(spec)
    layers = [Unit(layer, reshard, "layer") for _ in range(spec.model.shape.num_layers)]
    # accelerate 1.15 fsdp_utils.py _find_final_norm scans getattr(model, model.base_model_prefix)'s children:
    # on a peft PeftModel that is the LlamaForCausalLM (its children `model`, `lm_head`): no norm, so the final
    # norm stays with the root
    final = [] if spec.lora is not None else norms[-1:]
    inner = norms if spec.lora is not None else norms[:-1]
    tail = Unit(tuple(final + (embed if tied else head)), False, "tail")
    root = Unit(tuple(rest + inner), False, "root") if rest or inner else None
    front = [] if tied else [Unit(tuple(embed), reshard, "embed")]
    units = ([root] if root else []) + front + layers + [tail]
    first_layer = len(units) - len(layers) - 1
    order = list(range(first_layer, first_layer + len(layers))) + list(range(first_layer - len(front), first_layer))
    order += [len(units) - 1] + ([0] if root else [])
    # accelerate 1.15 dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision (FSDP2):
    # MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    from fitcheck.core.states import has_params4bit

    return FsdpPlan(partition_weights(spec), tuple(units), tuple(order), orig, compute, compute, traced, tied,
                    replayed_micro_batches(spec.batch.grad_accum), resident=has_params4bit(spec))


def fsdp1_plan(spec: TrainingSpec) -> Fsdp1Plan:
    """The plan of an FSDP1 spec :func:`not_replayed` accepts: the root unit (everything outside the decoder
    layers, in ``named_parameters`` order: embedding, other, final norm, untied LM head), then one unit per layer;
    ``wrap_order`` the layers then the root (``_auto_wrap`` wraps the children before the root's own handle).

    Args:
        spec: The training spec.

    Returns:
        Its units, world size and dtypes.
    """
    layer, roles, tied = model_params(spec)
    root = Unit(tuple(roles["embed"] + roles["rest"] + roles["norms"] + ([] if tied else roles["head"])), False,
                "root")
    n = spec.model.shape.num_layers
    units = (root, *[Unit(layer, True, "layer") for _ in range(n)])
    orig, compute, traced = _dtypes(spec)
    # accelerate 1.15 dataclasses.py set_mixed_precision (FSDP1): MixedPrecision(param_dtype=dtype,
    # reduce_dtype=dtype, buffer_dtype=...); torch 2.13 _flat_param.py FlatParamHandle.__init__: _aligned_numel
    from fitcheck.core.states import has_params4bit
    from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches

    return Fsdp1Plan(partition_weights(spec), units, (*range(1, n + 1), 0), orig, compute, compute, traced,
                     tied, replayed_micro_batches(spec.batch.grad_accum), load=spec.precision.load_dtype.nbytes,
                     align=16 // compute, split=spec.lora is not None, resident=has_params4bit(spec))


def replays(spec: TrainingSpec, version: int) -> bool:
    """Whether the FSDP``version`` rewrite describes this run (an FSDP spec of that version :func:`not_replayed`
    accepts; the caller checks that the run is traced: ``pinned_path.traceable``)."""
    from fitcheck.spec import Strategy

    fs = spec.sharding.fsdp
    return (spec.sharding.strategy is Strategy.FSDP and fs is not None and fs.version == version
            and not not_replayed(spec))


def replay_key(spec: TrainingSpec, plan: FsdpPlan) -> str:
    """What an FSDP rewrite's replay depends on beyond the activation trace's key (``pinned_path._cache_key``)."""
    hw = spec.hardware
    version = 1 if isinstance(plan, Fsdp1Plan) else 2
    return f"|fsdp{version} {plan!r} {hw.expandable_segments} {hw.cuda_alloc_conf!r}"
