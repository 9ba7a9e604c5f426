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

A peft model prepared with ``update_fsdp_plugin_peft`` (:func:`peft_root_gathers`; NOT the Trainer's FSDP2 run,
which never calls it: see that function) gets none of the layer units: transformers 5.23
``distributed/fsdp.py`` ``update_fsdp_plugin_peft`` sets ``fsdp_plugin.auto_wrap_policy`` to peft 0.21.2
``utils/other.py`` ``fsdp_auto_wrap_policy(model)``, a ``functools.partial(_or_policy, ...)``; accelerate 1.15
``fsdp_utils.py``
``fsdp2_prepare_auto_wrap_policy`` unwraps the partial and knows only ``transformer_auto_wrap_policy`` and
``size_based_auto_wrap_policy`` (else ``return None``), so ``fsdp2_prepare_model`` ``fully_shard``s no decoder
layer: the input embedding and the tail (the LM head: ``_find_final_norm`` scans ``base_model_prefix``'s children,
the ``LlamaForCausalLM`` under peft, and finds no norm) get units, the root gets every decoder layer. The root is
sharded with ``reshard_after_forward`` left out (``root_kwargs``), i.e. None, which torch 2.13 ``_fsdp_state.py``
``_lazy_init`` resolves to False for the root, so the root's parameters, all layers in ``param_dtype``, are
gathered from the start of forward to the root's post-backward at the end of backward, and its unsharded
gradients (the adapters') are held until then. Recorded: ``benchmarks/data/fsdp2_run_events_cpu.json`` variants
``lora`` (prepared with ``update_fsdp_plugin_peft`` called, as that harness assumed the Trainer does under FSDP2)
vs ``lora_accelerate`` (accelerate's own layer units: the Trainer's FSDP2 run) at ``forward1``.
"""

from __future__ import annotations

from fitcheck.core.states.fsdp_qlora import gathered_layer_bytes, is_fsdp_4bit
from fitcheck.core.states.layout import trainable_params
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import Role, TrainingSpec
from fitcheck.units import format_bytes


def tail_params(spec: TrainingSpec) -> int:
    """Parameters outside the decoder layers that stay gathered from the end of forward: the final norm and the
    LM head, plus the input embedding when it is tied (it is then the same tensor)."""
    outside = [p for p in spec.model.params if not p.per_layer]
    tied = not any(p.role is Role.LM_HEAD for p in outside)
    return sum(p.numel for p in outside if tied or p.role is not Role.EMBEDDING)


def peft_root_gathers(spec: TrainingSpec) -> bool:
    """Whether the FSDP2 root unit holds every decoder layer (a peft model whose wrap policy accelerate 1.15's FSDP2
    does not apply, module docstring): never under the Trainer. transformers 5.23 ``trainer.py``
    ``_prepare_for_training`` sets ``delay_optimizer_creation = False`` for FSDP2 (l.1717-1722: "Can't delay
    optimizer creation when using FSDP2") and calls ``update_fsdp_plugin_peft`` only under
    ``if delay_optimizer_creation`` (l.1751-1754), so an FSDP2 peft model keeps accelerate's own
    ``transformer_based_wrap`` layer units. Measured on an H200 (``benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json``,
    Mistral-7B LoRA 4 x 4096 under the Trainer's FSDP2 on one process, where every gathered group is its own copy):
    the step held the plain run's bytes plus one 262,144,000 B group, not the 13.5 GiB of layers a root gather
    holds. The root-gather layout stays for ``fsdp2_plan(trainer=False)``-style scripts that call
    ``update_fsdp_plugin_peft`` themselves; no spec describes one, so this is False for every spec."""
    del spec  # every FSDP2 peft run fitcheck reads is the Trainer's (or TRL's, a Trainer subclass)
    return False


def root_layer_bytes(spec: TrainingSpec, compute_bytes: int) -> int:
    """Bytes the root unit of :func:`peft_root_gathers` holds gathered: every decoder layer as FSDP gathers it
    (``param_dtype``; a 4-bit base's packed bytes, ``fsdp_qlora.gathered_layer_bytes``), the adapters (unsharded in
    ``param_dtype``: ``_fsdp_param.py`` ``init_unsharded_param``) and the final norm (``_find_final_norm`` finds none
    under peft). Recorded at ``forward1``: the ``lora`` variant minus ``lora_accelerate`` is this less the norm."""
    if is_fsdp_4bit(spec):
        layers = gathered_layer_bytes(spec, compute_bytes) * spec.model.shape.num_layers
    else:
        layers = sum(p.numel for p in spec.model.params if p.per_layer) * compute_bytes
    norms = sum(p.numel for p in spec.model.params if not p.per_layer and p.role is Role.NORM)
    return layers + (trainable_params(spec) + norms) * compute_bytes


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
    if peft_root_gathers(spec):
        return _peft_root_components(spec, compute_bytes, source, shards)
    tail = tail_params(spec) * compute_bytes
    held = 2 * tail if shards > 1 else tail  # + the tail's flat all-gather output until the root's post-forward
    unit = gathered_layer_bytes(spec, compute_bytes) if is_fsdp_4bit(spec) else unit_params * compute_bytes
    layers = sum(p.numel for p in spec.model.params if p.per_layer) * compute_bytes
    trained = trainable_params(spec) > 0 and spec.lora is None
    grads = 2 * unit_params * compute_bytes if trained else 0  # unsharded grads + reduce-scatter input
    if reshard:
        values = {Phase.FORWARD_END: held, Phase.BACKWARD_START: tail, Phase.BACKWARD: 2 * unit + grads}
        how = "layers resharded after forward; in backward a unit + the prefetched next"
    else:
        values = {
            Phase.FORWARD_END: held + layers,
            Phase.BACKWARD_START: tail + layers,
            Phase.BACKWARD: layers + grads,
        }
        how = "reshard_after_forward=False: every layer kept gathered until its backward"
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


def _peft_root_components(spec: TrainingSpec, compute_bytes: int, source: str, shards: int) -> tuple[Component, ...]:
    """The gathered-parameter buffer of :func:`peft_root_gathers`' units: the root's layers gathered from forward to
    the end of backward, the tail (the LM head) twice at the end of forward, and the root's unsharded adapter
    gradients (``param_dtype``) until its post-backward, copied there into the reduce-scatter input."""
    outside = [p for p in spec.model.params if not p.per_layer]
    tied = not any(p.role is Role.LM_HEAD for p in outside)
    # _find_final_norm finds no norm under peft: the tail is the LM head (and the tied embedding), the norm the root's
    tail = sum(p.numel for p in outside if p.role is Role.LM_HEAD or (tied and p.role is Role.EMBEDDING))
    tail *= compute_bytes
    held = 2 * tail if shards > 1 else tail
    layers = root_layer_bytes(spec, compute_bytes)
    grads = 2 * trainable_params(spec) * compute_bytes  # unsharded adapter grads + the reduce-scatter input
    values = {Phase.FORWARD_END: held + layers, Phase.BACKWARD_START: tail + layers, Phase.BACKWARD: layers + grads}
    return _buffer(
        values,
        source + "; transformers 5.23 trainer.py l.1753 update_fsdp_plugin_peft -> accelerate 1.15 "
        "fsdp2_prepare_auto_wrap_policy returns None for peft's _or_policy: no layer units; torch 2.13 root "
        "reshard_after_forward None -> False (fitcheck/core/states/fsdp2_units.py)",
        f"peft model under the Trainer's FSDP2: the root unit gathers all {spec.model.shape.num_layers} "
        f"decoder layers ({format_bytes(layers)}) from forward to the end of backward; tail (LM head) "
        f"{format_bytes(tail)}; unsharded adapter grads + reduce-scatter input {format_bytes(grads)}",
    )
