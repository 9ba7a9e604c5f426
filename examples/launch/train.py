"""A minimal SFT-style training script, launched with `accelerate launch` (or `fitcheck launch`).

Its flags are TrainingArguments fields plus the model and sequence length, parsed by HfArgumentParser, as in
most training scripts. `fitcheck launch --check-only ...` reads the same flags without running it.
Run for real (one tiny step on CPU) with:

    python examples/launch/train.py --model_name_or_path examples/tiny-llama --output_dir /tmp/out \
        --max_steps 1 --per_device_train_batch_size 2 --max_seq_length 64 --use_cpu
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "a directory with config.json (random weights are used)"})
    max_seq_length: int = 64


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, vocab: int, seq: int, n: int = 16) -> None:
        self.data = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main() -> None:
    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = AutoConfig.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_config(config)  # random weights: nothing is downloaded
    data = RandomTokens(config.vocab_size, model_args.max_seq_length)
    Trainer(model=model, args=training_args, train_dataset=data).train()


if __name__ == "__main__":
    main()
