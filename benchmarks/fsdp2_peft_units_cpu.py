"""Which FSDP2 units the REAL ``transformers.Trainer`` gives a peft model (one gloo CPU rank).

transformers 5.23 ``trainer.py`` ``_prepare_for_training`` sets ``delay_optimizer_creation = False`` for FSDP2
(l.1717-1722) and calls ``update_fsdp_plugin_peft`` (peft's ``fsdp_auto_wrap_policy``, which accelerate 1.15's
``fsdp2_prepare_auto_wrap_policy`` cannot apply) only under ``if delay_optimizer_creation`` (l.1751-1754). This runs
one training step of a tiny Llama with LoRA through the real Trainer (``fsdp="full_shard auto_wrap"``,
``fsdp_version`` 1 or 2; accelerate's FSDP state set on the CPU as on a GPU machine:
``gloo_rank.install_fsdp_on_cpu_trainer``) and prints which decoder layers became FSDP units.

``PYTHONPATH=. python benchmarks/fsdp2_peft_units_cpu.py [VERSION]`` prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def units(version: int = 2, activation_checkpointing: bool = False) -> dict[str, Any]:
    """Run the step in this process (a one-rank gloo group) and report the decoder layers' FSDP wrapping
    (``activation_checkpointing``: FSDP's own, ``fsdp_config``, applied by accelerate after the wrap)."""
    from gloo_rank import free_port, install_fsdp_on_cpu_trainer, start_rank

    start_rank(0, 1, int(free_port()))
    warnings.filterwarnings("ignore")
    install_fsdp_on_cpu_trainer()
    import peft
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                       task_type="CAUSAL_LM"))
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=1, use_cpu=True, report_to="none",
        save_strategy="no", logging_strategy="no", disable_tqdm=True, fsdp="full_shard auto_wrap",
        fsdp_config={"fsdp_version": version, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                     "activation_checkpointing": activation_checkpointing})
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    if version == 2:
        from torch.distributed.fsdp import FSDPModule

        layers = [m for n, m in trainer.model.named_modules() if type(m).__name__.endswith("LlamaDecoderLayer")]
        wrapped = [isinstance(m, FSDPModule) for m in layers]
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel

        fsdp = [m for m in trainer.model.modules() if isinstance(m, FullyShardedDataParallel)]
        wrapped = [any(type(c).__name__.endswith("LlamaDecoderLayer") for c in f.children()) for f in fsdp]
        wrapped = [w for w in wrapped if w]
    return {"version": version, "activation_checkpointing": activation_checkpointing,
            "layers": cfg.num_hidden_layers, "layer_units": sum(wrapped),
            "is_fsdp2": bool(trainer.accelerator.is_fsdp2)}


if __name__ == "__main__":
    print(json.dumps(units(int(sys.argv[1]) if len(sys.argv) > 1 else 2, "--ac" in sys.argv)), flush=True)
