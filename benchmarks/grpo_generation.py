"""The real TRL 1.16 ``GRPOTrainer._generate`` on CPU vs fitcheck's generation phase (``Phase.GENERATION``).

Measured: the second generation of a real run (the first step's optimizer states exist), with a live-tensor tracker
(``fitcheck.torch_adapters.LiveTensorTracker``) started on the policy's parameters, buffers and optimizer states
(and the reference copy's) as ``_generate`` begins: the peak is the persistent state plus everything
``model.generate`` allocates. Each row also records the storages alive at the peak (sizes and counts) and the op,
and the peak of the last decode step (the ops of the last ``1/completion`` of the call).

Cases: the GRPO rows of ``benchmarks/data/trl_replay_cpu.json`` (tiny Llama h 256, 2 layers, 4 completions of 16 +
32 tokens; ``real.generation`` measured by ``trl_replay.measure_grpo``, read from that file) and longer shapes run
here: 8 completions of 16 + 128 tokens, a wider model (h 512, intermediate 1376, 8 heads, 2 KV heads) where the
prefill sets the peak (full and LoRA, beta 0 and 0.04), and a deeper one (4 layers, 4 KV heads) where the cache
does (full and LoRA, beta 0: beta only adds the reference copy to the persistent state).

Run: ``python benchmarks/grpo_generation.py [--measure] [--traced] [name-substring ...]``: ``--traced`` adds the
default path's traced generation phase (``torch_adapters/tracer_generate.py``); without ``--measure`` the real
peaks are read from ``benchmarks/data/grpo_generation_cpu.json`` and only the formula is recomputed (run it on an
older checkout for the "before" column).
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_replay import GRPO_CASES
from trl_truth import LLAMA, TRL_LORA, Case, build_trainer, spec_for

from fitcheck.core import estimate
from fitcheck.report import Phase
from fitcheck.spec import TrainerKind

DATA = Path(__file__).resolve().parent / "data" / "grpo_generation_cpu.json"
REPLAY_DATA = Path(__file__).resolve().parent / "data" / "trl_replay_cpu.json"
_WIDE = {**LLAMA, "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8, "num_key_value_heads": 2}
_DEEP = {**LLAMA, "num_hidden_layers": 4, "num_key_value_heads": 4}
_LONG: dict[str, Any] = {"batch": 8, "length": 128, "prompt": 16}
LONG_CASES = tuple(
    Case(f"grpo {shape} {kind}{' beta' if beta else ''}", TrainerKind.GRPO, **_LONG,
         lora=TRL_LORA if kind == "LoRA" else None, model=model,
         extra={"num_generations": 8, **({"beta": 0.04} if beta else {})})
    for shape, model, betas in (("wide 8x(16+128)", _WIDE, (False, True)), ("deep 8x(16+128)", _DEEP, (False,)))
    for kind in ("full", "LoRA") for beta in betas)


def measure(case: Case) -> dict[str, Any]:
    """The real second ``_generate``'s peak (bytes), the storages alive then, and the last decode step's peak."""
    from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

    class Probe(LiveTensorTracker):
        def __init__(self) -> None:
            super().__init__()
            self.base: set[int] = set()
            self.at = ""
            self.alive: list[int] = []
            self.series: list[tuple[int, str]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            before = self.peak
            out = super().__torch_dispatch__(func, types, args, kwargs)
            self.series.append((self.current, str(func)))
            if self.peak > before:
                self.at = str(func)
                self.alive = [v for k, v in self._live.items() if k not in self.base]
            return out

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = build_trainer(case, path)
        trainer.args.max_steps = 2
        generate, calls = trainer._generate, [0]

        def measured(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] != 2:
                return generate(*args, **kwargs)
            probe = Probe()
            probe.track(model_state_tensors(trainer.model, trainer.optimizer))
            if trainer.ref_model is not None:
                probe.track(model_state_tensors(trainer.ref_model))
            probe.base = set(probe._live)
            out["persistent"] = probe.current
            out["train_mode"] = bool(trainer.model.training)
            probe.start()
            try:
                return generate(*args, **kwargs)
            finally:
                probe.stop()
                tail = probe.series[len(probe.series) - len(probe.series) // case.length:]
                last = max(tail)
                by_op: dict[str, int] = {}
                for current, op in tail:
                    by_op[op] = max(by_op.get(op, 0), current)
                out["last_step_by_op"] = sorted(by_op.items(), key=lambda kv: -kv[1])[:8]
                out.update(peak=probe.peak, peak_op=probe.at, last_step_peak=last[0], last_step_op=last[1],
                           alive_at_peak=sorted(collections.Counter(probe.alive).items(), reverse=True))

        trainer._generate = measured
        trainer.train()
    return out


def formula(case: Case) -> dict[str, int]:
    """The formula's generation phase and its components."""
    report = estimate(spec_for(case))
    parts = {c.name: c.at(Phase.GENERATION) for c in report.components if c.name.startswith("generation.")}
    return {"generation": report.phase_totals().get(Phase.GENERATION, 0), **parts}


def traced(case: Case, f: dict[str, int]) -> tuple[int, int]:
    """The default path's generation phase (``torch_adapters.tracer_generate``: the real ``generate`` on fake
    tensors) in place of the formula's cache and working set: GRPOConfig's sampling (what the default path answers)
    and with the benchmark's ``generation_kwargs={"min_new_tokens": length}`` (what the real rows ran:
    ``trl_truth.build_trainer``)."""
    from fitcheck.core.trainers import generation_rows, step_spec
    from fitcheck.torch_adapters import activation_trace_kwargs, traced_generation

    spec = spec_for(case)
    run = step_spec(spec)
    held = f["generation"] - f.get("generation.kv_cache", 0) - f.get("generation.working_set", 0)
    kwargs = activation_trace_kwargs(spec)
    rows = generation_rows(run)
    default = traced_generation(run, rows, kwargs)[1]
    as_run = traced_generation(run, rows, kwargs, {"min_new_tokens": case.length})[1]
    return held + default, held + as_run


def main(argv: list[str]) -> int:
    run = "--measure" in argv
    names = [a for a in argv if not a.startswith("--")]
    data = json.loads(DATA.read_text()) if DATA.exists() else {"rows": []}
    recorded = {r["case"]: r for r in data["rows"]}
    replay = {r["case"]: r for r in json.loads(REPLAY_DATA.read_text())["grpo_rows"]}
    rows = []
    for case in (*GRPO_CASES, *LONG_CASES):
        if names and not any(n in case.name for n in names):
            continue
        if case in GRPO_CASES:
            real = {"peak": replay[case.name]["real"]["generation"], "source": "trl_replay_cpu.json grpo_rows"}
        elif run:
            real = measure(case)
            recorded[case.name] = {"case": case.name, "real": real}
            data["rows"] = [recorded[c.name] for c in LONG_CASES if c.name in recorded]
            DATA.write_text(json.dumps(data, indent=1) + "\n")
        elif case.name in recorded:
            real = recorded[case.name]["real"]
        else:
            continue
        f = formula(case)
        rows.append((case.name, real, f, traced(case, f) if "--traced" in argv else None))
    print(f"{'case':<34} {'real _generate':>14} {'formula':>12} {'error':>8}  kv_cache / working_set"
          + ("  traced (GRPOConfig sampling) / traced (min_new_tokens, as run)" if "--traced" in argv else ""))
    for name, real, f, tr in rows:
        line = (f"{name:<34} {real['peak']:>14,} {f['generation']:>12,} {f['generation'] / real['peak'] - 1:>+8.2%}  "
                f"{f.get('generation.kv_cache', 0):,} / {f.get('generation.working_set', 0):,}")
        if tr is not None:
            line += "  " + " / ".join(f"{v:,} ({v / real['peak'] - 1:+.2%})" for v in tr)
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
