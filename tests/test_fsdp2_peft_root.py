"""FSDP2 + peft under the Trainer: every decoder layer keeps its own unit (accelerate's ``transformer_based_wrap``).

transformers 5.23 ``trainer.py`` ``_prepare_for_training`` sets ``delay_optimizer_creation = False`` for FSDP2
(l.1717-1722) and calls ``distributed/fsdp.py`` ``update_fsdp_plugin_peft`` only under ``if delay_optimizer_creation``
(l.1751-1754). That policy (peft's ``_or_policy`` partial) is one accelerate 1.15 ``fsdp2_prepare_auto_wrap_policy``
cannot apply (it would leave every layer in the root), but the Trainer's FSDP2 run never installs it. Checked here:
the libraries' policy lookup, the Trainer's source, a REAL Trainer step on a gloo CPU rank
(``benchmarks/fsdp2_peft_units_cpu.py``, with FSDP2's own activation checkpointing too), and fitcheck's answers.
Measured on an H200 (``benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json``): the Trainer's FSDP2 Mistral-7B LoRA step
holds one gathered group beyond the plain run, not the 13.5 GiB of layers a root gather would.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_peft_policy_would_give_no_layer_units_but_the_trainers_fsdp2_never_sets_it() -> None:
    import peft
    import torch
    import transformers
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from deepspeed_run_events_cpu import CONFIG
    from transformers.distributed.fsdp import update_fsdp_plugin_peft


    cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16),
                                peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    assert fsdp2_prepare_auto_wrap_policy(plugin, model) is not None  # accelerate's own: one unit per layer
    update_fsdp_plugin_peft(model, SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)))
    assert fsdp2_prepare_auto_wrap_policy(plugin, model) is None  # what a script calling it would get
    source = inspect.getsource(transformers.Trainer._prepare_for_training)
    fsdp2_off = source.index("delay_optimizer_creation = False")
    guard = source.index("if delay_optimizer_creation:\n")
    assert fsdp2_off < guard < source.index("update_fsdp_plugin_peft(self.model, self.accelerator)")
    assert source.count("update_fsdp_plugin_peft(") == 1


def test_a_real_trainer_step_keeps_a_unit_per_layer_with_fsdp2_checkpointing() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fsdp2_peft_units_cpu.py"), "2", "--ac"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{\"version\"")]
    assert line, proc.stderr[-2000:]
    got = json.loads(line[-1])
    assert got["is_fsdp2"] and got["activation_checkpointing"] and got["layer_units"] == got["layers"] == 2


def _estimate(*extra: str) -> dict[str, Any]:
    from fitcheck.cli.main import main

    argv = ["estimate", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--dtype", "bfloat16", "--bf16", "--gpu",
            "H100-80GB", "--num_processes", "4", "--fsdp", "full_shard auto_wrap", "--per_device_train_batch_size",
            "8", "--max_seq_length", "4096", "--use_peft", "--lora_r", "16", "--gradient_checkpointing",
            "--no_trace", "--json", *extra]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return dict(json.loads(out.getvalue()))


def test_llama8b_lora_fsdp2_gathers_layer_units_not_the_whole_model() -> None:
    from fitcheck.catalog import find_catalog_config

    doc = _estimate()
    assert not [f for f in doc["findings"] if "root-gathers" in f["code"]]
    found = find_catalog_config("meta-llama/Llama-3.1-8B")
    assert found is not None
    h, i, v = found[0]["hidden_size"], found[0]["intermediate_size"], found[0]["vocab_size"]
    kv = h // found[0]["num_attention_heads"] * found[0]["num_key_value_heads"]
    layer = (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) * 2  # bf16 q/o, k/v, MLP, norms
    # two layer units in backward (one computed, one prefetched), or the tail (LM head) twice at the end of forward
    assert doc["components"]["buffers.fsdp_unsharded_params"] <= max(2 * layer, 2 * v * h * 2) + 2**20
    assert doc["fits"] is True


def test_fsdp2_activation_checkpointing_on_a_peft_model_is_estimated(tmp_path: Path) -> None:
    """accelerate 1.15 ``fsdp2_apply_ac`` applies the Trainer's own (transformer-based) policy: it runs (the real step
    above), so fitcheck estimates it."""
    from fitcheck.cli.main import main

    cfg = tmp_path / "fsdp2.json"
    cfg.write_text(json.dumps({"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                               "fsdp_activation_checkpointing": True}), encoding="utf-8")
    argv = ["estimate", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--dtype", "bfloat16", "--bf16", "--gpu",
            "H100-80GB", "--num_processes", "4", "--fsdp", "full_shard", "--fsdp_config", str(cfg),
            "--per_device_train_batch_size", "1", "--max_seq_length", "1024", "--no_trace", "--json"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--use_peft"]) in (0, 1)
        assert main(argv) in (0, 1)
