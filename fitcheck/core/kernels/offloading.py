"""Activation offloading, reentrant checkpointing, torch.compile and Liger coverage: bytes and findings (pure).

* Activation offloading (TRL 1.16 ``SFTConfig.activation_offloading`` -> trl/models/activation_offloading.py
  ``get_act_offloading_ctx_manager``, entered around the whole ``SFTTrainer.training_step``): a
  ``saved_tensors_hooks`` pack hook copies every saved tensor of at least ``min_offload_size`` = 1024 bytes that
  is on the accelerator and is no parameter into pinned host memory; the LM head runs under a ``NoOpManager``
  (its saved input stays). With ``use_streams=True`` the last ``max_fwd_stash_size`` = 5 offloaded tensors stay on
  the device until their copy event is waited on; backward brings each tensor back when its node runs. Tensors
  not on the accelerator are kept as they are, so on CPU nothing moves.
* ``use_reentrant`` (``gradient_checkpointing_kwargs``): torch/utils/checkpoint.py ``CheckpointFunction`` saves
  the layer inputs with ``ctx.save_for_backward``; the non-reentrant default saves them through
  ``_NoopSaveInputs``: the same tensors. Real CPU steps of a 4-layer Llama (``benchmarks/levers_cpu.py``) give
  identical end-of-forward, start-of-backward and optimizer-step bytes; the recomputed layer's working set
  differs by less than one hidden-sized tensor (+0.5 MB full, -0.3 MB LoRA of a 172 MB step).
* ``torch_compile``: inductor's fusion and partitioner decide what is saved; not modelled (a warning says so).
"""

from __future__ import annotations

from fitcheck.core.kernels.liger import LIGER_VERSION
from fitcheck.findings import Finding, Severity
from fitcheck.spec import DeviceType, TrainingSpec

OFFLOAD_STASH_TENSORS = 5  # trl OffloadActivations max_fwd_stash_size default (activation_offloading.py)


def offload_applies(spec: TrainingSpec) -> bool:
    """TRL activation offloading moves saved tensors off a CUDA device (nothing moves on CPU)."""
    return spec.activations.offload_activations and spec.hardware.device_type is DeviceType.CUDA


def offload_split(spec: TrainingSpec, kept: int, head_input: int, act_bytes: int) -> tuple[int, int]:
    """(bytes left on the device, bytes in pinned host memory) of the activations saved at the end of forward.

    Args:
        spec: The training spec.
        kept: Saved activation bytes at the end of forward (device, without offloading).
        head_input: Of those, what the LM head saved (run under TRL's ``NoOpManager``: not offloaded).
        act_bytes: Element bytes of matmul outputs.

    Returns:
        Device bytes (the head input + the forward stash of the last five offloaded tensors, each at most one
        ``b x s x max(h, I)`` activation) and host bytes (the rest).
    """
    sh = spec.model.shape
    b, s = spec.batch.micro_batch, spec.batch.seq_len
    widest = max(sh.hidden_size, sh.intermediate_size * max(1, sh.experts_per_token))
    stash = OFFLOAD_STASH_TENSORS * b * s * widest * act_bytes
    device = min(kept, head_input + stash)
    return device, kept - device


def lever_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """What the user should know about the kernel/offload/compile levers they turned on."""
    act = spec.activations
    out: list[Finding] = []
    fam = spec.model.shape.family
    if act.liger is not None and not spec.model.shape.traits.liger_patched:
        out.append(Finding(
            "liger-not-applied", Severity.INFO,
            f"use_liger_kernel: liger_kernel {LIGER_VERSION} has no patch for model_type {fam!r} "
            "(_apply_liger_kernel_to_instance logs and applies nothing): the estimate is without Liger",
        ))
    elif act.liger is not None and spec.model.shape.num_experts and act.liger.swiglu:
        out.append(Finding(
            "not-modelled", Severity.WARNING,
            "use_liger_kernel: Liger's fused-MoE experts kernel (LigerExperts) is not modelled; the experts' "
            "saved tensors are those of transformers' experts",
            "pass --liger_kernel_config '{\"swiglu\": false}' for a modelled run, or measure with FitcheckCallback",
        ))
    if act.torch_compile:
        out.append(Finding(
            "not-modelled", Severity.WARNING,
            "torch_compile: inductor's fusions decide which tensors are saved for backward (usually fewer than "
            "eager); the estimate is for eager mode, an upper bound for the activations",
            "measure the compiled run with FitcheckCallback (predicted vs measured peak)",
        ))
    if act.use_reentrant and act.checkpointing:
        out.append(Finding(
            "reentrant-checkpointing", Severity.INFO,
            "use_reentrant=True saves the same layer inputs as the non-reentrant default (real CPU steps: equal "
            "to the byte outside the recomputed layer's working set); the recomputed layer keeps its whole graph "
            "until its backward ends, which moves the worst moment during backward (traces at real width: -6.7 % to "
            "+9.9 % of the activations against the formula): not pinned, traced where torch is installed",
        ))
    if act.offload_activations:
        if spec.hardware.device_type is DeviceType.CPU:
            out.append(Finding(
                "activation-offloading-cpu", Severity.INFO,
                "activation_offloading moves saved tensors off an accelerator only (trl OffloadActivations "
                "keeps tensors not on the accelerator): on CPU nothing moves",
            ))
        else:
            out.append(Finding(
                "activations-not-pinned", Severity.INFO,
                "activation_offloading: saved activations are counted in pinned host memory, the device keeps "
                "the LM head input and a stash of five tensors (trl 1.16 source; CUDA streams, not traceable "
                "on CPU)",
                "pass --host_memory to check the host side",
            ))
    return tuple(out)
