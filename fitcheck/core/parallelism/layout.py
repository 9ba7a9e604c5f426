"""Checks a parallelism layout the way accelerate 1.15, transformers 5.23 and DeepSpeed 0.19.8 will (pure).

Each problem is one message with accelerate's (or the library's) own words and a fix. The reader raises them
as a :class:`fitcheck.errors.ConfigError` (exit 2) before anything is estimated.

Sources: accelerate 1.15 ``parallelism_config.py`` (``__post_init__``: sizes >= 1, backends, CP and SP
mutually exclusive, TP/CP with pure DDP refused; ``_validate_accelerator``: ``total_size`` must equal
``num_processes`` except for DeepSpeed SP, FSDP2 needs a ``dp_shard`` or ``cp`` dimension),
``commands/launch.py`` (parallelism config needs FSDP version 2), ``utils/dataclasses.py``
(``TorchContextParallelConfig``: "FSDP2-based Context parallelism"; ``DeepSpeedSequenceParallelConfig``: eager
and flex attention refused), ``accelerator.py`` (SP is set up only in ``_prepare_deepspeed``);
DeepSpeed 0.19.8 ``runtime/sequence_parallel/ulysses_sp.py`` (head divisibility); torch 2.13
``distributed/tensor/experimental/_context_parallel`` (CP dispatches ``scaled_dot_product_attention`` only,
the sequence is split into ``2 * cp`` chunks for the causal load balancer).
"""

from __future__ import annotations

from fitcheck.spec import AttnImpl, ParallelismSpec, Strategy, TrainingSpec


def size_problems(par: ParallelismSpec, num_processes: int, strategy: Strategy) -> list[str]:
    """Problems with the sizes alone (no model needed), accelerate's checks and messages.

    Args:
        par: The layout.
        num_processes: Total processes (``--num_processes``).
        strategy: The sharding strategy (FSDP / DeepSpeed / DDP / single).

    Returns:
        One message per problem (empty when accelerate would accept the layout).
    """
    out: list[str] = []
    sizes = (
        f"dp_replicate_size={par.dp_replicate} x dp_shard_size={par.dp_shard} x tp_size={par.tp} x "
        f"cp_size={par.cp} x sp_size={par.sp} = {par.total}"
    )
    if par.sp_backend != "deepspeed":
        out.append(
            f"sp_backend must be one of ['deepspeed'], but got {par.sp_backend!r} (accelerate "
            "ParallelismConfig); use --sp_backend deepspeed"
        )
    if par.cp_comm_strategy not in ("allgather", "alltoall"):
        out.append(
            f"Invalid cp_comm_strategy: {par.cp_comm_strategy}. Must be one of 'allgather' or 'alltoall'."
        )
    if par.cp > 1 and par.sp > 1:
        out.append(
            "Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
            f"Got cp_size={par.cp} and sp_size={par.sp}. Please set either cp_size=1 or sp_size=1."
        )
    if (par.tp > 1 or par.cp > 1) and par.dp_replicate > 1 and par.dp_shard == 1:
        out.append(
            "Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism "
            "(dp_replicate_size > 1 and dp_shard_size == 1) (accelerate); set dp_shard_size > 1 "
            "(FSDP + TP/CP, or HSDP + TP/CP with dp_replicate_size > 1)"
        )
    ds_sp = par.sp > 1 and strategy is Strategy.DEEPSPEED
    if ds_sp and par.dp_replicate * par.dp_shard * par.tp * par.cp == 1:
        if num_processes % par.sp:
            out.append(
                f"--num_processes {num_processes} is not divisible by sp_size={par.sp}: DeepSpeed builds "
                "sequence-parallel groups of sp_size ranks; use a multiple of sp_size processes"
            )
    elif par.total != num_processes:
        out.append(
            f"ParallelismConfig total_size ({par.total}) does not match num_processes ({num_processes}): "
            f"{sizes}. Please adjust dp_replicate_size/dp_shard_size/tp_size/cp_size/sp_size so that "
            f"their product is {num_processes}, or pass --num_processes {par.total}"
        )
    if par.sp > 1 and strategy is not Strategy.DEEPSPEED:
        out.append(
            f"sp_size={par.sp} needs DeepSpeed: accelerate sets up Ulysses (UlyssesSPAttentionHF) only when "
            "preparing a DeepSpeed engine; add --deepspeed ds.json (or --zero_stage N), or use cp_size "
            "with FSDP2 instead"
        )
    if (par.tp > 1 or par.cp > 1) and strategy is Strategy.DEEPSPEED:
        out.append(
            f"tp_size={par.tp}/cp_size={par.cp} with DeepSpeed: accelerate's tensor and context parallelism "
            "are DTensor/FSDP2 features (the device mesh is not built for DeepSpeed SP and ZeRO does not "
            "shard DTensor parameters); use FSDP2 (fsdp_version 2) for tp/cp, or sp_size with DeepSpeed"
        )
    return out


def strategy_problems(spec: TrainingSpec, par: ParallelismSpec) -> list[str]:
    """Problems that depend on the FSDP settings, the model and the attention kernel."""
    out: list[str] = []
    sh = spec.sharding
    fs = sh.fsdp
    if sh.strategy is Strategy.FSDP and fs is not None:
        if fs.version != 2:
            out.append(
                "You cannot use `--use_parallelism_config` without `--use_fsdp` and `--fsdp_version=2` "
                "(accelerate launch); set fsdp_version: 2"
            )
        elif par.dp_shard == 1 and par.cp == 1:
            out.append(
                "FSDP is enabled but the parallelism config has no dimension for FSDP to shard across (both "
                "`dp_shard_size` and `cp_size` are 1) (accelerate); set dp_shard_size > 1 or launch without "
                "the FSDP config"
            )
    if par.tp > 1 and sh.strategy in (Strategy.DDP, Strategy.SINGLE) and par.dp_replicate * par.dp_shard > 1:
        out.append(
            f"tp_size={par.tp} with dp_replicate_size x dp_shard_size = {par.dp_replicate * par.dp_shard} "
            "without FSDP: accelerate does not wrap a tensor-parallel model in DDP (accelerator.py "
            "prepare_model), so the data-parallel ranks would never average gradients; use FSDP2"
        )
    if par.cp > 1 and sh.strategy is not Strategy.FSDP:
        out.append(
            f"cp_size={par.cp} needs FSDP2 (accelerate TorchContextParallelConfig: 'FSDP2-based Context "
            "parallelism'); add an FSDP config with fsdp_version: 2"
        )
    shape = spec.model.shape
    if par.tp > 1:
        from fitcheck.core.parallelism.tp_plan import tp_divisibility_problems, tp_plan  # tp runs only

        if tp_plan(shape) is None:
            out.append(
                f"model_type {shape.family!r} has no tp_plan in transformers 5.23 (base_model_tp_plan is "
                "unset), so tp_size > 1 cannot shard it; use dp_shard_size (FSDP) instead"
            )
        else:
            out += [f"tp_size={par.tp}: {p} (transformers would split a head)" for p in
                    tp_divisibility_problems(shape, par.tp)]
    seq = spec.batch.seq_len
    attn = spec.activations.attn_implementation
    if par.cp > 1:
        if seq % (2 * par.cp):
            out.append(
                f"max_seq_length {seq} is not divisible by 2 x cp_size = {2 * par.cp} (torch context_parallel "
                "splits the sequence into 2 x cp_size chunks for causal load balancing); pad to a multiple"
            )
        if attn is not AttnImpl.SDPA:
            out.append(
                f"attn_implementation {attn.value} with cp_size={par.cp}: torch context parallelism replaces "
                "only F.scaled_dot_product_attention; use --attn_implementation sdpa"
            )
    if par.sp > 1:
        if seq % par.sp:
            out.append(
                f"max_seq_length {seq} is not divisible by sp_size={par.sp} (Ulysses shards the sequence "
                "evenly); pad to a multiple of sp_size"
            )
        if attn is AttnImpl.EAGER:
            out.append(
                "Invalid sp_attn_implementation: eager. 'eager' and 'flex_attention' are not supported with "
                "sequence parallelism. (accelerate); use --attn_implementation sdpa or flash_attention_2"
            )
        if shape.num_heads % par.sp:
            out.append(
                f"num_attention_heads={shape.num_heads} is not divisible by sp_size={par.sp} (DeepSpeed "
                "ulysses_sp.py); choose an sp_size that divides the head count"
            )
        kv = shape.num_kv_heads
        if not (kv % par.sp == 0 or par.sp % kv == 0):
            out.append(
                f"KV attention head count {kv} is not divisible by SP size {par.sp} or vice versa (DeepSpeed "
                "ulysses_sp.py)"
            )
    return out


def layout_problems(spec: TrainingSpec) -> list[str]:
    """Every problem with the spec's parallelism layout (empty when there is none or it is valid)."""
    par = spec.sharding.parallelism
    if par is None:
        return []
    return size_problems(par, spec.sharding.num_processes, spec.sharding.strategy) + strategy_problems(spec, par)
