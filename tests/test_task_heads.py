"""Task heads (issue 12): seq-cls / token-cls read from ``architectures`` or ``--task``.

The inventory of the task's class equals ``from_config`` of ``AutoModelForSequenceClassification`` /
``AutoModelForTokenClassification`` on the meta device, name by name; peft's trainable count for a LoRA
classifier (task_type SEQ_CLS) equals the estimate's; the activation formula equals a fake-tensor trace of the
real class; a vocabulary-sized head is gone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fitcheck.catalog import find_catalog_config
from fitcheck.cli.main import main
from fitcheck.core import estimate
from fitcheck.core.activations import activation_components
from fitcheck.readers import (
    classifier_inventory,
    inventory_from_config,
    load_inventory,
    spec_for_task,
    task_config,
    task_from_config,
    with_task,
)
from fitcheck.report import Phase
from fitcheck.spec import (
    BatchSpec,
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    ModelInventory,
    OptimizerSpec,
    ParamEntry,
    PrecisionSpec,
    Role,
    TrainingSpec,
)

ENV = {"HOME": "/nonexistent-home-for-tests"}
TINY_LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
    "pad_token_id": 0,
}
ROBERTA = {
    "model_type": "roberta", "architectures": ["RobertaForSequenceClassification"], "hidden_size": 128,
    "intermediate_size": 512, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 50265,
    "max_position_embeddings": 514, "pad_token_id": 1, "id2label": {"0": "neg", "1": "neu", "2": "pos"},
}


def _key(p: ParamEntry) -> tuple[object, ...]:
    return (p.name, p.shape, p.repeat, p.kind, p.role, p.module, p.in_features, p.out_features)


@pytest.mark.parametrize("task", ["seq-cls", "token-cls"])
@pytest.mark.parametrize(
    "model_id",
    ["meta-llama/Meta-Llama-3-8B", "Qwen/Qwen2.5-0.5B", "google/gemma-2-2b", "microsoft/Phi-3-mini-4k-instruct",
     "mistralai/Mixtral-8x7B-v0.1", "google-bert/bert-base-uncased"],
)
def test_pure_classifier_equals_meta(model_id: str, task: str) -> None:
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters import meta_inventory

    found = find_catalog_config(model_id)
    assert found is not None
    cfg = task_config(found[0], task, 5)
    pure = classifier_inventory(inventory_from_config(cfg, model_id, found[1]), task, 5)
    meta = with_task(meta_inventory(cfg, model_id, found[1], task), task, 5)
    assert sorted(map(_key, pure.params), key=str) == sorted(map(_key, meta.params), key=str)
    assert dataclasses.asdict(pure.shape) == dataclasses.asdict(meta.shape)
    assert not any(p.shape and p.shape[0] == pure.shape.vocab_size and p.role is Role.LM_HEAD for p in pure.params)


def test_architectures_name_the_task(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import torch
    import transformers

    from fitcheck.torch_adapters import meta_inventory

    (tmp_path / "config.json").write_text(json.dumps(ROBERTA))
    inv = load_inventory(str(tmp_path), env=ENV, meta_fallback=meta_inventory)
    assert task_from_config(ROBERTA) == "seq-cls"
    assert (inv.shape.task, inv.shape.num_labels) == ("seq-cls", 3)
    cfg = transformers.RobertaConfig.from_dict({k: v for k, v in ROBERTA.items() if k != "model_type"})
    with torch.device("meta"):
        real = transformers.AutoModelForSequenceClassification.from_config(cfg)
    assert inv.total_params == sum(p.numel() for p in real.parameters())
    assert {p.name for p in inv.params if p.role is Role.LM_HEAD} == {"classifier.dense.weight",
                                                                       "classifier.out_proj.weight"}


def _spec(inv: ModelInventory, lora: LoraSpec | None = None, seq: int = 64, batch: int = 2) -> TrainingSpec:
    return spec_for_task(TrainingSpec(
        model=inv, precision=PrecisionSpec(Dtype.BFLOAT16), optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(batch, seq), hardware=HardwareSpec(device_type=DeviceType.CPU), lora=lora,
    ))


def test_lora_classifier_trainable_count_equals_peft() -> None:
    pytest.importorskip("peft")
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    cfg = task_config(TINY_LLAMA, "seq-cls", 4)
    inv = classifier_inventory(inventory_from_config(cfg, "tiny", "test"), "seq-cls", 4)
    spec = _spec(inv, LoraSpec(r=8, alpha=16, target_modules=("all-linear",)))
    assert "score" in spec.lora.modules_to_save if spec.lora else False
    hf = transformers.LlamaConfig.from_dict({k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.LlamaForSequenceClassification(hf)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                  task_type="SEQ_CLS"))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert estimate(spec).trainable_params == trainable


@pytest.mark.parametrize("task", ["seq-cls", "token-cls"])
def test_classifier_activations_match_trace(task: str) -> None:
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters.trace_result import OPTSTATE, PARAMS
    from fitcheck.torch_adapters.tracer import trace_step

    cfg = task_config(TINY_LLAMA, task, 3)
    spec = _spec(classifier_inventory(inventory_from_config(cfg, "tiny", "test"), task, 3))
    trace = trace_step(cfg, seq_len=64, micro_batch=2, dtype="bfloat16", task=task, optimizer="adamw_torch")
    comps = activation_components(spec)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
        br = trace.phases[phase]
        traced = br.total - br.get(PARAMS) - br.get(OPTSTATE)
        formula = sum(c.at(phase) for c in comps)
        assert abs(formula - traced) <= 0.01 * traced, (task, phase, formula, traced)


def test_no_vocab_logits_for_a_classifier() -> None:
    found = find_catalog_config("meta-llama/Meta-Llama-3-8B")
    assert found is not None
    causal = inventory_from_config(found[0], "llama", found[1])
    cls = classifier_inventory(causal, "seq-cls", 2)
    big = dict(seq=2048, batch=4)
    c_logits = {c.name: c for c in activation_components(_spec(causal, **big))}["logits.loss"]
    s_logits = {c.name: c for c in activation_components(_spec(cls, **big))}["logits.loss"]
    assert c_logits.at(Phase.BACKWARD_START) >= 12 * 4 * 2048 * 128256
    assert s_logits.at(Phase.BACKWARD_START) < 4 * 2048 * 4096  # O(b·s·h) at most, no V


def test_cli_task_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model_name_or_path", "google-bert/bert-base-uncased", "--task", "seq-cls",
                 "--num_labels", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert out["total_params"] == 109_482_240 + 3 * 768 + 3  # BertModel with pooler + a 3-label classifier
    assert main(["estimate", "--model_name_or_path", "google-bert/bert-base-uncased", "--task", "nope"]) == 2
    assert main(["estimate", "--model_name_or_path", "google-bert/bert-base-uncased", "--num_labels", "x",
                 "--task", "seq-cls"]) == 2
