"""FLOPs, step time and throughput of one training step (pure; no torch).

The model FLOPs follow the convention of PaLM (Chowdhery et al. 2022, appendix B) that torchtitan uses for
its published MFU figures (``torchtitan/utils.py`` ``get_num_flop_per_token``)::

    model FLOPs per token = 6·N + 12·L·H·Q·T

N = parameters that take part in a matmul for each token (embedding lookups excluded; an LM head tied to
the embedding is a matmul and is counted; MoE experts count top-k/num_experts of their parameters),
L layers, H attention heads, Q head dimension, T sequence length. The 6 is 2 (multiply + add) × 3 (forward
1×, backward 2×: input gradient + weight gradient), Kaplan et al. 2020 sec. 2.1 "C ≈ 6·N·D". The attention
term counts QKᵀ and AV (2 matmuls × 2·T·Q per head per token forward, ×3 with backward); by convention it does
not halve for causal masking and does not count flash attention's backward recomputation.

What fitcheck adds to the convention, because the step really executes it:

* **Frozen weights** (LoRA, QLoRA, partial freezing) still need the input gradient in backward (2·N) but no
  weight gradient, so backward is 2·N_frozen + 4·N_trainable (Hu et al. 2021, LoRA sec. 4: no gradients
  for the frozen weights; the adapters' own matmuls are 2·P_adapter forward, 4·P_adapter backward).
* **Activation recomputation** (gradient checkpointing) runs each checkpointed decoder layer's forward again
  during backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"): + the layers' forward
  FLOPs × the fraction of layers checkpointed. These are executed ("hardware") FLOPs, not model FLOPs.
* **Offload** (DeepSpeed ZeRO-Offload, Ren et al. 2021): gradients go to the host and updated 16-bit weights
  come back over PCIe every step, and the optimizer step runs on the CPU; modelled as transfer bytes /
  link bandwidth + CPU Adam bytes / host memory bandwidth, not overlapped with the GPU work.
* **Communication** (ZeRO paper, Rajbhandari et al. 2020 sec. 7: all-reduce = 2Ψ, ZeRO-3 = 3Ψ per step) as
  bytes / interconnect bandwidth, assumed overlapped with compute (step = max(compute, communication)): that
  is what DDP buckets and ZeRO/FSDP prefetching are for.

Not modelled (stated in the notes of every estimate): bitsandbytes 4-/8-bit dequantisation work (QLoRA is
slower than the FLOPs say), the memory-bound optimizer step, data loading, kernel launch overheads, and the
utilisation change with micro-batch size (the MFU is one number per run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fitcheck.core.parallelism import parallel_comm_bytes, rank_local_spec
from fitcheck.spec import DeviceType, Dtype, MixedPrecision, OffloadDevice, Role, Strategy, TrainingSpec

# torchtitan benchmarks/llama3_h100_202412_torchtitan.md: "1D Llama 3.1 8B model training on 8 or 128 H100
# GPUs without Float8 achieves 33% to 39% MFU (with or without torch.compile)". 0.33 = the eager figure,
# the closest published analogue of an eager HF Trainer step; override with ComputeAssumptions(mfu=...).
DEFAULT_MFU = 0.33

# PCIe 4.0 x16: 16 GT/s × 16 lanes ≈ 32 GB/s per direction (PCI-SIG PCIe 4.0 spec; A100/H100 PCIe hosts).
DEFAULT_HOST_LINK_BYTES_PER_S = 32e9
# CPU memory bandwidth shared by one node's ranks: 8 channels DDR4-3200 = 8 × 25.6 GB/s = 204.8 GB/s
# (JEDEC DDR4-3200 × 8 channels, the AMD EPYC 7003 hosts of DGX A100).
DEFAULT_HOST_MEMORY_BYTES_PER_S = 204.8e9
# NVLink 4 on H100 SXM: 900 GB/s total = 450 GB/s per direction (NVIDIA H100 datasheet).
DEFAULT_INTRA_NODE_BYTES_PER_S = 450e9
# 400 Gb/s RDMA per GPU = 50 GB/s (torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Hardware).
DEFAULT_INTER_NODE_BYTES_PER_S = 50e9
# DeepSpeed CPU Adam touches fp32 param, grad, exp_avg, exp_avg_sq (read 16 B) and writes param, exp_avg,
# exp_avg_sq (12 B) = 28 B/param (deepspeed/ops/csrc/adam/cpu_adam_impl.cpp Step_1: one pass over 4 arrays).
CPU_ADAM_BYTES_PER_PARAM = 28


@dataclass(frozen=True)
class ComputeAssumptions:
    """Throughput assumptions (each default cites its source in this module).

    Attributes:
        mfu: Fraction of the GPU's dense peak achieved on the FLOPs the step executes.
        peak_tflops: Dense peak TFLOP/s per GPU; None = the GPU table's bf16 figure.
        host_link_bytes_per_s: GPU<->host bandwidth per GPU (offload transfers).
        host_memory_bytes_per_s: Host memory bandwidth per node (CPU Adam).
        intra_node_bytes_per_s: GPU<->GPU bandwidth per GPU within a node.
        inter_node_bytes_per_s: GPU<->GPU bandwidth per GPU across nodes.
    """

    mfu: float = DEFAULT_MFU
    peak_tflops: float | None = None
    host_link_bytes_per_s: float = DEFAULT_HOST_LINK_BYTES_PER_S
    host_memory_bytes_per_s: float = DEFAULT_HOST_MEMORY_BYTES_PER_S
    intra_node_bytes_per_s: float = DEFAULT_INTRA_NODE_BYTES_PER_S
    inter_node_bytes_per_s: float = DEFAULT_INTER_NODE_BYTES_PER_S

    def __post_init__(self) -> None:
        if not 0.0 < self.mfu <= 1.0:
            raise ValueError(f"mfu must be in (0, 1], got {self.mfu}")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise ValueError(f"peak_tflops must be positive, got {self.peak_tflops}")


@dataclass(frozen=True)
class ComputeEstimate:
    """FLOPs and time of one optimizer step.

    Attributes:
        model_flops_per_token: PaLM-convention model FLOPs per trained token (what MFU is measured against).
        flops_per_token: FLOPs the step executes per token (frozen weights, adapters, recomputation).
        flops_per_step: Executed FLOPs of one optimizer step over all GPUs.
        tokens_per_step: Tokens of one optimizer step over all GPUs (micro × seq × accumulation × processes).
        num_gpus: Data-parallel processes.
        mfu: The assumed utilisation of peak on the executed FLOPs.
        peak_tflops: Dense peak per GPU used for the time, None when unknown.
        compute_seconds: GPU compute time per step (None when the peak is unknown).
        comm_seconds: Collective communication per step at the assumed bandwidth (overlapped with compute).
        offload_seconds: Host transfers and CPU optimizer time per step (not overlapped).
        step_seconds: Wall time of one optimizer step (None when the peak is unknown).
        tokens_per_second: Tokens per second over all GPUs (None when the peak is unknown).
        notes: What is assumed or left out.
        parallel_comm_seconds: Tensor/context/sequence-parallel collectives per step (on the critical path,
            added to the step; ``fitcheck.core.parallelism``).
    """

    model_flops_per_token: float
    flops_per_token: float
    flops_per_step: float
    tokens_per_step: int
    num_gpus: int
    mfu: float
    peak_tflops: float | None
    compute_seconds: float | None
    comm_seconds: float
    offload_seconds: float
    step_seconds: float | None
    tokens_per_second: float | None
    notes: tuple[str, ...] = field(default=())
    parallel_comm_seconds: float = 0.0

    @property
    def tokens_per_second_per_gpu(self) -> float | None:
        """Throughput per GPU (the unit torchtitan publishes)."""
        return None if self.tokens_per_second is None else self.tokens_per_second / self.num_gpus

    def seconds_for_tokens(self, tokens: float) -> float | None:
        """Wall time to train on ``tokens`` tokens (None when the peak is unknown)."""
        return None if self.tokens_per_second is None else tokens / self.tokens_per_second

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the ``compute`` key of ``fitcheck estimate --json``)."""
        return {
            "flops_per_step": self.flops_per_step,
            "flops_per_token": self.flops_per_token,
            "model_flops_per_token": self.model_flops_per_token,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "step_seconds": self.step_seconds,
            "compute_seconds": self.compute_seconds,
            "comm_seconds": self.comm_seconds,
            "offload_seconds": self.offload_seconds,
            "mfu": self.mfu,
            "peak_tflops": self.peak_tflops,
            "num_gpus": self.num_gpus,
            "parallel_comm_seconds": self.parallel_comm_seconds,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class _ParamSplit:
    """Per-token matmul parameters of the base model."""

    active: float  # parameters in a matmul per token (experts scaled by top-k / num_experts)
    lm_head: float  # the LM head matmul (not recomputed by layer checkpointing)


def _param_split(spec: TrainingSpec) -> _ParamSplit:
    shape = spec.model.shape
    expert_fraction = (
        shape.experts_per_token / shape.num_experts if shape.num_experts and shape.experts_per_token else 1.0
    )
    active = 0.0
    lm_head = 0.0
    for p in spec.model.params:
        if p.role in (Role.EMBEDDING, Role.POSITION):
            continue  # a lookup, no matmul (PaLM appendix B excludes embedding parameters)
        if p.role is Role.EXPERTS:
            active += p.numel * expert_fraction
        else:
            active += p.numel
        if p.role is Role.LM_HEAD:
            lm_head += p.numel
    if shape.tied_embeddings and shape.causal_lm and lm_head == 0:
        # The tied LM head is the embedding tensor used as a matmul: V·h FLOP-parameters per token.
        lm_head = float(shape.vocab_size * shape.hidden_size)
        active += lm_head
    return _ParamSplit(active=active, lm_head=lm_head)


def _attention_flops_per_token_forward(spec: TrainingSpec) -> float:
    """4·L·H·Q·T: QKᵀ and AV forward per token (PaLM appendix B; ×3 with backward gives 12·L·H·Q·T)."""
    s = spec.model.shape
    return 4.0 * s.num_layers * s.num_heads * s.head_dim * spec.batch.seq_len


def _trainable_split(
    spec: TrainingSpec, trainable_fn: Callable[[TrainingSpec], int] | None
) -> tuple[float, float]:
    """(adapter parameters: extra forward + backward matmuls, trainable base parameters: weight gradients)."""
    if spec.lora is not None:
        from fitcheck.core.states import plan_lora

        plan = plan_lora(spec)
        # modules_to_save copies replace the original in forward (no extra forward work) but get weight grads.
        return float(plan.adapter_params), float(plan.saved_params)
    if spec.freeze is None:
        return 0.0, _param_split(spec).active
    if trainable_fn is None:
        from fitcheck.core.states import trainable_params

        trainable_fn = trainable_params
    # MoE experts are counted in full here: a slight overcount of weight-gradient work when experts train.
    return 0.0, min(float(trainable_fn(spec)), _param_split(spec).active)


def _compute_is_fp32(spec: TrainingSpec) -> bool:
    return spec.precision.mixed_precision == MixedPrecision.NO and spec.precision.load_dtype == Dtype.FLOAT32


def _comm_bytes_per_gpu(spec: TrainingSpec, trainable_total: float) -> float:
    """Collective bytes each GPU sends per optimizer step (ring algorithms, ZeRO paper sec. 7)."""
    n = spec.data_parallel_size
    if n <= 1:
        return 0.0
    ring = (n - 1) / n
    grad_b = 2.0  # 16-bit gradient buckets (DDP/DeepSpeed communicate in the compute dtype)
    weight_b = float(spec.precision.load_dtype.nbytes)
    gas = spec.batch.grad_accum
    total_params = float(spec.model.total_params)
    stage = spec.sharding.zero_equivalent_stage
    if stage <= 1:
        return 2 * ring * trainable_total * grad_b  # one all-reduce of the gradients per step (no_sync)
    reduce_scatter = gas * ring * trainable_total * grad_b  # every micro-step
    if stage == 2:
        return reduce_scatter + ring * trainable_total * weight_b  # + all-gather of updated weights
    return reduce_scatter + gas * 2 * ring * total_params * weight_b  # weights gathered in fwd and bwd


def _offload_seconds(spec: TrainingSpec, trainable_total: float, a: ComputeAssumptions) -> float:
    ds = spec.sharding.deepspeed
    if spec.sharding.strategy is not Strategy.DEEPSPEED or ds is None:
        fs = spec.sharding.fsdp
        if spec.sharding.strategy is Strategy.FSDP and fs is not None and fs.offload_params:
            n = spec.data_parallel_size
            # FSDP CPU offload: shard H2D in fwd and bwd per micro-step, grads D2H; optimizer on CPU.
            moved = spec.batch.grad_accum * 2 * spec.model.total_params / n * spec.precision.load_dtype.nbytes
            moved += trainable_total / n * 4
            cpu = CPU_ADAM_BYTES_PER_PARAM * trainable_total / n * spec.sharding.processes_per_machine
            return moved / a.host_link_bytes_per_s + cpu / a.host_memory_bytes_per_s
        return 0.0
    n = spec.data_parallel_size
    seconds = 0.0
    if ds.offload_optimizer is not OffloadDevice.NONE:
        shard = trainable_total / n
        # gradients to host and updated 16-bit weights back (ZeRO-Offload, Ren et al. 2021 fig. 2)
        seconds += 2 * shard * 2 / a.host_link_bytes_per_s
        # CPU Adam over this node's ranks' shards, sharing the node's memory bandwidth
        node_bytes = CPU_ADAM_BYTES_PER_PARAM * shard * spec.sharding.processes_per_machine
        seconds += node_bytes / a.host_memory_bytes_per_s
    if ds.offload_param is not OffloadDevice.NONE:
        # ZeRO-Infinity: each rank fetches its parameter shard from host in forward and in backward
        shard = spec.model.total_params / n * spec.precision.load_dtype.nbytes
        seconds += spec.batch.grad_accum * 2 * shard / a.host_link_bytes_per_s
    return seconds


def compute_estimate(
    spec: TrainingSpec,
    assumptions: ComputeAssumptions | None = None,
    *,
    mfu: float | None = None,
    trainable_fn: Callable[[TrainingSpec], int] | None = None,
) -> ComputeEstimate:
    """FLOPs per token and per step, and the step time at an assumed MFU.

    Args:
        spec: The training run.
        assumptions: MFU, peak and bandwidths; defaults cite their sources.
        mfu: Overrides ``assumptions.mfu`` (the ``--mfu`` flag).
        trainable_fn: Trainable-parameter counter (default ``fitcheck.core.states.model_states.trainable_params``),
            used only for partial freezing without PEFT (LoRA adapters come from ``fitcheck.core.states.lora``).

    Returns:
        The compute estimate; times are None when the GPU's peak is unknown (``--gpu_memory`` only, or fp32
        matmuls without autocast, whose peak the GPU table does not carry).
    """
    a = assumptions or ComputeAssumptions()
    if mfu is not None:
        a = replace(a, mfu=mfu)
    shape = spec.model.shape
    split = _param_split(spec)
    attn_fwd = _attention_flops_per_token_forward(spec)
    adapters, trainable_base = _trainable_split(spec, trainable_fn)
    notes: list[str] = []

    model_flops = 6.0 * split.active + 3.0 * attn_fwd  # PaLM appendix B: 6N + 12·L·H·Q·T
    forward = 2.0 * (split.active + adapters) + attn_fwd
    backward_input = 2.0 * (split.active + adapters) + 2.0 * attn_fwd
    backward_weight = 2.0 * (trainable_base + adapters)
    recompute = 0.0
    if spec.activations.checkpointing:
        fraction = 1.0 / max(1, spec.activations.checkpoint_every_n_layers)
        recompute = fraction * (forward - 2.0 * split.lm_head)  # decoder layers re-run; the LM head is not
        notes.append(
            f"gradient checkpointing re-runs {fraction:.0%} of the layers' forward in backward "
            f"(+{recompute / (forward + backward_input + backward_weight):.0%} FLOPs)"
        )
    executed = forward + backward_input + backward_weight + recompute
    if spec.lora is not None or spec.freeze is not None:
        model_flops = executed - recompute  # MFU of a frozen-base run is measured on what it must compute
        notes.append("frozen weights: no weight-gradient matmuls (backward ≈ 2·N_frozen + 4·N_trainable)")
    if spec.quant is not None:
        notes.append(
            f"bitsandbytes {spec.quant.bits}-bit dequantisation work is not modelled: the step is slower "
            "than these FLOPs say"
        )
    if shape.num_experts:
        notes.append(f"MoE: {shape.experts_per_token} of {shape.num_experts} experts active per token")

    n = spec.data_parallel_size
    tokens_per_gpu = spec.batch.micro_batch * spec.batch.seq_len * spec.batch.grad_accum
    tokens_per_step = tokens_per_gpu * n
    flops_per_step = executed * tokens_per_step

    # every trainable tensor (embeddings and all experts too) has a gradient to reduce and a state to update
    peft_or_frozen = spec.lora is not None or spec.freeze is not None
    trainable_total = adapters + trainable_base if peft_or_frozen else float(spec.model.total_params)
    # tp/cp/sp: one data-parallel replica's tokens are shared by tp*cp*sp GPUs; the ZeRO/FSDP traffic is
    # that of one rank's (tensor-parallel-local) states over its shard group (fitcheck.core.parallelism)
    local = rank_local_spec(spec)
    model_parallel = spec.sharding.num_processes // n if local is not spec else 1
    gpu_tokens = tokens_per_gpu / model_parallel
    trainable_local = trainable_total * local.model.total_params / max(1, spec.model.total_params)
    comm_bytes = _comm_bytes_per_gpu(local, trainable_local)
    bw = a.intra_node_bytes_per_s if spec.sharding.num_machines == 1 else a.inter_node_bytes_per_s
    comm_seconds = comm_bytes / bw
    offload_seconds = _offload_seconds(local, trainable_local, a)
    par_bytes, par_group = parallel_comm_bytes(spec)
    per_node = spec.sharding.processes_per_machine
    par_seconds = par_bytes / (a.intra_node_bytes_per_s if par_group <= per_node else a.inter_node_bytes_per_s)
    if par_bytes:
        notes.append(
            f"tensor/context/sequence-parallel collectives {par_bytes / 1e9:.1f} GB per GPU per step "
            f"({par_seconds:.2f} s) on the critical path, not overlapped"
        )

    peak = a.peak_tflops if a.peak_tflops is not None else spec.hardware.peak_tflops_bf16
    if a.peak_tflops is None and _compute_is_fp32(spec):
        peak = None
        notes.append("fp32 matmuls without autocast: the GPU table has no fp32 peak; no time estimate")
    elif peak is None and spec.hardware.device_type is DeviceType.CPU:
        notes.append("CPU run: fitcheck has no CPU peak TFLOP/s table: no time estimate")
    elif peak is None:
        notes.append("GPU peak TFLOP/s unknown (memory given without a GPU name): no time estimate")
    compute_seconds = step_seconds = tokens_per_second = None
    if peak is not None:
        compute_seconds = executed * gpu_tokens / (peak * 1e12 * a.mfu)
        step_seconds = max(compute_seconds, comm_seconds) + offload_seconds + par_seconds
        tokens_per_second = tokens_per_step / step_seconds
    notes.append(
        f"assumes {a.mfu:.0%} of peak on the executed FLOPs; communication overlapped with compute; "
        "offload transfers and the CPU optimizer step not overlapped"
    )
    return ComputeEstimate(
        model_flops_per_token=model_flops,
        flops_per_token=executed,
        flops_per_step=flops_per_step,
        tokens_per_step=tokens_per_step,
        num_gpus=n * model_parallel,
        mfu=a.mfu,
        peak_tflops=peak,
        compute_seconds=compute_seconds,
        comm_seconds=comm_seconds,
        offload_seconds=offload_seconds,
        step_seconds=step_seconds,
        tokens_per_second=tokens_per_second,
        notes=tuple(notes),
        parallel_comm_seconds=par_seconds,
    )


def relative_time_per_token(base: ComputeEstimate, other: ComputeEstimate) -> float:
    """Time to train on the same number of tokens under ``other``, relative to ``base`` (1.0 = same).

    Uses wall time when both have one, else executed FLOPs per token per GPU.

    Args:
        base: The current run.
        other: The changed run.

    Returns:
        The ratio; equal to the ratio of optimizer-step times when the global batch is kept.
    """
    if base.tokens_per_second and other.tokens_per_second:
        return base.tokens_per_second / other.tokens_per_second
    return (other.flops_per_token / other.num_gpus) / (base.flops_per_token / base.num_gpus)
