"""Model states per GPU: weights (trainable, frozen, quantized), adapters, gradients, optimizer states, masters.

- :mod:`.lora`: which modules PEFT wraps and the adapter tensors it adds;
- :mod:`.quantization`: bitsandbytes 4-/8-bit bytes and which layers stay unquantized;
- :mod:`.prequant` / :mod:`.mxfp4`: pre-quantized checkpoints (GPTQ, AWQ, FP8, MXFP4): bytes, layers, load;
- :mod:`.layout`: every parameter tensor with its dtype, trainability and optimizer group;
- :mod:`.sharding`: how DDP / ZeRO / FSDP divide each kind of state, and the communication buffers;
  :mod:`.sharding_findings`: what the user should know about the sharding setup; :mod:`.fsdp2_units`: the
  units accelerate gives FSDP2 and what each keeps gathered (:mod:`.fsdp_backward`: what a rank holds at
  backward's moments); :mod:`.fsdp_streams`: what FSDP's side CUDA
  streams keep reserved beside the step (:mod:`.deepspeed_streams`: DeepSpeed's); :mod:`.fsdp_qlora`: FSDP over
  a 4-bit base (quant storage, replicated quantization state, loading);
  :mod:`.zero3_quant`: DeepSpeed ZeRO-3 over a bitsandbytes base (what it partitions, what stays whole);
- :mod:`.peft_adapter`: a PEFT adapter other than LoRA, its tensors as peft built them (or refused without them);
- :mod:`.regimes`: which precision regime applies (bf16 pure, autocast, DeepSpeed masters) and its findings;
- :mod:`.zero_reduce`: ZeRO-1/2's flat groups, a rank's gradient partition, ZeRO-1's end-of-backward reduction; what
  ZeRO-2's gradients hold at backward's moments (``zero2_backward_grads``);
- :mod:`.accumulation`: whether a later micro-step of gradient accumulation adds into the ``.grad`` it holds
  (``accumulates_in_grad``, the one rule the backward moments and the traced path read) and whether its gradients
  exist from its start (``gradients_held_from_start``);
- :mod:`.model_states`: the components the report shows.

Where a new quantization scheme or adapter type goes: its bytes in :mod:`.quantization` / :mod:`.lora` (or a
new module here), read by :mod:`.layout`.
"""

from fitcheck.core.states.accumulation import accumulates_in_grad, gradients_held_from_start
from fitcheck.core.states.deepspeed_offload import (
    gradients_never_on_device,
    offload_components,
    offload_grad_norm_component,
    offload_gradient_in_flight,
)
from fitcheck.core.states.deepspeed_streams import deepspeed_side_pools
from fitcheck.core.states.fsdp2_units import fsdp_backward_applies
from fitcheck.core.states.fsdp_backward import FsdpBackward, fsdp_backward_held
from fitcheck.core.states.fsdp_qlora import LoadPeak, fsdp_qlora_findings, load_peak
from fitcheck.core.states.fsdp_streams import SidePools, fsdp_side_pools
from fitcheck.core.states.fsdp_upcast import fsdp_fp32_upcast, has_params4bit
from fitcheck.core.states.layout import Layout, all_trainable, build_layout, optimizer_for, trainable_params
from fitcheck.core.states.lora import LoraPlan, adapter_param_count, plan_lora
from fitcheck.core.states.model_states import model_state_components
from fitcheck.core.states.mxfp4 import mxfp4_findings, mxfp4_load_spike, mxfp4_packed_bytes
from fitcheck.core.states.peft_adapter import check_peft_adapter, peft_adapter_findings, peft_adapter_params
from fitcheck.core.states.prequant_step import prequant_components, prequant_findings
from fitcheck.core.states.quantization import base_weights, bytes_per_param, is_quantized, quantized_bytes
from fitcheck.core.states.regimes import describe_regime, model_state_findings
from fitcheck.core.states.sharding import (
    Partition,
    buffer_components,
    fsdp_unit_params,
    param_compute_bytes,
    partition,
    zero3_gradient_in_flight,
)
from fitcheck.core.states.sharding_findings import sharding_findings
from fitcheck.core.states.trl_adapters import (
    ENTROPY_CHUNK_TOKENS,
    MODELLED_TRL,
    SFT_PADDING_FREE_FROM,
    DpoLoss,
    SftLoss,
    SftMetrics,
    TrlLoadDtype,
    dpo_loss,
    dpo_release_modelled,
    reference_loads_by_name,
    reward_step_modelled,
    sft_config_defaults,
    sft_loss,
    sft_metrics,
    sft_runs_trainer_step,
    trl_bf16_trainables,
    trl_config_defaults,
    trl_load_dtype,
    trl_module_cast,
    trl_prepares_kbit,
    trl_release,
    trl_release_modelled,
)
from fitcheck.core.states.zero_reduce import (
    aligned,
    backward_moment_component,
    held_elements,
    in_partition,
    named_order,
    partition_size,
    zero1_reduction_component,
    zero2_backward_grads,
    zero_groups,
)

__all__ = [
    "ENTROPY_CHUNK_TOKENS",
    "MODELLED_TRL",
    "SFT_PADDING_FREE_FROM",
    "DpoLoss",
    "FsdpBackward",
    "Layout",
    "LoadPeak",
    "LoraPlan",
    "Partition",
    "SftLoss",
    "SftMetrics",
    "SidePools",
    "TrlLoadDtype",
    "accumulates_in_grad",
    "adapter_param_count",
    "aligned",
    "all_trainable",
    "backward_moment_component",
    "base_weights",
    "buffer_components",
    "build_layout",
    "bytes_per_param",
    "check_peft_adapter",
    "deepspeed_side_pools",
    "describe_regime",
    "dpo_loss",
    "dpo_release_modelled",
    "fsdp_backward_applies",
    "fsdp_backward_held",
    "fsdp_fp32_upcast",
    "fsdp_qlora_findings",
    "fsdp_side_pools",
    "fsdp_unit_params",
    "gradients_held_from_start",
    "gradients_never_on_device",
    "has_params4bit",
    "held_elements",
    "in_partition",
    "is_quantized",
    "load_peak",
    "model_state_components",
    "model_state_findings",
    "mxfp4_findings",
    "mxfp4_load_spike",
    "mxfp4_packed_bytes",
    "named_order",
    "offload_components",
    "offload_grad_norm_component",
    "offload_gradient_in_flight",
    "optimizer_for",
    "param_compute_bytes",
    "partition",
    "partition_size",
    "peft_adapter_findings",
    "peft_adapter_params",
    "plan_lora",
    "prequant_components",
    "prequant_findings",
    "quantized_bytes",
    "reference_loads_by_name",
    "reward_step_modelled",
    "sft_config_defaults",
    "sft_loss",
    "sft_metrics",
    "sft_runs_trainer_step",
    "sharding_findings",
    "trainable_params",
    "trl_bf16_trainables",
    "trl_config_defaults",
    "trl_load_dtype",
    "trl_module_cast",
    "trl_prepares_kbit",
    "trl_release",
    "trl_release_modelled",
    "zero1_reduction_component",
    "zero2_backward_grads",
    "zero3_gradient_in_flight",
    "zero_groups",
]
