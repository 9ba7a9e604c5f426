"""Real ``DPOTrainer`` / ``RewardTrainer`` / ``KTOTrainer`` / ``GRPOTrainer`` steps of older TRL releases on CPU vs
the fitcheck estimate at ``--stack trl=<that release>``, per phase.

The installed TRL is 1.16; each older release runs in a side virtual environment that reuses the main venv's torch
through a ``.pth`` file (``benchmarks/trl_sft_releases.py`` says how to make one). ``--record`` (run with the side
venv's python) measures each case with ``benchmarks/trl_truth.py``'s harness (tiny Llama, bf16 weights, TRL's bf16
autocast, the second optimizer step) and a live-tensor tracker whose peak window is cut at the phases fitcheck
reports:

- ``forward``: from the step's start to ``compute_loss``'s return (the policy's forward, the reference forward and
  the loss: fitcheck's ``forward_end`` moments);
- ``backward``: from there to ``on_pre_optimizer_step`` (``backward_start`` / ``backward``);
- ``optimizer``: to ``on_step_end`` (``optimizer``);
- ``generation`` (GRPO): ``GRPOTrainer._generate`` apart (``generation``), its log-prob pre-pass in ``forward``.

It writes ``benchmarks/data/trl_trainer_releases.json`` (one entry per release, with the side venv's versions).
Without ``--record`` the recorded phases are compared with ``fitcheck.core.estimate`` at the recorded stack (main
venv), phase by phase.

Run: ``PYTHONPATH=. /tmp/venv_trl24/bin/python benchmarks/trl_trainer_releases.py --record [name-substring ...]``
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import trl_truth
from trl_sft_releases import spec_at_recorded_stack
from trl_truth import TRL_LORA, Case, build_trainer

from fitcheck.core import estimate
from fitcheck.report import Phase, Report
from fitcheck.spec import TrainerKind

DATA = Path(__file__).resolve().parent / "data" / "trl_trainer_releases.json"
DPO, KTO, REWARD, GRPO = TrainerKind.DPO, TrainerKind.KTO, TrainerKind.REWARD, TrainerKind.GRPO
CASES: tuple[Case, ...] = (
    Case("dpo full ref", DPO, length=48, prompt=32),
    Case("dpo full ref no-ckpt", DPO, length=48, prompt=32, ckpt=False),
    Case("dpo LoRA", DPO, length=48, prompt=32, lora=TRL_LORA),
    Case("dpo precompute", DPO, length=48, prompt=32, extra={"precompute_ref_log_probs": True}),
    Case("dpo full ref V8000", DPO, length=48, prompt=32, vocab=8000),
    Case("reward full", REWARD, length=64),
    Case("reward LoRA", REWARD, length=64, lora=TRL_LORA),
    Case("kto full ref", KTO, length=48, prompt=32),
    Case("kto LoRA", KTO, length=48, prompt=32, lora=TRL_LORA),
    Case("kto full ref V8000", KTO, length=48, prompt=32, vocab=8000),
    Case("kto precompute", KTO, length=48, prompt=32, extra={"precompute_ref_log_probs": True}),
    Case("grpo beta 0", GRPO, batch=4, length=32, prompt=16, extra={"num_generations": 4}),
    Case("grpo beta 0.04", GRPO, batch=4, length=32, prompt=16, extra={"num_generations": 4, "beta": 0.04}),
    Case("grpo beta 0 V8000", GRPO, batch=4, length=32, prompt=16, vocab=8000, extra={"num_generations": 4}),
)
# the real phase windows (module docstring) and the estimate's phases each is compared with
PHASES: dict[str, tuple[Phase, ...]] = {
    "forward": (Phase.FORWARD_END,),
    "backward": (Phase.BACKWARD_START, Phase.BACKWARD),
    "optimizer": (Phase.OPTIMIZER_STEP,),
    "generation": (Phase.GENERATION,),
}


def recorded() -> dict[str, dict[str, Any]]:
    """The recordings by TRL release: ``{"0.24.0": {"versions": ..., "rows": {case: {phase: bytes}}}}``."""
    data: dict[str, dict[str, Any]] = json.loads(DATA.read_text())["releases"]
    return data


def estimated_phases(report: Report) -> dict[str, int]:
    """The estimate's peak in each real window (:data:`PHASES`)."""
    totals = report.phase_totals()
    return {name: max(totals.get(p, 0) for p in phases) for name, phases in PHASES.items()}


def _tokenizer_without_type_ids(vocab_size: int = trl_truth.VOCAB) -> Any:
    """``trl_truth``'s word-level tokenizer returning no ``token_type_ids``: GRPOTrainer before 1.x passes every
    tokenizer output to ``generate``, which refuses that key for a Llama (\"model_kwargs are not used\")."""
    tok = _plain_tokenizer(vocab_size)
    tok.model_input_names = ["input_ids", "attention_mask"]
    return tok


_plain_tokenizer = trl_truth._tokenizer
# RewardTrainer before v0.24.0 (trl/trainer/reward_trainer.py at the tags): no model_init_kwargs, a model object
# only, its own tokenization of "chosen" / "rejected" without an EOS, two forwards per step (chosen, then rejected)
REWARD_CONCATENATED_FROM = (0, 24)


def _old_reward_trainer(case: Case, path: str) -> Any:
    """A RewardTrainer of TRL < 0.24 on the case's tiny model (bf16 weights, as ``trl_truth.build_trainer``)."""
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForSequenceClassification

    raw = {k: v for k, v in trl_truth.LLAMA.items() if k not in ("model_type", "architectures", "vocab_size")}
    config = AutoConfig.for_model("llama", **raw, vocab_size=case.vocab, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, torch_dtype=torch.bfloat16)
    rows = 4 * case.batch  # case.length words: the old trainer appends no EOS
    data = Dataset.from_dict({"chosen": [trl_truth._words(case.length, i) for i in range(rows)],
                              "rejected": [trl_truth._words(case.length, i + 50) for i in range(rows)]})
    args = trl.RewardConfig(
        output_dir=path, max_steps=2, per_device_train_batch_size=case.batch, report_to=[], use_cpu=True,
        save_strategy="no", logging_steps=1, seed=0, gradient_checkpointing=case.ckpt, learning_rate=1e-4,
        optim="adamw_torch", dataloader_drop_last=True, max_length=case.length, remove_unused_columns=False)
    peft = None if case.lora is None else LoraConfig(
        r=case.lora.r, lora_alpha=case.lora.alpha, lora_dropout=case.lora.dropout, target_modules="all-linear",
        task_type="SEQ_CLS")
    return trl.RewardTrainer(model=model, args=args, train_dataset=data, processing_class=_plain_tokenizer(case.vocab),
                             peft_config=peft)


def _trainer(case: Case, path: str) -> Any:
    import trl

    release = tuple(int(x) for x in trl.__version__.split(".")[:2])
    if case.trainer is REWARD and release < REWARD_CONCATENATED_FROM:
        return _old_reward_trainer(case, path)
    return build_trainer(case, path)


def measure_phases(case: Case) -> dict[str, int]:
    """Live-tensor peaks of the second optimizer step, by phase window (module docstring)."""
    from transformers import TrainerCallback

    from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

    out: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl_truth._tokenizer = _tokenizer_without_type_ids if case.trainer is GRPO else _plain_tokenizer
        try:
            trainer = _trainer(case, path)
        finally:
            trl_truth._tokenizer = _plain_tokenizer
        state: dict[str, Any] = {"tracker": None}

        def close(name: str) -> None:
            tracker = state["tracker"]
            if tracker is not None:
                out[name] = max(out.get(name, 0), tracker.peak)
                tracker.reset_peak()

        class Measure(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == 1:
                    tracker = LiveTensorTracker()
                    tracker.track(model_state_tensors(trainer.model, trainer.optimizer))
                    ref = getattr(trainer, "ref_model", None)
                    if ref is not None:
                        tracker.track(model_state_tensors(ref))
                    state["tracker"] = tracker.start()
                return control

            def on_pre_optimizer_step(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                close("backward")
                return control

            def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                tracker = state["tracker"]
                if tracker is not None:
                    close("optimizer")
                    tracker.stop()
                    state["tracker"] = None
                return control

        compute_loss = trainer.compute_loss

        def measured_loss(*a: Any, **kw: Any) -> Any:
            result = compute_loss(*a, **kw)
            close("forward")
            return result

        trainer.compute_loss = measured_loss
        if case.trainer is GRPO:  # GRPOTrainer._generate (0.24+); before, _generate_and_score_completions calls the
            # unwrapped model's generate
            owner = trainer if hasattr(trainer, "_generate") else trainer.model
            name = "_generate" if owner is trainer else "generate"
            generate = getattr(owner, name)

            def measured_generate(*a: Any, **kw: Any) -> Any:
                close("forward")
                result = generate(*a, **kw)
                close("generation")
                return result

            setattr(owner, name, measured_generate)
        trainer.add_callback(Measure())
        trainer.train()
    return out


def _record(names: list[str]) -> int:
    import accelerate
    import peft
    import torch
    import transformers
    import trl

    data = json.loads(DATA.read_text()) if DATA.exists() else {"schema": "", "releases": {}}
    data["schema"] = ("one recording per TRL release: the side venv's versions, live-tensor peaks of the second step "
                      "per case and phase window (benchmarks/trl_trainer_releases.py --record)")
    entry = data["releases"].setdefault(trl.__version__, {"rows": {}})
    entry["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__, "peft": peft.__version__, "accelerate": accelerate.__version__}
    for case in CASES:
        if names and not any(n in case.name for n in names):
            continue
        try:
            entry["rows"][case.name] = measure_phases(case)
        except Exception as exc:  # a release that cannot run the case: say so in the data
            entry["rows"][case.name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(case.name, entry["rows"][case.name], flush=True)
        DATA.write_text(json.dumps(data, indent=1) + "\n")
    return 0


def main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("--")]
    if "--record" in argv:
        return _record(names)
    for release, data in recorded().items():
        print(f"TRL {release} (recorded) vs fitcheck at that stack: real / estimate MiB (error) per phase")
        for case in CASES:
            real = data["rows"].get(case.name)
            if real is None or "error" in real or (names and not any(n in case.name for n in names)):
                continue
            report = estimate(spec_at_recorded_stack(case, data["versions"]))
            est = estimated_phases(report)
            cells = [f"{p} {real[p] / 2**20:.2f}/{est[p] / 2**20:.2f} ({(est[p] - real[p]) / real[p] * 100:+.1f}%)"
                     for p in PHASES if p in real]
            print(f"  {case.name:22} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
