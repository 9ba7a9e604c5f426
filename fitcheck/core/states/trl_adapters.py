"""TRL's bf16 cast of the trainable parameters of a bitsandbytes-quantized model; pure (branch i12place).

TRL 1.16 (``trl/trainer/sft_trainer.py``, and the same block in ``dpo_trainer.py``, ``grpo_trainer.py``,
``reward_trainer.py``): after ``get_peft_model``, ``if _is_quantized_model:`` (``is_loaded_in_4bit`` or
``is_loaded_in_8bit``: bitsandbytes only) every parameter with ``requires_grad`` except DoRA's
``lora_magnitude_vector`` gets ``param.data = param.data.to(torch.bfloat16)``, "to follow the recommendations from
the original paper" (QLoRA). So the adapters (and ``modules_to_save`` copies), their gradients and torch AdamW's
states (allocated ``zeros_like`` the parameter) are bf16, not peft's fp32; under bf16 autocast their casts are
no-ops (nothing is cached for backward).
"""

from __future__ import annotations

from fitcheck.spec import TrainerKind, TrainingSpec


def trl_bf16_trainables(spec: TrainingSpec) -> bool:
    """Whether a TRL trainer casts the trainable parameters of this (bitsandbytes-quantized, PEFT) run to bf16."""
    quant = spec.quant
    return (
        spec.trainer.kind is not TrainerKind.TRAINER
        and quant is not None
        and quant.method == "bitsandbytes"
        and not quant.pre_quantized
        and spec.lora is not None
    )
