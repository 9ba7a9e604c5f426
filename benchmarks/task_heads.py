"""Classifier heads (seq-cls / token-cls): the estimate vs a fake-tensor trace of the real transformers class.

Each row builds the task's class (``AutoModelForSequenceClassification`` / ``...TokenClassification`` of the
config) through ``fitcheck.readers.model_config.load_inventory`` semantics (pure-Python rewrite or meta device),
and compares, at the end of forward and the start of backward, the estimate's activation + logits components
with what the trace holds besides parameters and optimizer states; the last columns give the full step's peak
(estimate on ``--device_type cpu`` vs trace) and what the causal-LM head of the same model would have cost.

Run: ``PYTHONPATH=. python benchmarks/task_heads.py``
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from fitcheck.core import estimate
from fitcheck.core.activations import activation_components
from fitcheck.readers import (
    classifier_inventory,
    inventory_from_config,
    pure_task_supported,
    spec_for_task,
    task_config,
    with_task,
)
from fitcheck.report import Phase
from fitcheck.spec import (
    ActivationSpec,
    BatchSpec,
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    ModelInventory,
    OptimizerSpec,
    PrecisionSpec,
    TrainingSpec,
)

LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 1376,
    "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 32000,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "pad_token_id": 0,
}
BERT: dict[str, Any] = {
    "model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 256, "intermediate_size": 1024,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 30522, "max_position_embeddings": 512,
}
ROBERTA: dict[str, Any] = dict(BERT, model_type="roberta", architectures=["RobertaForSequenceClassification"],
                               vocab_size=50265, max_position_embeddings=514, pad_token_id=1)
ALL_LINEAR = LoraSpec(r=8, alpha=16, target_modules=("all-linear",))


def inventory(config: dict[str, Any], task: str, labels: int) -> ModelInventory:
    """The task inventory as ``load_inventory`` builds it."""
    cfg = task_config(config, task, labels)
    if pure_task_supported(str(cfg["model_type"]), task):
        return classifier_inventory(inventory_from_config(cfg, "bench", "benchmarks"), task, labels)
    from fitcheck.torch_adapters import meta_inventory

    return with_task(meta_inventory(cfg, "bench", "benchmarks", task), task, labels)


def row(name: str, config: dict[str, Any], task: str, *, seq: int, batch: int, lora: LoraSpec | None = None,
        dtype: str = "bfloat16", labels: int = 3) -> tuple[str, ...]:
    from fitcheck.torch_adapters import OPTSTATE, PARAMS, trace_step

    inv = inventory(config, task, labels)
    spec = spec_for_task(TrainingSpec(
        model=inv, precision=PrecisionSpec(Dtype(dtype), MixedPrecision.NO), optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(batch, seq), activations=ActivationSpec(), hardware=HardwareSpec(device_type=DeviceType.CPU),
        lora=lora,
    ))
    trace = trace_step(inv.config, seq_len=seq, micro_batch=batch, dtype=dtype, lora=spec.lora, task=task,
                       optimizer="adamw_torch")
    comps = activation_components(spec)
    cells = [name, task, f"{batch}x{seq}", "lora" if lora else "full"]
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
        br = trace.phases[phase]
        traced = br.total - br.get(PARAMS) - br.get(OPTSTATE)
        formula = sum(c.at(phase) for c in comps)
        cells.append(f"{formula / 2**20:.2f}/{traced / 2**20:.2f} ({(formula - traced) / traced:+.2%})")
    report = estimate(spec)
    peak = max(p.total for p in trace.phases.values())
    cells.append(f"{report.peak_allocated_bytes / 2**20:.2f}/{peak / 2**20:.2f} "
                 f"({(report.peak_allocated_bytes - peak) / peak:+.2%})")
    if config["model_type"] != "roberta":
        causal = dataclasses.replace(spec, model=inventory_from_config(config, "bench", "benchmarks"),
                                     lora=lora)
        cells.append(f"{estimate(causal).peak_allocated_bytes / 2**20:.2f}")
    else:
        cells.append("-")
    return tuple(cells)


CASES: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    ("llama-512", LLAMA, "seq-cls", {"seq": 256, "batch": 2}),
    ("llama-512", LLAMA, "seq-cls", {"seq": 256, "batch": 2, "lora": ALL_LINEAR}),
    ("llama-512", LLAMA, "seq-cls", {"seq": 512, "batch": 4}),
    ("llama-512", LLAMA, "token-cls", {"seq": 256, "batch": 2}),
    ("llama-512", LLAMA, "token-cls", {"seq": 256, "batch": 2, "lora": ALL_LINEAR}),
    ("bert-256", BERT, "seq-cls", {"seq": 128, "batch": 4, "dtype": "float32"}),
    ("bert-256", BERT, "seq-cls", {"seq": 128, "batch": 4, "dtype": "float32", "lora": ALL_LINEAR}),
    ("bert-256", BERT, "token-cls", {"seq": 128, "batch": 4, "dtype": "float32"}),
    ("roberta-256", ROBERTA, "seq-cls", {"seq": 128, "batch": 4, "dtype": "float32"}),
    ("roberta-256", ROBERTA, "seq-cls", {"seq": 128, "batch": 4, "dtype": "float32", "lora": ALL_LINEAR}),
]


def main() -> int:
    head = ("model", "task", "b x s", "train", "fwd-end MiB est/trace", "bwd-start MiB est/trace",
            "step peak MiB est/trace", "causal-LM head est MiB")
    print(" | ".join(head), flush=True)
    if len(sys.argv) > 2 and sys.argv[1] == "--row":
        name, config, task, kw = CASES[int(sys.argv[2])]
        print(" | ".join(row(name, config, task, **kw)), flush=True)
        return 0
    import subprocess

    # one process per row: a third fake-tensor trace of a *ForSequenceClassification in one process segfaults
    # inside torch 2.13's FakeTensor cache (fake_tensor.py extract_tensor_metadata), whatever the row order
    for i in range(len(CASES)):
        out = subprocess.run([sys.executable, __file__, "--row", str(i)], capture_output=True, text=True, check=False)
        lines = out.stdout.strip().splitlines()
        print(lines[-1] if out.returncode == 0 and lines else f"row {i}: failed ({out.stderr.strip()[-200:]})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
