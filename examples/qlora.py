"""QLoRA with fitcheck: check the real-size run before anything loads, then train a tiny 4-bit model on CPU.

    python examples/qlora.py

1. `preflight` on Llama-3.1-8B (config from fitcheck's offline catalog) with the same LoraConfig and
   BitsAndBytesConfig objects the script uses, for a 24 GB GPU: nothing is loaded or downloaded.
2. The same setup on the tiny config in `examples/tiny-llama`: random weights are saved to a temporary
   directory and loaded back in 4-bit through bitsandbytes (which runs on CPU), wrapped with peft, and trained
   for two steps with `FitcheckCallback` — which reads the 4-bit layers and LoRA adapters from the loaded
   model itself and compares its prediction with the measured live-tensor peak.
"""

from __future__ import annotations

import os
import tempfile

import torch
from _tiny import SEQ, TINY_LLAMA, RandomTokens  # examples/_tiny.py: tiny config, random data
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

from fitcheck import FitcheckCallback, preflight


def main() -> None:
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    out = tempfile.mkdtemp(prefix="fitcheck-qlora-")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=2, bf16=True,
                             gradient_checkpointing=True, optim="adamw_torch", use_cpu=True, report_to="none",
                             save_strategy="no", logging_strategy="no")

    # 1. The real run, checked before anything is loaded.
    big = preflight("meta-llama/Llama-3.1-8B", args, peft_config=lora, quantization_config=bnb,
                    gpu="RTX4090-24GB", max_seq_length=2048)
    print(f"Llama-3.1-8B QLoRA on RTX4090-24GB at seq 2048: {'fits' if big.fits else 'does NOT fit'}, "
          f"{big.device_used_bytes / 2**30:.2f} GiB of {big.budget_bytes / 2**30:.2f} GiB; "
          f"{big.trainable_params:,} trainable parameters")

    # 2. The same setup, tiny, for real on CPU.
    config = AutoConfig.from_pretrained(TINY_LLAMA)
    weights = os.path.join(out, "tiny-llama-random")
    AutoModelForCausalLM.from_config(config).save_pretrained(weights)
    model = AutoModelForCausalLM.from_pretrained(weights, quantization_config=bnb, dtype=torch.bfloat16,
                                                 device_map="cpu")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    model = get_peft_model(model, lora)
    callback = FitcheckCallback(max_seq_length=SEQ, record_path=os.environ.get("FITCHECK_RECORD"))
    Trainer(model=model, args=args, train_dataset=RandomTokens(config.vocab_size), callbacks=[callback]).train()


if __name__ == "__main__":
    main()
