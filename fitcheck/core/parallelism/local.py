"""The training step one rank runs under a parallelism layout, as a plain data-parallel spec (pure).

Every rank of an accelerate ``ParallelismConfig`` run executes the same program on smaller tensors, so its
memory is the memory of an ordinary (ZeRO/FSDP/DDP) step of a smaller problem:

- tensor parallel (``tp``): the rank holds the parameters transformers' ``tp_plan`` gives it
  (:mod:`fitcheck.core.parallelism.tp_plan`): attention and MLP projections split, embeddings and norms whole,
  the LM head split by vocabulary with its logits gathered; attention heads and MLP columns split in the
  activations, the residual stream whole.
- context parallel (``cp``, torch ring attention) and Ulysses sequence parallel (``sp``, DeepSpeed): the
  rank holds ``seq_len / cp`` (``/ sp``) tokens of every activation and of the logits; attention's extra
  working set (gathered keys/values, all-to-all buffers) is added by
  :mod:`fitcheck.core.parallelism.buffers`.
- sharding group: FSDP2 shards over the flattened ``dp_shard x cp`` mesh and replicates over
  ``dp_replicate`` (accelerate ``parallelism_config.py`` ``fsdp_dim_names``; HSDP = HYBRID_SHARD);
  DeepSpeed ZeRO partitions over the sequence-data-parallel group (``dp x sp`` ranks: DeepSpeed 0.19.8
  ``runtime/engine.py`` passes ``seq_data_parallel_group`` to the ZeRO optimizer); a tensor-parallel model
  without FSDP is not wrapped in DDP (accelerate ``accelerator.py`` ``prepare_model``).

Limitation: host RAM per node for offload is counted with ``dp_shard x cp`` ranks per node.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.spec import FsdpSpec, ParallelismSpec, ShardingSpec, Strategy, TrainingSpec


def active_layout(spec: TrainingSpec) -> ParallelismSpec | None:
    """The spec's layout when it changes anything per rank (tp, cp, sp > 1 or HSDP), else None."""
    par = spec.sharding.parallelism
    return par if par is not None and par.active else None


def shard_group(spec: TrainingSpec, par: ParallelismSpec) -> int:
    """Ranks one copy of the (tensor-parallel-local) model states is sharded or replicated over."""
    sh = spec.sharding
    if sh.strategy is Strategy.DEEPSPEED:
        return max(1, sh.num_processes // (par.tp * par.cp))  # dp x sp
    return par.dp_replicate * par.dp_shard * par.cp


def _local_sharding(spec: TrainingSpec, par: ParallelismSpec) -> ShardingSpec:
    sh = spec.sharding
    n = shard_group(spec, par)
    machines = sh.num_machines if n % sh.num_machines == 0 else 1
    if sh.strategy is Strategy.FSDP:
        fs = sh.fsdp or FsdpSpec()
        if par.dp_replicate > 1:
            # HSDP: shard within dp_shard x cp, replicate across dp_replicate (HYBRID_SHARD's shard group is
            # the processes of one "machine" in fitcheck.core.sharding.partition)
            fs = replace(fs, sharding_strategy="HYBRID_SHARD")
            machines = par.dp_replicate
        return ShardingSpec(Strategy.FSDP, n, machines, None, fs)
    if sh.strategy is Strategy.DEEPSPEED:
        return ShardingSpec(Strategy.DEEPSPEED, n, machines, sh.deepspeed, None)
    strategy = Strategy.DDP if n > 1 and par.tp == 1 else Strategy.SINGLE
    return ShardingSpec(strategy, n if strategy is Strategy.DDP else 1, machines if n > 1 else 1)


def local_seq_len(spec: TrainingSpec, par: ParallelismSpec) -> int:
    """Tokens of one sequence that one rank holds outside attention."""
    return max(1, -(-spec.batch.seq_len // (par.cp * par.sp)))


def rank_local_spec(spec: TrainingSpec) -> TrainingSpec:
    """The spec of the step one rank runs (the spec itself when no tp/cp/sp/HSDP layout is set).

    Args:
        spec: The run, with ``spec.sharding.parallelism``.

    Returns:
        A spec without a parallelism layout whose estimate is one rank's memory, before the attention
        buffers of CP/SP.
    """
    par = active_layout(spec)
    if par is None:
        return spec
    from fitcheck.core.parallelism.tp_plan import local_inventory  # a parallelism layout only

    return replace(
        spec,
        model=local_inventory(spec.model, par.tp),
        batch=replace(spec.batch, seq_len=local_seq_len(spec, par)),
        sharding=_local_sharding(spec, par),
    )


def describe_layout(spec: TrainingSpec) -> str:
    """One line: the layout as applied, e.g. ``"dp_shard 4 x tp 8 (32 ranks)"``."""
    par = spec.sharding.parallelism
    if par is None:
        return ""
    parts = [f"{name} {size}" for name, size in par.as_dict().items() if size > 1]
    return " x ".join(parts or ["dp_replicate 1"]) + f" ({spec.sharding.num_processes} ranks)"
