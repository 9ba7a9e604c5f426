"""accelerate's fp32 upcast of trainable low-precision parameters under FSDP mixed precision.

Sources (the installed versions):

* accelerate 1.15 ``utils/fsdp_utils.py`` ``fsdp2_prepare_model`` (FSDP2): ``if accelerator.mixed_precision !=
  "no" and not model_has_params4bit``, every parameter with ``requires_grad and param.dtype != torch.float32``
  gets ``param.data = param.data.to(torch.float32)`` before ``fully_shard`` ("FSDP2 requires uniform orig_dtype
  among trainable params in each group. Upcast to fp32 master weights; MixedPrecisionPolicy.param_dtype handles
  compute cast"). ``model_has_params4bit`` is True when any parameter's class is bitsandbytes ``Params4bit``.
* accelerate 1.15 ``accelerator.py`` ``prepare_model`` (FSDP1): after ``FSDP(model, ...)``, ``if
  self.mixed_precision != "no"``, every FSDP module's ``_flat_param`` with ``dtype != torch.float32`` and
  ``requires_grad`` is upcast the same way ("we follow DeepSpeed's strategy to hold the parameters in full
  precision"); ``_orig_param_dtype`` becomes fp32, so FSDP's sharded gradients are fp32 too. A flat parameter
  requires grad when any of its original parameters does (torch 2.13 ``distributed/fsdp/_flat_param.py``,
  ``use_orig_params=True``). The FSDP1 path has no ``Params4bit`` check; a 4-bit base under FSDP1 is left as
  the FSDP-QLoRA modelling has it (its LoRA adapters are fp32 already, peft ``autocast_adapter_dtype=True``).

So a bf16-loaded model trained under FSDP + ``--bf16`` holds fp32 trainable shards, fp32 gradients and fp32
optimizer states: the same model states as the fp32-loaded model. Frozen parameters keep their loaded dtype
(FSDP2 upcasts only ``requires_grad`` parameters; frozen FSDP1 units have ``requires_grad=False`` flat
parameters). Not modelled: an FSDP1 unit that mixes frozen and trainable parameters (partial freezing) upcasts
its frozen parameters as well. Pinned against the real ``Accelerator.prepare`` on 2 gloo ranks on CPU
(``tests/test_fsdp_upcast.py``).
"""

from __future__ import annotations

from fitcheck.spec import MixedPrecision, Strategy, TrainingSpec

SOURCE = (
    "accelerate 1.15 utils/fsdp_utils.py fsdp2_prepare_model / accelerator.py prepare_model: trainable "
    "low-precision params upcast to fp32 when mixed_precision != 'no' and no Params4bit"
)


def has_params4bit(spec: TrainingSpec) -> bool:
    """Whether the loaded model holds bitsandbytes ``Params4bit`` parameters (on-load or pre-quantized 4-bit).

    Args:
        spec: The training spec.

    Returns:
        True for a bitsandbytes 4-bit base.
    """
    q = spec.quant
    return q is not None and q.method == "bitsandbytes" and q.bits == 4


def fsdp_fp32_upcast(spec: TrainingSpec) -> bool:
    """Whether accelerate upcasts this run's trainable low-precision parameters to fp32 before step 1.

    Args:
        spec: The training spec.

    Returns:
        True under FSDP (1 or 2) with ``mixed_precision`` bf16/fp16 and no 4-bit bitsandbytes parameters.
    """
    return (
        spec.sharding.strategy is Strategy.FSDP
        and spec.precision.mixed_precision is not MixedPrecision.NO
        and not has_params4bit(spec)
    )
