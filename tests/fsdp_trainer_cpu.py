"""A real ``transformers.Trainer`` under accelerate's FSDP2 on the CPU, for tests/test_tuner_fsdp.py (run as a script).

accelerate 1.15 turns FSDP on only for GPU-type backends (state.py: the FSDP branch sits under MULTI_GPU/...);
on CPU a Trainer given ``fsdp=`` trains under DDP. This script sets what ``AcceleratorState.__init__`` sets on a
GPU machine — ``distributed_type = FSDP``, the plugin with ``set_mixed_precision`` — on a one-process gloo group,
as benchmarks/fsdp_upcast_cpu.py does; everything else is the real code: the Trainer's ``_prepare_for_training``,
``fsdp2_prepare_model`` (upcast, ``fully_shard`` on the CPU mesh), ``training_step``, the optimizer, ``train()``.

``python tests/fsdp_trainer_cpu.py MODE PORT [MICRO]``: MODE ``tuned`` (per-GPU batch 8 × 1, tune_micro_batch
under ``FITCHECK_TEST_BUDGET`` of CPU memory, then train) or ``plain`` (MICRO × 8/MICRO directly, then train).
``FITCHECK_TEST_OOM_AT=N`` raises a CUDA-style out-of-memory error inside layer 1's forward
(``FITCHECK_TEST_OOM_IN=forward``) or layer 0's backward for batches of N or more: what a real OOM does to FSDP2
mid-step. Prints one JSON line: the tuning trials, the batch trained, the trained weights' SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any


def main(mode: str, port: str, micro: int) -> dict[str, Any]:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from torch.distributed.tensor import DTensor

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.gloo_rank import install_fsdp_on_cpu_trainer

    install_fsdp_on_cpu_trainer()
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=256,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.use_cache = False
    ids = torch.randint(0, 256, (32, 32), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": r, "labels": r} for r in ids]
    version = int(os.environ.get("FITCHECK_TEST_FSDP_VERSION", "2"))
    # FSDP1's sync_module_states (transformers' default True) asks accelerate for an accelerator device
    # (accelerate 1.15 utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__); one rank needs no sync
    fsdp1 = {"sync_module_states": False} if version == 1 else {}
    fsdp1.update(json.loads(os.environ.get("FITCHECK_TEST_FSDP_CONFIG", "{}")))  # e.g. {"use_orig_params": false}
    args = transformers.TrainingArguments(
        output_dir=os.environ.get("FITCHECK_TEST_OUT", "/tmp/fitcheck-fsdp-cpu"),
        per_device_train_batch_size=8 if mode == "tuned" else micro,
        gradient_accumulation_steps=1 if mode == "tuned" else 8 // micro, max_steps=2, bf16=True, use_cpu=True,
        fsdp="full_shard auto_wrap",
        fsdp_config={"fsdp_version": version,
                     "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], **fsdp1},
        optim="adamw_torch", save_strategy="no", report_to="none", logging_strategy="no", disable_tqdm=True,
        seed=0, data_seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    out: dict[str, Any] = {"fsdp_enabled": bool(trainer.is_fsdp_enabled)}
    oom_at = int(os.environ.get("FITCHECK_TEST_OOM_AT", "0") or 0)
    if oom_at:
        def raise_oom(t: Any) -> None:
            if t.shape[0] >= oom_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (test)")

        if os.environ.get("FITCHECK_TEST_OOM_IN") == "forward":
            trainer.model.model.layers[1].mlp.register_forward_hook(lambda m, i, o: raise_oom(o))
        else:
            trainer.model.model.layers[0].mlp.register_full_backward_hook(lambda m, gi, go: raise_oom(go[0]))
    if mode == "tuned":
        from fitcheck.integrations import tune_micro_batch

        result = tune_micro_batch(trainer, max_seq_length=32, device_type="cpu",
                                  gpu_memory=os.environ.get("FITCHECK_TEST_BUDGET", "8GiB"))
        out["trials"] = [[t.micro_batch, t.fits, t.peak_bytes] for t in result.trials]
    out["accelerate_num_steps"] = trainer.accelerator.gradient_accumulation_steps
    trainer.train()
    h = hashlib.sha256()
    for name, p in sorted(trainer.model.named_parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(name.encode())
        h.update(full.detach().float().numpy().tobytes())
    out.update(batch=[args.per_device_train_batch_size, args.gradient_accumulation_steps],
               dtypes=sorted({str(p.dtype) for p in trainer.model.parameters()}), sha=h.hexdigest())
    import torch.distributed as dist

    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    res = main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)
    print("FSDP_CPU_RESULT " + json.dumps(res), flush=True)
    sys.stdout.flush()
    os._exit(0)
