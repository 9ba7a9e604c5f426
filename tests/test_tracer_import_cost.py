"""What a traced answer imports that its answer does not use (issue 20: the traced default's cold time).

A fake-tensor trace of a LoRA or QLoRA step, or of TRL's step without peft (``trl.trainer.utils`` imports
transformers' ``trainer_utils``, which imports peft, which imports bitsandbytes), imports bitsandbytes without
``torch.compile``'s inductor lookup (``tracer_patches.bitsandbytes_uncompiled``), and traces the same bytes as
with bitsandbytes imported the usual way (the TRL step, which uses no bitsandbytes kernel, only in the lean run).
Each run in a fresh interpreter: an earlier test in this process may have imported bitsandbytes already.

What is compared: every phase's breakdown, the final gradients, and the trace's allocation events as a multiset.
The order of the frees that end a region is not the same from one fresh process to the next, with or without
this change (five fresh processes of the QLoRA step below: five orders, one multiset, one set of phases), so
the series and the event order are not compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

_CHILD = """
import hashlib, json, sys
sys.path.insert(0, {tests!r})
from tiny_models import family_config
from fitcheck.core.trainers import trainer_row
from fitcheck.spec import LoraSpec, QuantSpec, TrainerKind
from fitcheck.torch_adapters import tracer_patches
from fitcheck.torch_adapters.tracer import trace_step

if {usual!r}:  # bitsandbytes imported the usual way (its kernels compiled), before anything traces
    import bitsandbytes
cfg = family_config("llama", {{"hidden_size": 64, "intermediate_size": 172, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256}})
lora = LoraSpec(r=4, dropout=0.05, target_modules=("all-linear",))
# the lean child traces TRL's SFT step first, without peft: its trl import is the first to import bitsandbytes
if not {usual!r}:
    trace_step(cfg, seq_len=16, micro_batch=2, optimizer=None, steps=1, dtype="bfloat16", cuda_kernels=True,
               trl_head=trainer_row(TrainerKind.SFT).fused_head, cublas_workspaces=())
runs = [trace_step(cfg, seq_len=16, micro_batch=2, optimizer=None, steps=1, lora=lora, checkpointing=True,
                   dtype="float32"),
        trace_step(cfg, seq_len=16, micro_batch=2, optimizer="adamw_torch", lora=lora, quant=QuantSpec(),
                   checkpointing=True, dtype="float32", mixed_precision="bf16")]
print(json.dumps({{"inductor": "torch._inductor.compile_fx" in sys.modules,
                  "bitsandbytes": "bitsandbytes" in sys.modules,
                  "traces": [repr((r.phases, r.final_grads, sorted(r.alloc_events))) for r in runs]}}))
"""


def _child(usual: bool) -> dict[str, object]:
    tests = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", _CHILD.format(tests=tests, usual=usual)], capture_output=True,
                         text=True, check=False, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    got: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


@pytest.mark.slow
def test_lora_and_qlora_traces_import_no_inductor_and_trace_the_same_bytes() -> None:
    lean, usual = _child(usual=False), _child(usual=True)
    assert (lean["inductor"], lean["bitsandbytes"]) == (False, True)
    assert usual["inductor"] is True  # what bitsandbytes' import costs the usual way
    assert lean["traces"] == usual["traces"]
