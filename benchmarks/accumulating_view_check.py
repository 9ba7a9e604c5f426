"""The default path's view of an accumulating micro-step vs a real CPU step, phase by phase.

With ``gradient_accumulation_steps`` > 1 the default path traces one pass (``trace_arguments.activation_trace_kwargs``)
and reads it as a later micro-step of the window (``trace_result.accumulating_step``: every ``.grad`` exists, each new
gradient lives beside it until its ``AccumulateGrad`` returns). This runs, per row, a REAL CPU step of two passes
(``trace_step(grad_accum=2, fake=False)``, the second measured) and prints each phase's activation, logits and
temporary bytes (``components_from_trace``, the earlier pass's gradients taken out of the forward phases as
``pinned_probes.traced_components`` does) next to the one-pass trace's and the view's. The rows are
``cpu_truth.py``'s widths (h512, 4 layers): a full bf16 step, a tied Qwen2 full step under autocast with
checkpointing, and a freeze (fp32) step.

Run: ``PYTHONPATH=. python benchmarks/accumulating_view_check.py``
"""

from __future__ import annotations

import dataclasses
import sys

from benchmarks.cpu_truth import LLAMA, QWEN2
from benchmarks.pinned_probes import Cell, cell_spec, traced_components
from fitcheck.report import Phase

ROWS = ((LLAMA, "full", "bf16", False), (QWEN2, "full", "autocast", True), (LLAMA, "freeze", "fp32", False))


def main() -> int:
    """Print the table; exit 1 where the view is not the real step's bytes."""
    from fitcheck.torch_adapters import BatchTraces, activation_trace_kwargs, components_from_trace, trace_step

    off = 0
    for config, method, precision, ckpt in ROWS:
        spec = cell_spec(Cell(config["model_type"], method, ckpt, "sdpa", precision, 128, 2), config)
        spec = dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, grad_accum=4))
        kwargs = activation_trace_kwargs(spec)
        real = traced_components(spec, trace_step(spec.model.config, **{**kwargs, "grad_accum": 2, "fake": False}))
        traces = BatchTraces(spec.model.config, kwargs)
        one = components_from_trace(traces.result(2))
        view = components_from_trace(traces.result(2, accumulating=True))
        print(f"{config['model_type']} {method} {precision}{' ckpt' if ckpt else ''}, 2 x 128, accumulation 4")
        for phase in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD):
            r, o, v = (sum(c.at(phase) for c in comps) for comps in (real, one, view))
            off += v != r
            print(f"  {phase.value:18s} real {r:>12,}  one pass {o:>12,} ({(o - r) / r * 100:+.2f} %)  "
                  f"view {v:>12,} ({(v - r) / r * 100:+.3f} %)")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
