"""Reserved bytes of the whole-run replay with gradient accumulation composed (issue 19) vs one pass per step.

``allocator_whole_run.replay_whole_run`` composes ``gradient_accumulation_steps`` forward and backward passes per
optimizer step (``allocator_compose.whole_run``: from the second pass on each gradient is allocated, added into
``.grad`` in place and freed, torch 2.13 ``accumulate_grad.h``). Before session 11 it composed one pass per step
whatever the accumulation: the same as the spec with ``grad_accum=1``, the ``one pass`` column here. CPU only (fake
tensors); no measurement: the GPU data files have no accumulating row.

    PYTHONPATH=.:benchmarks python benchmarks/accumulation_replay.py [--gpu H100-80GB]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings

from gpu_truth import parse_values

MODEL = "meta-llama/Llama-3.2-1B"
RUNS = {
    "bf16 full fused 4x1024": "--dtype bfloat16 --per_device_train_batch_size 4 --max_seq_length 1024",
    "bf16 LoRA ckpt 4x1024": ("--dtype bfloat16 --use_peft --lora_r 16 --lora_target_modules all-linear "
                              "--gradient_checkpointing --per_device_train_batch_size 4 --max_seq_length 1024"),
}
MIB = 2**20


def main() -> None:
    """Print one row per run and accumulation: peak allocated and reserved (MiB) and the gap fraction
    (``StepReplay.gap_fraction``, what the estimate applies), one pass per step vs composed."""
    from fitcheck.cli import spec_from_values
    from fitcheck.torch_adapters import replay_whole_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--accum", default="1,2,4", help="gradient_accumulation_steps values")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"{'run':26} {'ga':>3} {'alloc 1 pass':>13} {'alloc ga':>10} {'reserved 1 pass':>16} {'reserved ga':>12} "
          f"{'moved':>8} {'gap 1 pass':>10} {'gap ga':>7} {'s':>5}")
    traces: dict[str, object] = {}
    for name, flags in RUNS.items():
        for ga in (int(k) for k in args.accum.split(",")):
            values = parse_values(["--model_name_or_path", MODEL, *flags.split(), "--gpu", args.gpu,
                                   "--gradient_accumulation_steps", str(ga)])
            spec, _ = spec_from_values(values, {})
            start = time.perf_counter()
            one = replay_whole_run(dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, grad_accum=1)),
                                   optimizer_traces=traces)  # type: ignore[arg-type]
            acc = replay_whole_run(spec, optimizer_traces=traces)  # type: ignore[arg-type]
            moved = (acc.peak_reserved - one.peak_reserved) / one.peak_reserved * 100
            print(f"{name:26} {ga:>3} {one.peak_allocated / MIB:>13.0f} {acc.peak_allocated / MIB:>10.0f} "
                  f"{one.peak_reserved / MIB:>16.0f} {acc.peak_reserved / MIB:>12.0f} {moved:>+7.2f}% "
                  f"{one.gap_fraction:>10.3f} {acc.gap_fraction:>7.3f} {time.perf_counter() - start:>5.1f}", flush=True)


if __name__ == "__main__":
    main()
