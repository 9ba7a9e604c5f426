"""FSDP1's prefetching: the layer units ``backward_prefetch`` and ``forward_prefetch`` gather ahead of their own
hook (torch 2.13 ``distributed/fsdp/_runtime_utils.py`` ``_prefetch_handle`` / ``_get_handle_to_prefetch``), in
one home for both. FSDP2 has neither setting (accelerate 1.15 sets ``backward_prefetch`` to None and reads
``FSDP_FORWARD_PREFETCH`` for ``fsdp_version`` 1 only): its own prefetch is ``fsdp2_units.py``'s.
"""

from __future__ import annotations

from fitcheck.findings import Finding, Severity
from fitcheck.spec import TrainingSpec


def _sharded_fsdp1(spec: TrainingSpec) -> bool:
    """FSDP1 over more than one process, not NO_SHARD (torch 2.13 ``_init_utils.py``: one process is NO_SHARD
    whatever the strategy, and NO_SHARD gathers nothing)."""
    fs = spec.sharding.fsdp
    return fs is not None and fs.version == 1 and fs.sharding_strategy != "NO_SHARD" and spec.data_parallel_size > 1


def fsdp1_prefetched_units(spec: TrainingSpec) -> tuple[int, int]:
    """Layer units FSDP1's ``backward_prefetch`` gathers ahead: (during a unit's backward and at the LM head's, at
    a layer's reduction) -- (1, 1) for BACKWARD_PRE, (0, 1) for BACKWARD_POST, (0, 0) for NO_PREFETCH or one
    process (NO_SHARD: nothing to gather).

    torch 2.13 ``distributed/fsdp/_runtime_utils.py``: ``_pre_backward_hook`` unshards its unit, then
    ``_prefetch_handle(BACKWARD)`` unshards the unit whose backward comes next (``_get_handle_to_prefetch``,
    BACKWARD_PRE) -- the root's hook, when the logits' gradient exists, the top layer; the bottom layer's has none
    left (the root stays gathered); ``_post_backward_hook`` runs ``_post_backward_reshard`` (reshard, then the
    BACKWARD_POST prefetch) before it reduces the unit's gradient."""
    fs = spec.sharding.fsdp
    if fs is None or not _sharded_fsdp1(spec):
        return 0, 0
    return {"BACKWARD_PRE": (1, 1), "BACKWARD_POST": (0, 1)}.get(fs.backward_prefetch, (0, 0))


def fsdp1_forward_prefetch_findings(spec: TrainingSpec, unit_bytes: int) -> list[Finding]:
    """FSDP1's ``forward_prefetch``: what it gathers ahead, at the moments fitcheck estimates and beside them.

    torch 2.13 ``_runtime_utils.py``: ``_pre_forward_unshard`` unshards its unit (unless prefetched) and then
    ``_prefetch_handle(FORWARD)`` unshards the next unit in the pre-forward order the first iteration recorded
    (``_exec_order_utils.py`` ``get_handle_to_forward_prefetch``: none in the first iteration, none after the top
    layer); ``_post_forward_reshard`` frees each layer unit after its forward; a recomputed forward (checkpointing)
    returns before unsharding or prefetching (``handle._training_state == BACKWARD_PRE``); backward prefetches by
    ``backward_prefetch`` only. So every layer's forward but the top one's holds the next layer unit too, and the end
    of forward, the start of backward and the head's backward hold none: a real FSDP1 Trainer run (2 gloo ranks,
    ``benchmarks/accumulation_engines_cpu.py`` engine ``fsdp1-2ranks-fwd``) has the same forward, start-of-backward and
    head peaks as without it, to the byte, at 32 and 128 tokens. Not modelled: the moment inside the forward (a
    layer's forward with two units, which fitcheck does not estimate), and one more layer unit the real run held at
    the top layer's backward at 32 tokens (+273,920 B at the layers' peak of micro-step 2; none at 128 tokens),
    which this reading of the source does not explain. Both unpin the answer.

    Args:
        spec: The training spec.
        unit_bytes: One layer unit's gathered bytes.

    Returns:
        A ``not-modelled`` warning for a sharded FSDP1 run with ``forward_prefetch``, else nothing.
    """
    fs = spec.sharding.fsdp
    if fs is None or not fs.forward_prefetch or not _sharded_fsdp1(spec):
        return []
    return [Finding(
        "not-modelled", Severity.WARNING,
        f"forward_prefetch (FSDP1): each layer's forward but the top one's also holds the next layer unit gathered "
        f"({unit_bytes:,} B), a moment inside forward that fitcheck does not estimate (the end of forward and the "
        "start of backward hold none, as without it); a real FSDP1 run also held one more unit at the top layer's "
        "backward at a short sequence",
        "forward_prefetch=false (the default) is estimated as checked",
    )]
