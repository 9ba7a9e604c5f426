"""Trace speed: import time, then 1 + 2 layer fake-tensor traces at full width (issue 3: < 2 s after imports).

Prints, per case: the time of the first trace (which includes transformers' lazy import of the model class on
its first use) and of a second identical trace, plus the import phase (torch, transformers, the tracer) and the
model-class import measured on its own. Run: ``python benchmarks/trace_speed.py`` (CPU, no network).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "fitcheck" / "catalog" / "models"
CASES = (
    ("meta-llama/Meta-Llama-3-70B", 4096, 1),
    ("meta-llama/Meta-Llama-3-70B", 8192, 1),
    ("meta-llama/Meta-Llama-3-8B", 4096, 2),
    ("Qwen/Qwen2.5-72B", 4096, 1),
)


def main() -> None:
    """Print the import phase and the trace times of each case."""
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import transformers

    from fitcheck.torch_adapters import model_class, trace_extrapolated

    imports = time.perf_counter() - t0
    print(f"imports (torch, transformers, fitcheck tracer): {imports:.2f} s")
    # what the first trace imports lazily: transformers.trainer (the Trainer's parameter groups, which pulls in
    # peft -> bitsandbytes -> torch.compile/inductor), measured separately so the trace times below are the work
    t = time.perf_counter()
    import transformers.trainer  # noqa: F401

    print(f"  lazy import transformers.trainer (+ peft, bitsandbytes): {time.perf_counter() - t:.2f} s")
    seen: set[str] = set()
    for model, seq, batch in CASES:
        config = json.loads((CATALOG / model / "config.json").read_text())
        arch = str(config.get("architectures", ["?"])[0])
        if arch not in seen:
            t = time.perf_counter()
            model_class(config)
            print(f"  model class {arch} first import: {time.perf_counter() - t:.2f} s")
            seen.add(arch)
        times = []
        for _ in range(2):
            t = time.perf_counter()
            result = trace_extrapolated(config, seq_len=seq, micro_batch=batch, dtype="bfloat16")
            times.append(time.perf_counter() - t)
        print(
            f"{model:32} s={seq:5} b={batch}: 1+2 layer trace {times[0]:.2f} s, again {times[1]:.2f} s; "
            f"peak {result.peak / 2**30:.2f} GiB at {result.peak_phase.value}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
