"""What context and sequence parallel attention allocate on top of a rank's ordinary step, and findings.

Context parallel (torch 2.13 ``distributed/tensor/experimental/_context_parallel/_attention.py``, the
implementation accelerate 1.15 ``_prepare_cp`` installs with ``set_rotate_method(cp_comm_strategy)``):
forward and backward of every attention call run ``cp`` SDPA steps over key/value chunks. With the default
``allgather`` rotater (``_AllGatherRotater``) the keys and values of the whole sequence are all-gathered once
per call (``2·b·S·kv·d`` elements); with ``alltoall`` one next chunk is in flight. Backward
(``_templated_ring_attention_backward``) accumulates ``grad_query/key/value`` in fp32
(``_cp_options.convert_to_f32 = True``) and rotates the key/value gradients with an all-to-all rotater
(``cat([grad_key, grad_value])`` sent and received). Saved for backward are only the local q, k, v, output
and log-sum-exp: the rank-local activation formula at ``S / cp`` tokens counts them.

Ulysses / ALST (DeepSpeed 0.19.8 ``runtime/sequence_parallel/ulysses_sp.py`` ``UlyssesSPAttentionHF``):
q, k, v of ``S / sp`` tokens and all heads are exchanged by all-to-all into ``S`` tokens of ``heads / sp``
heads (same bytes), attention runs, the output comes back by all-to-all. Key/value heads are replicated
when ``kv_heads < sp`` (``kv_replication_factor``), so each rank then holds one whole-sequence kv head.
Backward runs the same exchanges on the gradients.
"""

from __future__ import annotations

from collections.abc import Callable

from fitcheck.core.parallelism.local import active_layout, local_seq_len
from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import DeviceType, MixedPrecision, ParallelismSpec, TrainingSpec

_SRC_CP = (
    "torch 2.13 distributed/tensor/experimental/_context_parallel/_attention.py: _AllGatherRotater "
    "(all_gather_single of cat(k, v)) / _AllToAllRotater; _templated_ring_attention_backward fp32 "
    "grad_query/key/value (convert_to_f32) and the dkv all-to-all rotater"
)
_SRC_SP = (
    "deepspeed 0.19.8 runtime/sequence_parallel/ulysses_sp.py UlyssesSPAttentionHF: _combine_local_sequences "
    "(all-to-all of q, k, v; kv repeat_interleave when kv_heads < sp) and _partition_global_sequence"
)


def attention_input_bytes(spec: TrainingSpec) -> int:
    """Bytes per element of attention inputs (16-bit under autocast or a 16-bit model)."""
    if spec.precision.mixed_precision is not MixedPrecision.NO or spec.precision.load_dtype.is_half:
        return 2
    return 4


def rank_attention_heads(spec: TrainingSpec, par: ParallelismSpec) -> tuple[int, int, int]:
    """(query heads, kv heads, head_dim) of one rank's attention (split by tp when the plan splits heads)."""
    sh = spec.model.shape
    q, kv = sh.num_heads, sh.num_kv_heads
    plan = None
    if par.tp > 1:
        from fitcheck.core.parallelism.tp_plan import tp_plan  # tp runs only

        plan = tp_plan(sh)
    if plan is not None and any(v == "colwise" for k, v in plan.items() if "attn" in k):
        q, kv = max(1, q // par.tp), max(1, kv // par.tp)
    return q, kv, sh.head_dim


def cp_buffer_bytes(spec: TrainingSpec, par: ParallelismSpec) -> tuple[int, int]:
    """(forward, backward) working set of one context-parallel attention call, in bytes."""
    b, s_local, s_full = spec.batch.micro_batch, local_seq_len(spec, par), spec.batch.seq_len
    q, kv, d = rank_attention_heads(spec, par)
    e = attention_input_bytes(spec)
    local_kv = 2 * b * s_local * kv * d
    # allgather: the gathered whole-sequence k, v + the cat sent; alltoall: the next chunk in flight (sent + received)
    gathered = 2 * b * s_full * kv * d * e + local_kv * e
    kv_buf = gathered if par.cp_comm_strategy == "allgather" else 2 * local_kv * e
    merger = b * s_local * q * d * 4 + b * q * s_local * 4  # _SDPAMerger fp32 output and log-sum-exp
    grads_f32 = (b * s_local * q * d + local_kv) * 4  # grad_query/key/value accumulators (convert_to_f32)
    dkv_rotation = 2 * local_kv * 4  # cat(grad_key, grad_value) sent and received (all-to-all rotater)
    return kv_buf + merger, kv_buf + grads_f32 + dkv_rotation


def sp_buffer_bytes(spec: TrainingSpec, par: ParallelismSpec) -> tuple[int, int]:
    """(backward all-to-all working set of one Ulysses attention call, extra saved bytes over all layers)."""
    b, s_full = spec.batch.micro_batch, spec.batch.seq_len
    s_local = local_seq_len(spec, par)
    q, kv, d = rank_attention_heads(spec, par)
    e = attention_input_bytes(spec)
    kv_eff = max(kv, par.sp)  # kv heads after repeat_interleave when kv < sp, summed over the sp ranks
    out_pair = 2 * b * s_local * q * d * e  # grad of the attention output: before and after the all-to-all
    qkv_pair = 2 * b * s_local * (q + 2 * kv_eff) * d * e  # q/k/v gradients before and after
    extra_kv_saved_per_layer = 2 * b * s_full * d * e * max(0, kv_eff - kv) // par.sp
    layers = spec.model.shape.num_layers
    if spec.activations.checkpointing:
        layers = 1  # only the recomputed layer holds its attention inputs
    return out_pair + qkv_pair, extra_kv_saved_per_layer * layers


def parallel_components(
    spec: TrainingSpec, nccl_group: Callable[[int], int] | None = None
) -> tuple[Component, ...]:
    """CP ring buffers, Ulysses all-to-all buffers and the tp/cp/sp communicators' NCCL buffers.

    Args:
        spec: The run with its layout.
        nccl_group: NCCL bytes per GPU of one communicator of n ranks (``fitcheck.core.overheads``); None
            leaves the communicators out.

    Returns:
        Components (none without a tp/cp/sp/HSDP layout).
    """
    par = active_layout(spec)
    if par is None:
        return ()
    out: list[Component] = []
    groups = [(name, size) for name, size in (("tp", par.tp), ("cp", par.cp), ("sp", par.sp)) if size > 1]
    nccl = sum(nccl_group(size) for _, size in groups) if nccl_group is not None else 0
    if nccl and spec.hardware.device_type is DeviceType.CUDA:
        out.append(
            Component.persistent(
                "parallel.nccl_communicators",
                Category.OVERHEAD,
                nccl,
                "one NCCL communicator per device-mesh dimension that communicates, each with its own buffers "
                "(NVIDIA/nccl#864; sizes measured in NVIDIA/nccl#964)",
                ", ".join(f"{name} group of {size}" for name, size in groups) + "; not in max_memory_allocated",
                location=Location.DEVICE_OTHER,
            )
        )
    if par.cp > 1:
        fwd, bwd = cp_buffer_bytes(spec, par)
        out.append(
            Component(
                "parallel.cp_ring_attention",
                Category.BUFFERS,
                Location.DEVICE,
                {Phase.BACKWARD: bwd},
                _SRC_CP,
                f"cp {par.cp} ({par.cp_comm_strategy}): one attention call's gathered keys/values of "
                f"{spec.batch.seq_len} tokens, fp32 gradient accumulators and dkv rotation "
                f"(forward {fwd / 2**20:.0f} MiB, backward {bwd / 2**20:.0f} MiB)",
            )
        )
    if par.sp > 1:
        bwd, saved = sp_buffer_bytes(spec, par)
        out.append(
            Component(
                "parallel.ulysses_all_to_all",
                Category.BUFFERS,
                Location.DEVICE,
                {Phase.BACKWARD: bwd},
                _SRC_SP,
                f"sp {par.sp}: q/k/v/output gradients before and after the all-to-all of one layer",
            )
        )
        if saved:
            out.append(
                Component(
                    "parallel.ulysses_kv_replicas",
                    Category.ACTIVATIONS,
                    Location.DEVICE,
                    {Phase.FORWARD_END: saved, Phase.BACKWARD_START: saved, Phase.BACKWARD: saved},
                    _SRC_SP,
                    f"kv heads ({spec.model.shape.num_kv_heads}) < sp {par.sp}: replicated kv heads saved",
                )
            )
    return tuple(out)


def parallel_findings(spec: TrainingSpec, traced: bool = False) -> list[Finding]:
    """What the user should know about the layout as modelled."""
    par = active_layout(spec)
    if par is None:
        return []
    from fitcheck.core.parallelism.local import describe_layout

    shape = spec.model.shape
    out = [
        Finding(
            "parallel-layout",
            Severity.INFO,
            f"parallelism {describe_layout(spec)}: each rank holds {local_seq_len(spec, par)} of "
            f"{spec.batch.seq_len} tokens per sequence"
            + (f" and 1/{par.tp} of the tp_plan's projections and embeddings (norms whole)" if par.tp > 1 else ""),
            "",
        )
    ]
    if par.tp > 1:
        out.append(
            Finding(
                "tp-residual-replicated",
                Severity.INFO,
                f"transformers 5.23 tensor parallel splits heads and MLP columns over tp {par.tp} but keeps the "
                "residual stream, the checkpointed layer inputs and the gathered logits whole on every rank "
                "(DistributedConfig.enable_sequence_parallel is not wired up); only attention/MLP internals shrink",
                "for long sequences cp_size shards every activation and the logits",
            )
        )
    if par.sp > 1:
        out.append(
            Finding(
                "alst-tiling-not-applied",
                Severity.INFO,
                "Ulysses SP via accelerate/Trainer shards the sequence but does not tile the MLP or the "
                "logits/loss (DeepSpeed's TiledMLP and TiledFusedLogitsLoss are opt-in: ulysses_sp.py); the "
                "estimate counts the model's MLP and loss on the rank's tokens",
                "Liger's fused linear cross-entropy handles Ulysses' shift_labels: --use_liger_kernel true",
            )
        )
    if shape.num_experts:
        out.append(
            Finding(
                "expert-parallel-not-modelled",
                Severity.WARNING,
                "expert parallelism is not available through accelerate 1.15's ParallelismConfig (no ep_size); "
                "transformers 5.23 DistributedConfig(ep_size=...) exists but the Trainer does not set it",
                "experts are counted whole per rank, or split by tp_size (moe_tp_experts) when tp_size > 1",
            )
        )
    if par.tp > 1 and spec.lora is not None and spec.quant is None:
        out.append(
            Finding(
                "tp-lora-unverified",
                Severity.WARNING,
                "LoRA under tp_size > 1: adapters counted as peft 0.21 shards them (lora_B of colwise and lora_A "
                "of rowwise layers split, the other replicated; checked against peft on a fake process group), "
                "but a LoRA forward through transformers' tensor-parallel hooks failed in that check (shape "
                "error in the adapter matmul), so the run itself is not verified",
                "prefer dp_shard_size (FSDP) or cp_size for LoRA runs",
            )
        )
    if par.tp > 1 and spec.quant is not None:
        out.append(
            Finding(
                "tp-quantized-unverified",
                Severity.WARNING,
                "bitsandbytes-quantized weights under tp_size > 1: counted as 1/tp of the packed weights; "
                "transformers 5.23's bitsandbytes quantizer with a tp_plan is not verified here",
                "prefer dp_shard_size (FSDP-QLoRA) for quantized bases",
            )
        )
    if traced:
        out.append(
            Finding(
                "trace-ignored-under-parallelism",
                Severity.WARNING,
                "--trace traces the whole single-rank model: ignored under tp/cp/sp, activations use the "
                "per-rank formulas",
                "",
            )
        )
    return out
