"""Real CPU training steps vs the fitcheck estimate (``device_type=cpu``): signed error of the peak.

Each row builds a small but realistic model from a config.json dict with random weights, runs two REAL
training steps on CPU (forward, loss, backward, optimizer step, zero_grad) and measures the live-tensor peak of
the second with the same dispatch-mode recorder the tracer uses (``fitcheck.torch_adapters.tracer_recorder``,
real tensors, storages deduplicated). The estimate is ``fitcheck.core.estimator.estimate(spec)`` for the same
run, built from the same config through ``fitcheck.readers.model_config.inventory_from_config``.

Run: ``PYTHONPATH=. python benchmarks/cpu_truth.py``
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    Dtype,
    FreezeSpec,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    OptimizerSpec,
    PrecisionSpec,
    QuantSpec,
    TrainingSpec,
)

LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 1376,
    "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 8000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
QWEN2: dict[str, Any] = dict(LLAMA, model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True)
GEMMA: dict[str, Any] = {
    "model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 512, "intermediate_size": 1376,
    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 64, "num_hidden_layers": 4,
    "vocab_size": 8000, "hidden_activation": "gelu_pytorch_tanh",
}
MIXTRAL: dict[str, Any] = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 384, "intermediate_size": 768,
    "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": 8000,
    "num_local_experts": 4, "num_experts_per_tok": 2,
}
PHI3: dict[str, Any] = {
    "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 512, "intermediate_size": 1376,
    "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 8000,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class Row:
    """One benchmark configuration."""

    name: str
    config: dict[str, Any]
    seq: int = 256
    batch: int = 2
    dtype: str = "bfloat16"
    mp: str = "no"
    attn: str = "sdpa"
    ckpt: bool = False
    lora: LoraSpec | None = None
    quant: QuantSpec | None = None
    optim: str = "adamw_torch"
    freeze: FreezeSpec | None = None


ALL_LINEAR = LoraSpec(r=16, alpha=32, target_modules=("all-linear",))
TRL_LORA = LoraSpec(r=16, alpha=32, dropout=0.05, target_modules=("all-linear",))  # TRL ModelConfig defaults
NF4_DQ_BF16 = QuantSpec(quant_type="nf4", double_quant=True, compute_dtype=Dtype.BFLOAT16)
NF4_NOPREP = QuantSpec(quant_type="nf4", double_quant=True, compute_dtype=Dtype.BFLOAT16,
                       prepare_for_kbit_training=False)
INT8 = QuantSpec(bits=8)  # BitsAndBytesConfig(load_in_8bit=True): threshold 6.0, int8 weights
# layers 2-3 with the final norm and the head trained; embeddings and layers 0-1 frozen
LAYERS_ONLY = FreezeSpec(trainable=("model.layers.*", "model.norm.weight", "lm_head.weight"), trainable_layers=(2, 3))
ROWS: tuple[Row, ...] = (
    Row("llama bf16 full sdpa", LLAMA),
    Row("llama bf16 full eager ckpt", LLAMA, attn="eager", ckpt=True),
    Row("llama fp32 full sdpa", LLAMA, dtype="float32"),
    Row("llama fp32+autocast full", LLAMA, dtype="float32", mp="bf16"),
    Row("llama bf16 LoRA all-linear", LLAMA, lora=ALL_LINEAR),
    Row("llama bf16 LoRA ckpt", LLAMA, lora=ALL_LINEAR, ckpt=True),
    Row("qwen2 bf16 full sgd", QWEN2, optim="sgd"),
    Row("gemma bf16 full eager", GEMMA, attn="eager"),
    Row("mixtral bf16 full sdpa", MIXTRAL, seq=128),
    Row("phi3 fp32 full ckpt", PHI3, dtype="float32", ckpt=True),
    Row("phi3 bf16 LoRA qv", PHI3, lora=LoraSpec(r=8, target_modules=("qkv_proj",))),
    # QLoRA: real bitsandbytes Linear4bit layers quantized on CPU + peft prepare_model_for_kbit_training
    # (fitcheck/torch_adapters/tracer_quant.py), as TRL's SFTTrainer sets a 4-bit model up
    Row("llama QLoRA nf4 dq bf16 ckpt", LLAMA, mp="bf16", ckpt=True, lora=TRL_LORA, quant=NF4_DQ_BF16),
    Row("qwen2 QLoRA nf4 eager", QWEN2, attn="eager", lora=ALL_LINEAR, quant=QuantSpec(quant_type="nf4")),
    Row("llama QLoRA fp4 qv sdpa", LLAMA, lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj")),
        quant=QuantSpec(quant_type="fp4", compute_dtype=Dtype.BFLOAT16)),
    # issue 10: QLoRA without checkpointing under bf16 autocast (TRL --bf16), SDPA and eager
    Row("llama QLoRA nf4 bf16 autocast", LLAMA, mp="bf16", lora=TRL_LORA, quant=NF4_DQ_BF16),
    Row("qwen2 QLoRA nf4 autocast eager", QWEN2, mp="bf16", attn="eager", lora=TRL_LORA, quant=NF4_DQ_BF16),
    # issue 12 (branch i12place): QLoRA WITHOUT prepare_model_for_kbit_training, as TRL 1.16's SFTTrainer runs it
    # (norms, embeddings and head stay bf16; activations/qlora16.py)
    Row("llama QLoRA nf4 no-prep bf16 ckpt", LLAMA, ckpt=True, lora=TRL_LORA, quant=NF4_NOPREP),
    Row("llama QLoRA nf4 no-prep autocast ckpt", LLAMA, mp="bf16", ckpt=True, lora=TRL_LORA, quant=NF4_NOPREP),
    Row("qwen2 QLoRA nf4 no-prep autocast", QWEN2, mp="bf16", lora=TRL_LORA, quant=NF4_NOPREP),
    # issue 10: partial freezing by layers (--trainable_layers): embeddings trained, or frozen with them
    Row("llama bf16 freeze last layer", LLAMA, freeze=FreezeSpec(trainable=("*",), trainable_layers=(3,))),
    Row("llama bf16 freeze emb frozen", LLAMA, freeze=LAYERS_ONLY),
    Row("llama fp32+ac freeze ckpt", LLAMA, dtype="float32", mp="bf16", ckpt=True, freeze=LAYERS_ONLY),
    # issue 10: LLM.int8 LoRA: real bitsandbytes Linear8bitLt on CPU (MatMul8bitFp, fitcheck/torch_adapters/
    # tracer_int8.py) + peft prepare_model_for_kbit_training, checkpointing off and on, fp32 and bf16 autocast
    Row("llama int8 LoRA", LLAMA, lora=ALL_LINEAR, quant=INT8),
    Row("llama int8 LoRA ckpt", LLAMA, ckpt=True, lora=ALL_LINEAR, quant=INT8),
    Row("llama int8 LoRA bf16 autocast", LLAMA, mp="bf16", lora=TRL_LORA, quant=INT8),
    Row("llama int8 LoRA autocast ckpt", LLAMA, mp="bf16", ckpt=True, lora=TRL_LORA, quant=INT8),
)


def spec_for(row: Row) -> TrainingSpec:
    """The TrainingSpec describing a row's run."""
    from fitcheck.readers import inventory_from_config

    inv = inventory_from_config(row.config, row.name, "benchmarks/cpu_truth.py")
    return TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype(row.dtype), MixedPrecision(row.mp)),
        optimizer=OptimizerSpec(row.optim),
        batch=BatchSpec(micro_batch=row.batch, seq_len=row.seq),
        activations=ActivationSpec(checkpointing=row.ckpt, attn_implementation=AttnImpl(row.attn)),
        hardware=HardwareSpec(device_type=DeviceType.CPU),
        lora=row.lora,
        quant=row.quant,
        freeze=row.freeze,
    )


def measure(row: Row) -> tuple[int, int, str, str]:
    """(real peak, estimated peak, real peak phase, estimated peak phase) of one row."""
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import trace_step

    real = trace_step(
        row.config, seq_len=row.seq, micro_batch=row.batch, dtype=row.dtype, mixed_precision=row.mp,
        attn_implementation=row.attn, checkpointing=row.ckpt, lora=row.lora, quant=row.quant,
        optimizer=row.optim, fake=False, freeze=row.freeze,
    )
    report = estimate(spec_for(row))
    return real.peak, report.peak_allocated_bytes, real.peak_phase.value, report.peak_phase.value


def main(argv: list[str]) -> int:
    """Print the table; exit 1 when a row is off by more than 2 %."""
    rows = [r for r in ROWS if not argv or any(a in r.name for a in argv)]
    print(f"{'config':32} {'real MiB':>10} {'est MiB':>10} {'error':>8}  real phase / est phase")
    worst = 0.0
    for row in rows:
        real, est, rp, ep = measure(row)
        err = (est - real) / real * 100
        worst = max(worst, abs(err))
        print(f"{row.name:32} {real / 2**20:10.2f} {est / 2**20:10.2f} {err:+7.2f}%  {rp} / {ep}")
    print(f"worst |error| {worst:.2f}%")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
