"""peft's ``modules_to_save`` copy of a classifier head under fake tensors (tracer_patches fix 4).

peft 0.21.2 ``ModulesToSaveWrapper.update`` deep-copies the head of a seq-cls / token-cls LoRA run. torch 2.13's
``Tensor.__deepcopy__`` on a FakeTensor read its data pointer and deep-copied its FakeTensorMode with it; the
copied mode corrupted the heap, and ``fitcheck estimate --trace`` on a RoBERTa-large seq-cls LoRA run died with
exit 139 (segfault) or 134 ("corrupted double-linked list") after printing its answer.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from fitcheck.spec import LoraSpec
from fitcheck.torch_adapters.tracer import trace_step

ROBERTA: dict[str, Any] = {
    "model_type": "roberta", "architectures": ["RobertaForSequenceClassification"], "hidden_size": 64,
    "intermediate_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 130, "pad_token_id": 1, "type_vocab_size": 1,
}
LORA = LoraSpec(r=8, alpha=16, target_modules=("query", "value"))


def test_a_fake_copy_shares_its_fake_mode() -> None:
    """The copy lives in the mode of the original (before the fix: a deep copy of the whole mode)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fitcheck.torch_adapters.tracer_patches import fake_deepcopy

    with FakeTensorMode(allow_non_fake_inputs=True) as mode, fake_deepcopy():
        head = torch.nn.Linear(8, 3)
        copied = copy.deepcopy(head)
    assert getattr(copied.weight, "fake_mode", None) is mode
    assert copied.weight is not head.weight and copied.weight.shape == head.weight.shape
    assert copied.weight.requires_grad and isinstance(copied.weight, torch.nn.Parameter)
    assert "__deepcopy__" not in type(head.weight).__dict__  # the patch is undone on exit


def test_seq_cls_lora_fake_equals_real() -> None:
    """The copied head is traced in the step's own mode: every phase equals the real CPU step."""
    args: dict[str, Any] = {"seq_len": 16, "micro_batch": 2, "dtype": "float32", "task": "seq-cls", "lora": LORA}
    fake = trace_step(ROBERTA, fake=True, **args)
    real = trace_step(ROBERTA, fake=False, **args)
    assert {p: b.total for p, b in fake.phases.items()} == {p: b.total for p, b in real.phases.items()}


def test_repeated_seq_cls_lora_traces_do_not_corrupt_the_heap(tmp_path: Path) -> None:
    """Three traces in one process then a clean exit (before: exit 134 / 139 in every run tried, 8 of 8)."""
    (tmp_path / "config.json").write_text(json.dumps(ROBERTA))
    script = textwrap.dedent(f"""
        import json, warnings
        warnings.simplefilter("ignore")
        from fitcheck.spec import LoraSpec
        from fitcheck.torch_adapters.tracer import trace_step
        cfg = json.load(open({str(tmp_path / "config.json")!r}))
        lora = LoraSpec(r=8, alpha=16, target_modules=("query", "value"))
        for mb in (2, 2, 2):
            trace_step(cfg, seq_len=16, micro_batch=mb, task="seq-cls", lora=lora, optimizer=None, steps=1,
                       dtype="float32")
        print("traced")
    """)
    env = {**os.environ, "MALLOC_CHECK_": "3"}  # glibc aborts at the first heap inconsistency it sees
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "traced" in done.stdout
