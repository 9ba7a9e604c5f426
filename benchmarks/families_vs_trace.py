"""Activation formula vs fake-tensor trace for the catalog's newer families, at real widths.

For each model: its catalog config.json with ``num_hidden_layers`` cut to a few layers (the per-layer recipe is
what is compared; depth scales it linearly), LoRA (r=16, all-linear) and full fine-tuning, bf16, SDPA, batch 1,
at two sequence lengths. Prints FORWARD_END and BACKWARD_START of ``activation_components`` (the formula) next
to what ``fitcheck.torch_adapters.tracer.trace_step`` holds besides parameters and optimizer states, and the
signed error; then the whole step (``fitcheck.core.estimate`` on a CPU spec, formula vs the same estimate with
the traced activations, ``components_from_trace``; model states are the same pure code in both): the device
total during backward (``step: during backward``) and the step's peak allocated bytes (``step: peak``, which a
full fine-tune's optimizer step sets). Rows outside 2 % are families whose estimate is not pinned (the report says so).

    python benchmarks/families_vs_trace.py [--seqs 512 2048] [--models Qwen/Qwen3-8B ...]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from fitcheck.catalog import find_catalog_config
from fitcheck.core import estimate
from fitcheck.core.activations import activation_components
from fitcheck.errors import UnsupportedModelError
from fitcheck.readers import inventory_from_config
from fitcheck.report import Phase
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
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

MODELS = (
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-30B-A3B",
    "google/gemma-3-1b-it",
    "google/gemma-3-12b-it",
    "allenai/OLMo-2-1124-7B",
    "openai/gpt-oss-20b",
    "deepseek-ai/DeepSeek-V3",
    "microsoft/phi-4",
    "mistralai/Mistral-Small-24B-Instruct-2501",
    "meta-llama/Llama-3.3-70B-Instruct",
)


def reduced(config: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """The config with ``layers`` decoder layers (text part only for Gemma-3 multimodal configs)."""
    cfg = copy.deepcopy(dict(config))
    if cfg.get("model_type") == "gemma3":  # the text model of a Gemma-3 image-text checkpoint
        text = dict(cfg["text_config"])
        text.setdefault("model_type", "gemma3_text")
        text["model_type"] = "gemma3_text"
        text["architectures"] = ["Gemma3ForCausalLM"]
        text.setdefault("dtype", cfg.get("torch_dtype", cfg.get("dtype")))
        cfg = text
    cfg["num_hidden_layers"] = layers
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:layers]
    if "first_k_dense_replace" in cfg:
        cfg["first_k_dense_replace"] = min(int(cfg["first_k_dense_replace"]), layers - 1)
    cfg.pop("quantization_config", None)  # the dequantized bf16 model (what runs without MXFP4 kernels)
    return cfg


def inventory(cfg: Mapping[str, Any], model_id: str) -> ModelInventory:
    try:
        return inventory_from_config(cfg, model_id, "catalog")
    except UnsupportedModelError:
        from fitcheck.torch_adapters import meta_inventory

        return meta_inventory(cfg, model_id, "catalog")


def spec(inv: ModelInventory, seq: int, lora: LoraSpec | None) -> TrainingSpec:
    return TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.NO),
        optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(micro_batch=1, seq_len=seq, grad_accum=1),
        activations=ActivationSpec(checkpointing=False, attn_implementation=AttnImpl.SDPA),
        lora=lora,
        hardware=HardwareSpec(device_type=DeviceType.CPU),  # the trace is a CPU step (DeepSeek's SDPA differs on CUDA)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    from fitcheck.torch_adapters import OPTSTATE, PARAMS, components_from_trace, trace_step

    print("| model | family | counted by | mode | seq | phase | formula MiB | trace MiB | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model_id in args.models:
        found = find_catalog_config(model_id)
        assert found is not None, model_id
        cfg = reduced(found[0], args.layers)
        inv = inventory(cfg, model_id)
        for mode, lora in (("full", None), ("lora", LoraSpec(r=16, target_modules=("all-linear",)))):
            for seq in args.seqs:
                sp = spec(inv, seq, lora)
                comps = activation_components(sp)
                t0 = time.time()
                try:
                    tr = trace_step(cfg, seq_len=seq, micro_batch=1, dtype="bfloat16", lora=lora)
                except Exception as exc:
                    print(f"| {model_id} | {inv.shape.family} | {inv.counted_by} | {mode} | {seq} | - | - | "
                          f"trace failed: {type(exc).__name__}: {str(exc)[:80]} | - |")
                    continue
                for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
                    br = tr.phases[phase]
                    traced = br.total - br.get(PARAMS) - br.get(OPTSTATE)
                    formula = sum(c.at(phase) for c in comps)
                    err = (formula - traced) / traced
                    print(f"| {model_id} | {inv.shape.family} | {inv.counted_by} | {mode} | {seq} | {phase.value} | "
                          f"{formula / 2**20:,.1f} | {traced / 2**20:,.1f} | {err:+.2%} |", flush=True)
                cpu = dataclasses.replace(sp, hardware=HardwareSpec(device_type=DeviceType.CPU))
                f_rep, t_rep = estimate(cpu), estimate(cpu, activations=components_from_trace(tr))
                rows = (("during backward", f_rep.phase_totals()[Phase.BACKWARD], t_rep.phase_totals()[Phase.BACKWARD]),
                        ("peak", f_rep.peak_allocated_bytes, t_rep.peak_allocated_bytes))
                for what, f_b, t_b in rows:
                    print(f"| {model_id} | {inv.shape.family} | {inv.counted_by} | {mode} | {seq} | step: {what} | "
                          f"{f_b / 2**20:,.1f} | {t_b / 2**20:,.1f} | {(f_b - t_b) / t_b:+.2%} |", flush=True)
                _ = time.time() - t0


if __name__ == "__main__":
    main()
