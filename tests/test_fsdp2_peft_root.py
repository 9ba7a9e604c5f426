"""FSDP2 + peft under the Trainer: no decoder layer gets a unit of its own, so the root gathers every layer.

transformers 5.23 ``trainer.py`` (l.1753) calls ``distributed/fsdp.py`` ``update_fsdp_plugin_peft`` for a peft model
under FSDP; the policy it sets (peft's ``_or_policy`` partial) is one accelerate 1.15 ``fsdp_utils.py``
``fsdp2_prepare_auto_wrap_policy`` does not know, so ``fsdp2_prepare_model`` wraps no layer. Checked here: the real
libraries' policy lookup (a tiny peft model, no process spawned), the REAL runs recorded by
``benchmarks/fsdp2_run_events_cpu.py --write`` (``lora``: prepared as the Trainer prepares it; ``lora_accelerate``:
accelerate's own layer units) at the end of the first forward, fitcheck's formula and finding, and the verdict of
Llama-3.1-8B LoRA r16 on 4 x H100.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RECORDED = ROOT / "benchmarks" / "data" / "fsdp2_run_events_cpu.json"
TOLERANCE = 64  # bytes: the recorded runs differ by a few Python scalars besides the gathered root


def _rows(variant: str) -> dict[str, dict[str, int]]:
    return dict(json.loads(RECORDED.read_text(encoding="utf-8"))["variants"][variant]["rows"])


def test_the_trainers_peft_policy_gives_fsdp2_no_layer_units() -> None:
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
    assert fsdp2_prepare_auto_wrap_policy(plugin, model) is None  # what the Trainer's FSDP2 run gets


@pytest.mark.parametrize("world", [1, 2])
def test_recorded_root_gathers_every_layer_and_the_formula_counts_it(world: int) -> None:
    from fsdp2_run_events_cpu import spec_of

    from fitcheck.core.states import param_compute_bytes
    from fitcheck.core.states.fsdp2_units import fsdp2_components, peft_root_gathers, root_layer_bytes
    from fitcheck.report import Phase
    from fitcheck.spec import Role

    trainer, direct = _rows("lora")[str(world)], _rows("lora_accelerate")[str(world)]
    measured = trainer["forward1"] - direct["forward1"]
    spec = spec_of(world, lora=True)
    compute = param_compute_bytes(spec)
    norm = sum(p.numel for p in spec.model.params if not p.per_layer and p.role is Role.NORM) * compute
    assert peft_root_gathers(spec)
    # the final norm is the root's in both runs (_find_final_norm finds none under peft): the rest is the layers
    assert abs(root_layer_bytes(spec, compute) - norm - measured) <= TOLERANCE, (measured, root_layer_bytes(spec,
                                                                                                     compute))
    component = fsdp2_components(spec, compute, 0, "test", world)[0]
    assert component.at(Phase.FORWARD_END) >= measured
    assert component.at(Phase.BACKWARD_START) >= measured


def _estimate(*extra: str) -> dict[str, Any]:
    import contextlib
    import io

    from fitcheck.cli.main import main

    argv = ["estimate", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--dtype", "bfloat16", "--bf16", "--gpu",
            "H100-80GB", "--num_processes", "4", "--fsdp", "full_shard auto_wrap", "--per_device_train_batch_size",
            "8", "--max_seq_length", "4096", "--use_peft", "--lora_r", "16", "--gradient_checkpointing",
            "--no_trace", "--json", *extra]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return dict(json.loads(out.getvalue()))


def test_llama8b_lora_fsdp2_on_four_h100_does_not_fit() -> None:
    doc = _estimate()
    assert doc["fits"] is False
    found = [f for f in doc["findings"] if f["code"] == "fsdp2-peft-root-gathers-all-layers"]
    assert found and "32 decoder layers" in found[0]["message"] and "13." in found[0]["message"]
    assert "trainer.py l.1753" in found[0]["message"] and "fsdp2_prepare_auto_wrap_policy" in found[0]["message"]
    assert doc["components"]["buffers.fsdp_unsharded_params"] > 13 * 2**30


def test_qlora_root_gathers_the_packed_layers() -> None:
    doc = _estimate("--load_in_4bit", "--bnb_4bit_quant_storage", "bfloat16")
    found = [f for f in doc["findings"] if f["code"] == "fsdp2-peft-root-gathers-all-layers"]
    assert found
    # 4-bit packed layers (~0.5 B a parameter) + bf16 norms + the adapters: between 3 and 4 GiB, far below bf16's 13
    assert 3 * 2**30 < doc["components"]["buffers.fsdp_unsharded_params"] < 5 * 2**30


@pytest.mark.slow
def test_the_replay_gathers_the_root_as_the_recorded_run() -> None:
    """The whole-run rewrite with the Trainer's units (``fsdp2_plan``) against accelerate's own
    (``trainer=False``), over one traced plain run: at the end of the first forward the Trainer's holds what the
    REAL ``lora`` run holds beyond ``lora_accelerate``, at world sizes 1 and 2 (the other points: the replay
    tests of ``tests/test_fsdp2_run_events.py``)."""
    from fsdp2_run_events_cpu import fitcheck_live

    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp2_plan

    plain = None
    for world in (1, 2):
        trainer, plain = fitcheck_live(world, plain, lora=True)
        direct, plain = fitcheck_live(world, plain, lora=True, plan=lambda s: fsdp2_plan(s, trainer=False))
        measured = _rows("lora")[str(world)]["forward1"] - _rows("lora_accelerate")[str(world)]["forward1"]
        assert abs(trainer["forward1"] - direct["forward1"] - measured) <= TOLERANCE, world


def test_fsdp2_activation_checkpointing_on_a_peft_model_is_refused(tmp_path: Path) -> None:
    """accelerate 1.15 ``fsdp2_apply_ac`` calls the policy ``fsdp2_prepare_auto_wrap_policy`` returns, None for the
    Trainer's peft policy (the first test): ``TypeError: 'NoneType' object is not callable`` in ``prepare``. A run
    the libraries refuse is exit 2 naming the file and key; without peft it is estimated; axolotl applies the
    checkpointing in its own FSDP2 preparation (``monkeypatch/accelerate/fsdp2.py``) and is not refused."""
    import inspect

    from accelerate.utils import fsdp_utils

    from fitcheck.cli.main import main

    source = inspect.getsource(fsdp_utils.fsdp2_apply_ac)
    assert "fsdp2_prepare_auto_wrap_policy(" in source and "if auto_wrap_policy_func(layer):" in source
    cfg = tmp_path / "fsdp2.json"
    cfg.write_text(json.dumps({"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                               "fsdp_activation_checkpointing": True}), encoding="utf-8")
    argv = ["estimate", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--dtype", "bfloat16", "--bf16", "--gpu",
            "H100-80GB", "--num_processes", "4", "--fsdp", "full_shard", "--fsdp_config", str(cfg),
            "--per_device_train_batch_size", "1", "--max_seq_length", "1024", "--no_trace", "--json"]
    assert main([*argv, "--use_peft"]) == 2
    assert main(argv) in (0, 1)
    axolotl = tmp_path / "ax.yaml"
    axolotl.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_r: 16\nlora_alpha: 32\n"
                       "lora_target_linear: true\nsequence_len: 1024\nmicro_batch_size: 1\nbf16: true\n"
                       "gradient_checkpointing: true\nlora_mlp_kernel: false\nlora_qkv_kernel: false\n"
                       "lora_o_kernel: false\nfsdp_version: 2\nfsdp_config:\n  activation_checkpointing: true\n"
                       "  auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                       "  transformer_layer_cls_to_wrap: LlamaDecoderLayer\n", encoding="utf-8")
    assert main(["estimate", "--axolotl", str(axolotl), "--gpu", "H100-80GB", "--num_processes", "4",
                 "--no_trace", "--json"]) in (0, 1)
