"""AdaLoRA before and after ``tinit``: does a real step's peak change once the rank allocator starts masking?

fitcheck traces AdaLoRA's step 0 (``update_and_allocate(0)``: ``update_ipt`` only, no masking; the masking's
``kthvalue(...).item()`` cannot run on fake tensors). peft 0.21.2 ``tuners/adalora/layer.py``
``RankAllocator.update_and_allocate`` masks (``mask_to_budget``) on every step after ``tinit`` that
``budget_schedule`` marks, forces a last mask at ``total_step - tfinal`` and then ``reset_ipt`` drops the three
importance states; ``tuners/adalora/model.py`` ``AdaLoraModel.update_and_allocate`` then only re-applies the rank
pattern. This runs the loop peft asks for (forward, backward, ``opt.step()``, ``update_and_allocate(step)``,
``zero_grad``) on the CPU with real tensors, on the MetaMathQA AdaLoRA row's config with a short schedule
(tinit 2, tfinal 2, total_step 10, deltaT 1), the model of ``benchmarks/peft_adapters_cpu.py`` (Llama h=256,
I=688, 2 layers, vocabulary 2000, bf16, seq 64, micro-batch 2, ``torch.optim.AdamW``), and records per step the
live-tensor peak (``LiveTensorTracker``: parameters, gradients, optimizer and allocator states, activations) and
what ``update_and_allocate`` adds over the live bytes after ``opt.step()``.

Run: ``python benchmarks/adalora_tinit_cpu.py``; writes ``benchmarks/data/adalora_tinit_cpu.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "benchmarks" / "calibration" / "published_measurements.json"
OUT = ROOT / "benchmarks" / "data" / "adalora_tinit_cpu.json"
SCHEDULE = {"tinit": 2, "tfinal": 2, "total_step": 10, "deltaT": 1}
_DROPPED = ("peft_version", "auto_mapping", "base_model_name_or_path", "revision")


def run() -> list[dict[str, Any]]:
    import peft
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

    row = next(r for r in json.loads(ROWS.read_text()) if str(r.get("id", "")).startswith("MMQA-adalora"))
    config = {k: v for k, v in row["peft_config"].items() if k not in _DROPPED}
    config.update(SCHEDULE, inference_mode=False)
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=2000,
                                        tie_word_embeddings=False)).to(torch.bfloat16)
    model = peft.get_peft_model(base, peft.PeftConfig.from_peft_type(**config))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, 2000, (2, 64))
    allocator = model.base_model.rankallocator
    out: list[dict[str, Any]] = []
    for step in range(SCHEDULE["total_step"]):
        tracker = LiveTensorTracker()
        tracker.track(model_state_tensors(model, opt))
        tracker.track([*allocator.ipt.values(), *allocator.exp_avg_ipt.values(), *allocator.exp_avg_unc.values()])
        tracker.start()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        step_peak, after_step = tracker.peak, tracker.current
        tracker.reset_peak()
        model.base_model.update_and_allocate(step)
        added = tracker.peak - after_step
        opt.zero_grad(set_to_none=True)
        tracker.stop()
        _, masks = allocator.budget_schedule(step)
        out.append({"step": step, "masks": bool(masks), "peak": max(step_peak, tracker.peak),
                    "after_opt_step": after_step, "update_and_allocate_adds": added})
    return out


def main() -> None:
    rows = run()
    OUT.write_text(json.dumps({"schedule": SCHEDULE, "steps": rows}, indent=2) + "\n")
    for r in rows:
        print(f"step {r['step']}: masks={r['masks']!s:5} peak {r['peak']:>12,} B, after opt.step "
              f"{r['after_opt_step']:>12,} B, update_and_allocate adds {r['update_and_allocate_adds']:>10,} B")


if __name__ == "__main__":
    main()
