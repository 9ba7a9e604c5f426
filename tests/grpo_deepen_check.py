"""GRPO's micro-step through ``allocator_deepen``: composed at one and two layers and deepened to four vs composed
from a four-layer trace (what the default path does at real depth, checked at a depth it can also trace directly).

Run: ``python tests/grpo_deepen_check.py`` (minutes on a loaded 2-core machine: a script beside tiny_models.py, not
a test; session 16's run printed equal peaks and events for both cases).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_models


def deepen_check() -> list[tuple[str, int, int, int, int, bool]]:
    """GRPO's micro-step (the pre-pass's two chunks, then the policy) composed at one and two layers of an 8-layer
    tiny Llama and deepened to four (``allocator_deepen``, what the default path does at real depth) vs the same run
    composed from a four-layer trace: (case, peak allocated deepened / direct, peak reserved deepened / direct,
    the events equal up to renaming). CUDA kernels, accumulation 2, three steps, fused AdamW."""
    from tiny_models import LLAMA_8_LAYERS, REPLAY_LORA

    from fitcheck.torch_adapters.allocator_compose import whole_run
    from fitcheck.torch_adapters.allocator_deepen import canonical, deepen, frees_in_allocation_order
    from fitcheck.torch_adapters.allocator_replay import replay_events
    from fitcheck.torch_adapters.tracer import trace_step
    from fitcheck.torch_adapters.tracer_grpo import generating_passes
    from fitcheck.torch_adapters.tracer_optimizer import trace_optimizer
    from fitcheck.torch_adapters.tracer_trl_plans import GrpoPlan

    out = []
    full, adapters = GrpoPlan("model", 16, 0.04, 2, False, 0, 2), GrpoPlan("adapters", 16, 0.04, 2, False, 0, 2)
    for name, extra in (("full beta", {"trl_grpo": full}), ("LoRA beta", {"lora": REPLAY_LORA, "trl_grpo": adapters})):
        step = {"seq_len": 32, "micro_batch": 2, "cuda_kernels": True, "mixed_precision": "bf16",
                "checkpointing": True, "trl_head": ("log_probs", "entropy"), **extra}
        opt_kw = {k: v for k, v in step.items() if k in ("lora", "cuda_kernels", "trl_head", "mixed_precision")}

        def composed(depth: int, step: dict[str, Any] = step, opt_kw: dict[str, Any] = opt_kw) -> Any:
            run = trace_step(LLAMA_8_LAYERS, num_layers=depth, **{**step, "optimizer": None, "steps": 1})
            opt, starts = trace_optimizer(LLAMA_8_LAYERS, num_layers=depth, optimizer="adamw_torch_fused", steps=3,
                                          **opt_kw)
            return whole_run(run.alloc_events, run.region_starts, opt, starts, 3, 2, run.accumulated_after,
                             generating_passes(2, 2))

        one, two, four = composed(1), composed(2), composed(4)
        built = deepen(one[0], two[0], 4, (one[1], two[1]))
        a, b = replay_events([built]), replay_events([four[0]])
        same = frees_in_allocation_order(canonical(built)) == frees_in_allocation_order(canonical(four[0]))
        out.append((name, a.peak_allocated, b.peak_allocated, a.peak_reserved, b.peak_reserved, same))
    return out


if __name__ == "__main__":
    for row in deepen_check():
        print(*row)
