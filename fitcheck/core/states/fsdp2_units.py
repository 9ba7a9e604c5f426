"""FSDP2 (``fully_shard``) units as accelerate 1.15 wraps a transformers model, and what each keeps gathered.

accelerate 1.15 ``utils/fsdp_utils.py`` ``fsdp2_prepare_model``: every decoder layer (the wrap policy) is a unit
(``reshard_after_forward`` from the config); the input embedding is its own unit when it is not tied; the
"tail" ``[final norm, lm_head]`` (with the embedding when tied) is one unit with ``reshard_after_forward=False``;
then the root, whose own parameters are none left.

torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_param_group.py`` ``wait_for_unshard``: in forward the flat
all-gather output of the last gathered unit is kept (``comm_ctx.all_gather_state``, "Defer free to allow for
overlap of this copy-out with next all-gather") until the next unit's copy-out or the root's post-forward
(``_fsdp_state.py`` "Free the last all-gather result"). The loss is computed inside the root's forward, so at
the end of forward the tail is held twice (its unsharded parameters + its flat all-gather output) -- at more
than one shard: at one, ``unshard`` records an ``AllGatherResult`` around the group's empty
``_all_gather_output`` and returns before ``foreach_all_gather``, and ``wait_for_unshard`` copies each
parameter's ``all_gather_inputs`` into its own unsharded storage, so no flat output is held. At the start
of backward only the tail's unsharded parameters remain (the embedding unit was resharded after its forward).
During backward a layer unit is gathered while the next is prefetched, and its post-backward reduce-scatter
copies the unsharded gradients into a flat input (``_fsdp_collectives.py`` ``foreach_reduce``): two units of
parameters and, for trained weights, two units of gradients.

Pinned by a real 2-process FSDP2 run on CPU (``benchmarks/fsdp_cpu.py``, with and without
``MixedPrecisionPolicy``).

A peft model under the Trainer keeps these units: transformers 5.23 ``trainer.py`` ``_prepare_for_training`` sets
``delay_optimizer_creation = False`` for FSDP2 (l.1717-1722) and calls ``distributed/fsdp.py``
``update_fsdp_plugin_peft`` (peft's ``fsdp_auto_wrap_policy``, a ``functools.partial(_or_policy, ...)`` that accelerate
1.15 ``fsdp2_prepare_auto_wrap_policy`` cannot apply, which would leave every layer in the root) only under
``if delay_optimizer_creation`` (l.1751-1754). Checked by a real Trainer step (``benchmarks/fsdp2_peft_units_cpu.py``:
every decoder layer an FSDP unit) and on an H200 (``benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json``: the Trainer's
FSDP2 Mistral-7B LoRA step held one gathered group beyond the plain run). A script that calls
``update_fsdp_plugin_peft`` itself gets the root-gather layout (recorded: ``benchmarks/data/fsdp2_run_events_cpu.json``
variant ``lora``); fitcheck reads no such script.
"""

from __future__ import annotations

from fitcheck.core.states.fsdp_qlora import gathered_layer_bytes, is_fsdp_4bit
from fitcheck.core.states.layout import trainable_params
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import MixedPrecision, Role, Strategy, TrainingSpec
from fitcheck.units import format_bytes


def tail_params(spec: TrainingSpec) -> int:
    """Parameters outside the decoder layers that stay gathered from the end of forward: the final norm and the
    LM head, plus the input embedding when it is tied (it is then the same tensor)."""
    outside = [p for p in spec.model.params if not p.per_layer]
    tied = not any(p.role is Role.LM_HEAD for p in outside)
    return sum(p.numel for p in outside if tied or p.role is not Role.EMBEDDING)


def fsdp2_components(spec: TrainingSpec, compute_bytes: int, unit_params: int, source: str,
                     shards: int = 2) -> tuple[Component, ...]:
    """The gathered-parameter buffer of an FSDP2 run, by phase.

    Args:
        spec: The training spec (FSDP2).
        compute_bytes: Bytes per element of gathered parameters (MixedPrecisionPolicy ``param_dtype``).
        unit_params: Parameters of the largest layer unit (``sharding.fsdp_unit_params``).
        source: The FSDP source line.
        shards: How many shards a parameter has (1: no flat all-gather output is held at the end of forward).

    Returns:
        One component: the tail, layer units and their unsharded gradients.
    """
    fs = spec.sharding.fsdp
    reshard = fs.reshard_after_forward if fs is not None else True
    tail = tail_params(spec) * compute_bytes
    held = 2 * tail if shards > 1 else tail  # + the tail's flat all-gather output until the root's post-forward
    # a 4-bit base's packed bytes, also at one shard (where is_fsdp_4bit, about sharding, is False: the rank still
    # copies each packed group into its own unsharded storage, wait_for_unshard's world_size == 1 branch)
    q = spec.quant
    packed = is_fsdp_4bit(spec) or (q is not None and q.method == "bitsandbytes" and q.bits == 4)
    unit = gathered_layer_bytes(spec, compute_bytes) if packed else unit_params * compute_bytes
    layers = sum(p.numel for p in spec.model.params if p.per_layer) * compute_bytes
    trained = trainable_params(spec) > 0 and spec.lora is None
    grads = 2 * unit_params * compute_bytes if trained else 0  # unsharded grads + reduce-scatter input
    if fsdp_backward_applies(spec):  # the gradients and reduce-scatter inputs: the moments' (fsdp_backward.py)
        grads = 0
    if reshard:
        # one shard: the prefetch's unshard records an empty result and returns; each group is copied in its own
        # pre-backward (wait_for_unshard, world_size == 1), so one unit at a time
        units = 2 if shards > 1 else 1
        values = {Phase.FORWARD_END: held, Phase.BACKWARD_START: tail, Phase.BACKWARD: units * unit + grads}
        how = ("layers resharded after forward; in backward a unit + the prefetched next" if shards > 1 else
               "layers resharded after forward; one unit copied at a time (one shard)")
    else:
        # the input embedding's own unit (untied) takes the config's reshard_after_forward too: kept gathered to its
        # backward, at the end (real Trainer, FSDP2 shard_grad_op, 2 gloo ranks: benchmarks/fsdp_kinds_cpu.py
        # sgo-fsdp2-*, the embedding's unsharded storage alive from forward to backward; -3.8 % at the start before)
        untied = any(p.role is Role.LM_HEAD for p in spec.model.params)
        emb = sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING) * compute_bytes if untied else 0
        values = {
            Phase.FORWARD_END: held + layers + emb,
            Phase.BACKWARD_START: tail + layers + emb,
            Phase.BACKWARD: layers + emb + grads,
        }
        how = "reshard_after_forward=False: every layer (and the input embedding) kept gathered until its backward"
    return _buffer(
        values,
        source + "; accelerate 1.15 fsdp2_prepare_model units, torch 2.13 _fsdp_param_group.py "
        "all_gather_state (fitcheck/core/states/fsdp2_units.py)",
        f"tail unit (final norm + LM head) {format_bytes(tail)}, "
        + ("twice at the end of forward (its all-gather output is held until the root's post-forward)"
           if shards > 1 else "once at the end of forward (one shard: no flat all-gather output)")
        + f"; layer unit {format_bytes(unit)}; {how}"
        + ("; unsharded grads + reduce-scatter input of a unit" if grads else ""),
    )


def _buffer(values: dict[Phase, int], source: str, detail: str) -> tuple[Component, ...]:
    """The ``buffers.fsdp_unsharded_params`` component of ``values`` by phase."""
    return (
        Component("buffers.fsdp_unsharded_params", Category.BUFFERS, Location.DEVICE,
                  {p: int(values.get(p, 0)) for p in PHASES}, source, detail),
    )


def fsdp_backward_applies(spec: TrainingSpec) -> bool:
    """Whether ``fsdp_backward.fsdp_backward_held`` describes the run: a full fine-tune of an untied model, or a LoRA
    run of :func:`fsdp_lora_moments`, under accelerate's FSDP2 units resharded after forward, or FSDP1's (decoder
    layers and the root) sharded FULL_SHARD or, on one process, NO_SHARD with a mixed-precision copy; no CPU
    offload, unquantized."""
    sh = spec.sharding
    fs = sh.fsdp
    # FSDP2 SHARD_GRAD_OP (reshard_after_forward=False): measured (benchmarks/fsdp_kinds_cpu.py sgo-fsdp2-*);
    # FSDP1's (only through fsdp_sharding_strategy: readers/fsdp_config.py) not
    sgo2 = fs is not None and fs.version == 2 and not fs.reshard_after_forward
    if sh.strategy is not Strategy.FSDP or (fs is not None and (
            fs.offload_params or fs.auto_wrap_policy != "TRANSFORMER_BASED_WRAP" or fs.wrap_unit_params
            or not (sgo2 or (fs.reshard_after_forward and fs.sharding_strategy == "FULL_SHARD")))):
        return False
    if fs is not None and fs.version == 1 and spec.data_parallel_size == 1 and (
            spec.precision.mixed_precision is MixedPrecision.NO):
        return False  # NO_SHARD computing with the flat parameter itself: nothing gathered (sharding._fsdp)
    full = spec.lora is None and spec.quant is None and spec.freeze is None and spec.peft is None
    # tied (a full fine-tune; measured, benchmarks/fsdp_kinds_cpu.py tied-*): FSDP1's root holds the shared weight,
    # FSDP2's tail unit holds it and reduces in the root's final callback
    return (full or (fsdp_lora_moments(spec) and not spec.model.shape.tied_embeddings)) and trainable_params(spec) > 0


def fsdp_lora_moments(spec: TrainingSpec) -> bool:
    """Whether a LoRA run's FSDP backward is the measured one (``benchmarks/fsdp_kinds_cpu.py`` ``lora-*`` /
    ``qlora-*``): adapters on decoder-layer linears only (the base frozen, no ``modules_to_save``, DoRA,
    ``layers_to_transform`` or ``target_parameters``), an unquantized base or, under FSDP1, a bitsandbytes 4-bit one
    packed in a float storage (the fms / TRL sharded QLoRA), FSDP mixed precision, no gradient checkpointing (not
    measured: the checkpointed LoRA moments keep the old formula, and so do FSDP2 QLoRA and a run without mixed
    precision)."""
    lora, q, fs = spec.lora, spec.quant, spec.sharding.fsdp
    qlora = q is not None and is_fsdp_4bit(spec) and fs is not None and fs.version == 1
    one_process_4bit = q is not None and q.method == "bitsandbytes" and q.bits == 4 and fs is not None and (
        fs.version == 1 and spec.data_parallel_size == 1)  # NO_SHARD: nothing gathered (sharding._fsdp)
    if lora is None or (q is not None and not (qlora or one_process_4bit)) or spec.freeze is not None or (
            spec.peft is not None):
        return False
    if lora.modules_to_save or lora.use_dora or lora.layers_to_transform is not None or lora.target_parameters:
        return False
    from fitcheck.core.states.lora import plan_lora

    # measured under bf16 mixed precision (FSDP's 16-bit copies of base and adapters); without it, not measured
    return (not spec.activations.checkpointing and spec.precision.mixed_precision is not MixedPrecision.NO
            and all(t.entry.per_layer for t in plan_lora(spec).targets))

