"""Real TRL 1.16 SFT / DPO / KTO / GRPO trainer runs on CPU vs the whole-run replay of that run and the formula.

For each SFT case of ``benchmarks/trl_truth.py`` (a tiny random Llama, its real ``SFTTrainer``), a QLoRA case
(the same model loaded in 4-bit nf4 by the trainer) and the DPO cases (its real ``DPOTrainer``: a full fine-tune
with the reference copy it loads, LoRA with the adapters-off reference pass, with and without checkpointing,
``rpo_alpha``, ``precompute_ref_log_probs``; ``tracer_dpo``) and the KTO cases (its real ``KTOTrainer``: the same
references, with the KL batch (``loss_type`` ``kto``) and without (``apo_zero_unpaired``); ``tracer_kto``) and the
GRPO cases (its real ``GRPOTrainer`` with a reward function in Python, ``model.generate`` on the CPU: beta 0 and 0.04,
full and LoRA, without checkpointing, accumulation 2, steps_per_generation 2; ``tracer_grpo``;
``GRPOTrainer._generate`` measured apart, ``generation``, as the replay leaves generation to the formula's phase:
``formula_generation`` / ``formula_training``), three steps:

* ``real``: the live-tensor bytes of the real run (``fitcheck.torch_adapters.live_tracker``, started at step 1's
  ``on_step_begin`` on the model's parameters, buffers and optimizer, and DPO's / KTO's reference copy: every tensor the
  steps create, the optimizer states of step 1 included): the peak over the three steps and the third step's own
  peak;
* ``replay``: ``allocator_whole_run.replay_whole_run`` of the case's spec on CPU (the SFT / DPO step traced with TRL's
  model preparation and fused LM head: ``tracer_trl`` / ``tracer_dpo``; CPU's torch tile folds): its
  ``peak_allocated`` and the peak of the last step's events (tags without ``_warmup``);
* ``plain``: the same replay of the plain Trainer step (what the replay composed before: full-vocabulary logits);
* ``formula``: ``core.estimate`` of the spec (``peak_allocated_bytes``).

Run: ``PYTHONPATH=. python benchmarks/trl_replay.py [name-substring ...] [--out benchmarks/data/trl_replay_cpu.json]``
(``--out`` keeps the file's rows of the cases not run, and its other keys: the GRPO rows are ``grpo_rows``).
GRPO's pre-pass deepened from one and two layers vs four layers: ``python tests/grpo_deepen_check.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_models
from trl_truth import CASES, GPT2, LLAMA, TRL_LORA, Case, build_trainer, spec_for

from fitcheck.core import estimate
from fitcheck.report import Phase
from fitcheck.spec import Dtype, QuantSpec, TrainerKind, TrainerSpec

STEPS = 3  # allocator_replay.STEADY_STEPS
# QLoRA: the base loaded in 4-bit (nf4, bf16 compute) through SFTConfig.model_init_kwargs; bitsandbytes' CPU backend
_NF4 = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16"}
SFT_CASES = (*(c for c in CASES if c.trainer is TrainerKind.SFT and not c.extra),
             Case("sft QLoRA", TrainerKind.SFT, lora=TRL_LORA,
                  extra={"model_init_kwargs": {"quantization_config": _NF4}}))
# DPO (tracer_dpo): 32 prompt + 48 completion tokens, chosen + rejected rows: a full fine-tune with its reference
# copy (DPOTrainer loads it: ref_model None, no PEFT), LoRA with the adapters-off pass, with and without checkpointing
DPO_CASES = (Case("dpo full ref", TrainerKind.DPO, length=48, prompt=32),
             Case("dpo full ref no-ckpt", TrainerKind.DPO, ckpt=False, length=48, prompt=32),
             Case("dpo LoRA", TrainerKind.DPO, lora=TRL_LORA, length=48, prompt=32),
             Case("dpo LoRA no-ckpt", TrainerKind.DPO, lora=TRL_LORA, ckpt=False, length=48, prompt=32),
             Case("dpo rpo_alpha", TrainerKind.DPO, extra={"rpo_alpha": 1.0}, length=48, prompt=32),
             # no reference in the step; the pass before training (DPOTrainer.__init__) measured apart: "precompute"
             Case("dpo precompute_ref_log_probs", TrainerKind.DPO, length=48, prompt=32,
                  extra={"precompute_ref_log_probs": True}),
             Case("dpo LoRA precompute_ref_log_probs", TrainerKind.DPO, lora=TRL_LORA,
                  extra={"precompute_ref_log_probs": True}, length=48, prompt=32))
# KTO (tracer_kto): 2 rows (one desirable, one not: trl_truth's dataset) of 32 prompt + 48 completion tokens; the KL
# batch (loss_type kto) or none (apo_zero_unpaired); the reference copy, adapters off, or precomputed log-probs
_KTO = {"length": 48, "prompt": 32}
KTO_CASES = (Case("kto full ref", TrainerKind.KTO, **_KTO),
             Case("kto full ref no-ckpt", TrainerKind.KTO, ckpt=False, **_KTO),
             Case("kto LoRA", TrainerKind.KTO, lora=TRL_LORA, **_KTO),
             Case("kto LoRA no-ckpt", TrainerKind.KTO, lora=TRL_LORA, ckpt=False, **_KTO),
             Case("kto apo_zero_unpaired (no KL)", TrainerKind.KTO, extra={"loss_type": "apo_zero_unpaired"}, **_KTO),
             Case("kto LoRA apo_zero_unpaired (no KL)", TrainerKind.KTO, lora=TRL_LORA,
                  extra={"loss_type": "apo_zero_unpaired"}, **_KTO),
             Case("kto precompute_ref_log_probs", TrainerKind.KTO, extra={"precompute_ref_log_probs": True}, **_KTO),
             Case("kto LoRA precompute_ref_log_probs", TrainerKind.KTO, lora=TRL_LORA,
                  extra={"precompute_ref_log_probs": True}, **_KTO))
# GRPO (tracer_grpo): 4 completions of 16 prompt + 32 completion tokens per micro-batch (one prompt, num_generations
# 4), a reward function in Python; beta 0 (no reference) and 0.04 (the copy / LoRA's adapters-off pass), and a
# generation batch of two micro-batches: accumulation 2 (steps_per_generation 2 by default: one pre-pass over 8 rows
# per step) or steps_per_generation 2 without accumulation (generation every other step, the old-policy pass)
_G = {"num_generations": 4}
GRPO_CASES = (Case("grpo full", TrainerKind.GRPO, batch=4, length=32, prompt=16, extra=_G),
              Case("grpo full beta", TrainerKind.GRPO, batch=4, length=32, prompt=16, extra={**_G, "beta": 0.04}),
              Case("grpo full beta no-ckpt", TrainerKind.GRPO, batch=4, length=32, prompt=16, ckpt=False,
                   extra={**_G, "beta": 0.04}),
              Case("grpo LoRA", TrainerKind.GRPO, batch=4, length=32, prompt=16, lora=TRL_LORA, extra=_G),
              Case("grpo LoRA beta", TrainerKind.GRPO, batch=4, length=32, prompt=16, lora=TRL_LORA,
                   extra={**_G, "beta": 0.04}),
              Case("grpo full beta accum 2", TrainerKind.GRPO, batch=4, length=32, prompt=16,
                   extra={**_G, "beta": 0.04, "gradient_accumulation_steps": 2}),
              Case("grpo LoRA beta accum 2", TrainerKind.GRPO, batch=4, length=32, prompt=16, lora=TRL_LORA,
                   extra={**_G, "beta": 0.04, "gradient_accumulation_steps": 2}),
              Case("grpo full beta steps_per_generation 2", TrainerKind.GRPO, batch=4, length=32, prompt=16,
                   extra={**_G, "beta": 0.04, "steps_per_generation": 2}))
# A second shape (session 17): a wider and deeper Llama (h 512, 8 heads, 4 layers), 2 rows (pairs for DPO) of 64
# prompt + 192 completion tokens; full and LoRA, with and without checkpointing, crosswise over the two trainers
WIDE = {**LLAMA, "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8, "num_key_value_heads": 4,
        "num_hidden_layers": 4}
_W = {"length": 192, "prompt": 64, "model": WIDE}
WIDE_CASES = (Case("wide dpo full ref", TrainerKind.DPO, **_W),
              Case("wide dpo LoRA no-ckpt", TrainerKind.DPO, lora=TRL_LORA, ckpt=False, **_W),
              Case("wide kto full ref no-ckpt", TrainerKind.KTO, ckpt=False, **_W),
              Case("wide kto LoRA", TrainerKind.KTO, lora=TRL_LORA, **_W))
# A family with nn.Dropout modules (GPT-2, p 0.1), which DPOConfig / KTOConfig's disable_dropout zeroes: trl_truth.GPT2
_G2 = {"length": 48, "prompt": 32, "model": GPT2}
DROPOUT_CASES = (Case("gpt2 dpo full ref no-ckpt", TrainerKind.DPO, ckpt=False, **_G2),
                 Case("gpt2 dpo full ref", TrainerKind.DPO, **_G2),
                 Case("gpt2 dpo LoRA no-ckpt", TrainerKind.DPO, lora=TRL_LORA, ckpt=False, **_G2),
                 Case("gpt2 kto full ref no-ckpt", TrainerKind.KTO, ckpt=False, **_G2),
                 Case("gpt2 kto LoRA no-ckpt", TrainerKind.KTO, lora=TRL_LORA, ckpt=False, **_G2),
                 Case("gpt2 kto LoRA", TrainerKind.KTO, lora=TRL_LORA, **_G2))
ALL_CASES = (*SFT_CASES, *DPO_CASES, *KTO_CASES, *GRPO_CASES, *WIDE_CASES, *DROPOUT_CASES)


def case_spec(case: Case) -> Any:
    """``trl_truth.spec_for``, with the 4-bit base of a QLoRA case (TRL 1.16 never calls
    ``prepare_model_for_kbit_training``: ``readers/trl_settings.py``)."""
    spec = spec_for(case)
    if "model_init_kwargs" not in case.extra:
        return spec
    quant = QuantSpec(bits=4, quant_type="nf4", compute_dtype=Dtype.BFLOAT16, prepare_for_kbit_training=False)
    return dataclasses.replace(spec, quant=quant)


def measure_run(case: Case) -> dict[str, int]:
    """Live-tensor peaks of the real SFTTrainer's first three steps: ``{"peak": ..., "last_step": ...}``."""
    from transformers import TrainerCallback

    from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

    out: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings(), _precompute_measured(out):
        warnings.simplefilter("ignore")
        trainer = build_trainer(case, path)
        trainer.args.max_steps = STEPS
        state: dict[str, Any] = {}

        class Measure(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == 0:
                    tracker = LiveTensorTracker()
                    tracker.track(model_state_tensors(trainer.model, trainer.optimizer))
                    if getattr(trainer, "ref_model", None) is not None:  # DPO's / KTO's reference copy
                        tracker.track(model_state_tensors(trainer.ref_model))
                    state["tracker"] = tracker.start()
                elif st.global_step == STEPS - 1:
                    out["before_last"] = state["tracker"].peak
                    state["tracker"].reset_peak()
                return control

            def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == STEPS:
                    tracker = state.pop("tracker")
                    tracker.stop()
                    out["last_step"] = tracker.peak
                    out["peak"] = max(tracker.peak, out["before_last"])
                return control

        trainer.add_callback(Measure())
        trainer.train()
    return out


def measure_grpo(case: Case) -> dict[str, int]:
    """Live-tensor peaks of the real GRPOTrainer's first three steps (the tracker as :func:`measure_run`'s), with
    ``GRPOTrainer._generate`` (tokenization and ``model.generate``) measured apart: ``peak`` and ``last_step`` over
    everything, ``training`` and ``generation`` (the largest peak outside / inside a generation), the same for the
    last step (``*_last``)."""
    from transformers import TrainerCallback

    from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

    out: dict[str, int] = {}
    state: dict[str, Any] = {"tracker": None, "last": False}

    def close(kind: str) -> None:
        key = kind + ("_last" if state["last"] else "")
        out[key] = max(out.get(key, 0), state["tracker"].peak)
        state["tracker"].reset_peak()

    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = build_trainer(case, path)
        trainer.args.max_steps = STEPS

        class Measure(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == 0:
                    tracker = LiveTensorTracker()
                    tracker.track(model_state_tensors(trainer.model, trainer.optimizer))
                    if trainer.ref_model is not None:  # beta != 0 without PEFT: the reference copy
                        tracker.track(model_state_tensors(trainer.ref_model))
                    state["tracker"] = tracker.start()
                elif st.global_step == STEPS - 1:
                    close("training")
                    state["last"] = True
                return control

            def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == STEPS:
                    close("training")
                    state["tracker"].stop()
                return control

        generate = trainer._generate

        def measured(*args: Any, **kwargs: Any) -> Any:
            if state["tracker"] is None:
                return generate(*args, **kwargs)
            close("training")
            result = generate(*args, **kwargs)
            close("generation")
            return result

        trainer._generate = measured
        trainer.add_callback(Measure())
        trainer.train()
    for kind in ("training", "generation"):
        out[kind] = max(out.get(kind, 0), out.get(kind + "_last", 0))
    out["peak"] = max(out["training"], out["generation"])
    out["last_step"] = max(out.get("training_last", 0), out.get("generation_last", 0))
    return out


@contextlib.contextmanager
def _precompute_measured(out: dict[str, int]) -> Iterator[None]:
    """The live-tensor peak of DPOTrainer's / KTOTrainer's ``precompute_ref_log_probs`` pass
    (``_precompute_ref_logps``, run by ``__init__`` before the optimizer exists) as ``out["precompute"]``: the
    model's parameters and buffers and every tensor the pass creates (the log-probs it moves to the CPU included:
    one process)."""
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.kto_trainer import KTOTrainer

    with _measured_pass(DPOTrainer, out), _measured_pass(KTOTrainer, out):
        yield


@contextlib.contextmanager
def _measured_pass(cls: Any, out: dict[str, int]) -> Iterator[None]:
    """``cls._precompute_ref_logps`` measured (:func:`_precompute_measured`)."""
    from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

    original = cls._precompute_ref_logps

    def measured(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = LiveTensorTracker()
        tracker.track(model_state_tensors(self.ref_model or self.model))
        tracker.start()
        try:
            return original(self, *args, **kwargs)
        finally:
            tracker.stop()
            out["precompute"] = tracker.peak

    setattr(cls, "_precompute_ref_logps", measured)  # noqa: B010  # the class, for __init__
    try:
        yield
    finally:
        setattr(cls, "_precompute_ref_logps", original)  # noqa: B010


def replay_peaks(spec: Any) -> dict[str, int]:
    """The whole run's replay: its peak allocated, the last step's own peak (events not tagged ``_warmup``) and
    the setup's (parameters; DPO's precompute pass)."""
    from fitcheck.torch_adapters import replayed_micro_batches, whole_run_events

    live = peak = last = setup = 0
    passes = replayed_micro_batches(spec.batch.grad_accum)
    for _serial, signed, tag in whole_run_events(spec, steps=STEPS, micro_batches=passes):
        live += signed
        peak = max(peak, live)
        if tag == "setup":
            setup = max(setup, live)
        elif not tag.endswith("_warmup"):
            last = max(last, live)
    return {"peak": peak, "last_step": last, "setup": setup}


def row(case: Case) -> dict[str, Any]:
    """One table row (bytes)."""
    spec = case_spec(case)
    plain = dataclasses.replace(spec, trainer=TrainerSpec())
    t = time.perf_counter()
    replay = replay_peaks(spec)
    seconds = time.perf_counter() - t
    report = estimate(spec)
    out = {"case": case.name, "formula": report.peak_allocated_bytes, "replay": replay,
           "plain_replay": replay_peaks(plain), "replay_seconds": round(seconds, 2)}
    if case.trainer is not TrainerKind.GRPO:
        return {**out, "real": measure_run(case)}
    totals = report.phase_totals()  # the formula's generation phase and its training phases apart
    out["formula_generation"] = totals.get(Phase.GENERATION, 0)
    out["formula_training"] = max(n for p, n in totals.items() if p is not Phase.GENERATION)
    return {**out, "real": measure_grpo(case)}


def main(argv: list[str]) -> int:
    out = None
    if "--out" in argv:
        at = argv.index("--out")
        out, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    cases = [c for c in ALL_CASES if not argv or any(a in c.name for a in argv)]
    rows = [row(c) for c in cases]
    print(f"{'case':<40} {'formula':>12} {'replay':>12} {'real':>12} {'replay/real':>11} {'formula/real':>12} "
          f"{'plain replay':>12} {'last: replay':>13} {'last: real':>12}")
    for r in rows:
        real, rep = r["real"], r["replay"]
        print(f"{r['case']:<40} {r['formula']:>12,} {rep['peak']:>12,} {real['peak']:>12,} "
              f"{rep['peak'] / real['peak'] - 1:>+10.2%} {r['formula'] / real['peak'] - 1:>+11.2%} "
              f"{r['plain_replay']['peak']:>12,} {rep['last_step']:>13,} {real['last_step']:>12,}")
    for r in rows:
        if "precompute" in r["real"]:
            rep, real = r["replay"]["setup"], r["real"]["precompute"]
            print(f"{r['case']}: the precompute pass before training: replay (setup) {rep:,} real {real:,} "
                  f"({rep / real - 1:+.2%})")
        if "generation" in r["real"]:
            real = r["real"]
            print(f"{r['case']}: generation (not replayed) real {real['generation']:,}, formula "
                  f"{r['formula_generation']:,}; training real {real['training']:,}, replay {r['replay']['peak']:,}, "
                  f"formula {r['formula_training']:,}")
    if out:  # the rows of the cases not run now are kept from the file, and its other keys
        data = json.loads(Path(out).read_text()) if Path(out).exists() else {}
        grpo = {c.name for c in GRPO_CASES}
        for key, group in (("rows", (*SFT_CASES, *DPO_CASES, *KTO_CASES, *WIDE_CASES, *DROPOUT_CASES)),
                           ("grpo_rows", GRPO_CASES)):
            now = [r for r in rows if (r["case"] in grpo) == (key == "grpo_rows")]
            ran = {r["case"] for r in now}
            order = [c.name for c in group]
            merged = sorted([r for r in data.get(key, []) if r["case"] not in ran] + now,
                            key=lambda r: order.index(r["case"]) if r["case"] in order else len(order))
            if merged:
                data[key] = merged
        data["steps"] = STEPS
        Path(out).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
