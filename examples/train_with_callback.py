"""Train a tiny Llama for two steps on CPU with fitcheck's Trainer callback.

    python examples/train_with_callback.py [--record /tmp/fitcheck_record.json]

`preflight(...)` runs before `Trainer(...)`: for single-GPU and DDP runs the Trainer moves the weights to the
GPU inside its constructor, so that is the only place a weight OOM can be prevented. `FitcheckCallback`
then reads the loaded model at `on_init_end`, prints the report, and after the optimizer steps prints the
predicted peak next to the measured one (on CPU: live tensors; on CUDA: torch.cuda.max_memory_allocated),
writing both to the record file. The model is built from `examples/tiny-llama/config.json` with random
weights: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import tempfile

from _tiny import SEQ, TINY_LLAMA, RandomTokens  # examples/_tiny.py: tiny config, random data
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

from fitcheck import FitcheckCallback, preflight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", default=None, help="write predicted vs measured peak memory here (JSON)")
    cli = parser.parse_args()
    config = AutoConfig.from_pretrained(TINY_LLAMA)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="fitcheck-example-"),
        per_device_train_batch_size=2,
        max_steps=2,
        optim="adamw_torch",
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
    )
    # 1. Before the Trainer exists (and before the weights move to a GPU).
    report = preflight(config, args, max_seq_length=SEQ, device_type="cpu", gpu_memory="16GiB")
    print(f"preflight: {'fits' if report.fits else 'does NOT fit'} "
          f"({report.peak_allocated_bytes / 2**20:.1f} MiB peak allocated)")
    # 2. The callback reads the loaded model itself, and measures the first optimizer steps.
    model = AutoModelForCausalLM.from_config(config)
    callback = FitcheckCallback(max_seq_length=SEQ, record_path=cli.record)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(config.vocab_size), callbacks=[callback])
    trainer.train()


if __name__ == "__main__":
    main()
