"""LLaMA-Factory's DPO / KTO steps (full fp32 logits) on real TRL 1.16 trainers on CPU vs ``--loss full-logits``.

LLaMA-Factory does not install with fitcheck's pinned stack (llamafactory 0.9.5 needs transformers <= 5.6), and its
``CustomDPOTrainer`` calls TRL < 1.0 methods (``dpo_loss``, ``get_batch_loss_metrics``) that TRL 1.16's
``DPOTrainer`` no longer has. So the real TRL 1.16 ``DPOTrainer`` (its collator, its PEFT model, its
``training_step``) is subclassed with a ``compute_loss`` that follows LLaMA-Factory@ff6d4d1 line for line:

* ``src/llamafactory/train/dpo/trainer.py`` ``concatenated_forward`` L219-253: ``model(**batch, return_dict=True,
  use_cache=False).logits.to(torch.float32)``, ``get_batch_logps``, ``split`` of logps and logits (the fp32 logits
  stay referenced until the loss is returned: ``chosen_logits`` / ``rejected_logits`` for the metrics, L311-312);
* ``compute_reference_log_probs`` L255-275: the same forward under ``no_grad`` with the adapters disabled
  (``ref_model`` is None under LoRA);
* ``get_batch_loss_metrics`` L277-318: ``dpo_loss`` with ``pref_loss: sigmoid`` (``-logsigmoid(beta * margin)``);
* ``src/llamafactory/train/trainer_utils.py`` ``get_batch_logps`` L592-636 (copied below).

KTO likewise subclasses TRL 1.16's ``KTOTrainer`` (whose collator builds the ``KL_`` batch) with
``src/llamafactory/train/kto/trainer.py``: ``forward`` L149-181 (fp32 logits, ``get_batch_logps``),
``concatenated_forward`` L184-199 (the target forward with grad, the KL forward under ``no_grad``, chosen /
rejected logits by boolean indexing: copies), ``compute_reference_log_probs`` L202-218 and
``get_batch_loss_metrics`` L221-258 (``kto_loss``: TRL < 1.0's formula, ``logits/*_sum`` metrics).

The live-tensor peak of the second optimizer step is measured as in ``benchmarks/trl_truth.py``.

Run: ``PYTHONPATH=. python benchmarks/llamafactory_truth.py``
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from fitcheck.spec import TrainingSpec

_PATH = Path(__file__).resolve().parent / "trl_truth.py"
_SPEC = importlib.util.spec_from_file_location("trl_truth", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
trl_truth = sys.modules.get("trl_truth") or importlib.util.module_from_spec(_SPEC)
if "trl_truth" not in sys.modules:
    sys.modules["trl_truth"] = trl_truth
    _SPEC.loader.exec_module(trl_truth)

IGNORE_INDEX = -100  # llamafactory/extras/constants.py
PROBE: dict[str, Any] = {"tracker": None, "marks": []}  # optional: (moment, live bytes, peak since last mark)
# LLaMA-Factory's lora_dropout defaults to 0 (hparams/finetuning_args.py) and CustomDPOTrainer disables dropout
LF_LORA = dataclasses.replace(trl_truth.TRL_LORA, dropout=0.0)
CASES = (
    trl_truth.Case("lf dpo LoRA", trl_truth.TrainerKind.DPO, length=48, prompt=32, lora=LF_LORA),
    trl_truth.Case("lf dpo LoRA no-ckpt", trl_truth.TrainerKind.DPO, length=48, prompt=32, lora=LF_LORA, ckpt=False),
    trl_truth.Case("lf dpo LoRA vocab 8000", trl_truth.TrainerKind.DPO, length=48, prompt=32, lora=LF_LORA,
                   vocab=8000),
    trl_truth.Case("lf dpo full implicit ref", trl_truth.TrainerKind.DPO, length=48, prompt=32),
    trl_truth.Case("lf kto LoRA", trl_truth.TrainerKind.KTO, length=48, prompt=32, lora=LF_LORA),
    trl_truth.Case("lf kto LoRA vocab 8000", trl_truth.TrainerKind.KTO, length=48, prompt=32, lora=LF_LORA,
                   vocab=8000),
    trl_truth.Case("lf kto full implicit ref", trl_truth.TrainerKind.KTO, length=48, prompt=32),
)


def spec_for(case: Any) -> TrainingSpec:
    """The case as fitcheck sees it: ``--trainer dpo --loss full-logits``."""
    spec = trl_truth.spec_for(case)
    return dataclasses.replace(spec, activations=dataclasses.replace(spec.activations, loss="full-logits"))


def get_batch_logps(logits: Any, labels: Any) -> tuple[Any, Any]:
    """LLaMA-Factory@ff6d4d1 ``train/trainer_utils.py`` L592-636 (``ld_alpha`` None)."""
    import torch

    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    loss_mask = labels != IGNORE_INDEX
    labels[labels == IGNORE_INDEX] = 0
    per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    valid_length = loss_mask.sum(-1)
    return (per_token_logps * loss_mask).sum(-1), valid_length


def _mark(moment: str) -> None:
    tracker = PROBE["tracker"]
    if tracker is not None:
        PROBE["marks"].append((moment, tracker.current, tracker.peak))
        tracker.reset_peak()


def _trainer_class() -> Any:
    import torch
    import torch.nn.functional as F
    import trl

    class LlamaFactoryDPO(trl.DPOTrainer):  # type: ignore[misc]
        """TRL 1.16's DPOTrainer with LLaMA-Factory's loss path (module docstring)."""

        def _concatenated_forward(self, model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
            batch = {k: v.detach().clone() for k, v in inputs.items()}  # nested_detach(batch, clone=True)
            labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, IGNORE_INDEX)
            all_logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               return_dict=True, use_cache=False).logits.to(torch.float32)
            all_logps, _ = get_batch_logps(all_logits, labels)
            half = batch["input_ids"].size(0) // 2
            chosen_logps, rejected_logps = all_logps.split(half, dim=0)
            chosen_logits, rejected_logits = all_logits.split(half, dim=0)
            return {"chosen_logps": chosen_logps, "rejected_logps": rejected_logps,
                    "chosen_logits": chosen_logits, "rejected_logits": rejected_logits}

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            _mark("before policy")
            out = self._concatenated_forward(model, inputs)
            _mark("policy forward")
            if self.ref_model is None:  # L262-264: PEFT, the base with the adapters disabled
                ref_model, ref_context = model, self.accelerator.unwrap_model(model).disable_adapter()
            else:  # L265-267
                ref_model, ref_context = self.ref_model, contextlib.nullcontext()
            with torch.no_grad(), ref_context:  # L269-275: only the log-probs leave the reference forward
                ref = self._concatenated_forward(ref_model, inputs)
                ref_chosen, ref_rejected = ref["chosen_logps"], ref["rejected_logps"]
                del ref
            _mark("reference forward")
            margin = (out["chosen_logps"] - ref_chosen) - (out["rejected_logps"] - ref_rejected)
            losses = -F.logsigmoid(self.beta * margin)
            _ = out["chosen_logits"].mean().item(), out["rejected_logits"].mean().item()  # L311-312 metrics
            return losses.mean()

    return LlamaFactoryDPO


def _kto_trainer_class() -> Any:
    import torch
    import trl

    class LlamaFactoryKTO(trl.KTOTrainer):  # type: ignore[misc]
        """TRL 1.16's KTOTrainer with LLaMA-Factory's loss path (module docstring)."""

        def _forward(self, model: Any, inputs: dict[str, Any], prefix: str) -> tuple[Any, Any, Any]:
            batch = {k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)}  # L153
            labels = batch[f"{prefix}input_ids"].masked_fill(batch[f"{prefix}completion_mask"] == 0, IGNORE_INDEX)
            logits = model(input_ids=batch[f"{prefix}input_ids"], attention_mask=batch[f"{prefix}attention_mask"],
                           return_dict=True, use_cache=False).logits.to(torch.float32)  # L179
            logps, valid_length = get_batch_logps(logits, labels)
            return logits, logps, logps / valid_length

        def _concatenated_forward(self, model: Any, inputs: dict[str, Any]) -> tuple[Any, ...]:  # L184-199
            target_logits, target_logps, target_logps_avg = self._forward(model, inputs, "")
            with torch.no_grad():
                _, kl_logps, _ = self._forward(model, inputs, "KL_")
            tags = torch.as_tensor(inputs["label"], dtype=torch.bool)
            return (target_logps[tags], target_logps[~tags], target_logits[tags], target_logits[~tags], kl_logps,
                    target_logps_avg[tags])

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            _mark("before policy")
            chosen, rejected, chosen_logits, rejected_logits, kl_logps, _ = self._concatenated_forward(model, inputs)
            _mark("policy forward")
            if self.ref_model is None:  # L206-208
                ref_model, ref_context = model, self.accelerator.unwrap_model(model).disable_adapter()
            else:
                ref_model, ref_context = self.ref_model, contextlib.nullcontext()
            with torch.no_grad(), ref_context:  # L213-216
                ref_chosen, ref_rejected, _, _, ref_kl, _ = self._concatenated_forward(ref_model, inputs)
            _mark("reference forward")
            kl = (kl_logps - ref_kl).mean().clamp(min=0).detach()  # TRL < 1.0 kto_loss
            chosen_losses = 1 - torch.sigmoid(self.beta * ((chosen - ref_chosen) - kl))
            rejected_losses = 1 - torch.sigmoid(self.beta * (kl - (rejected - ref_rejected)))
            losses = torch.cat((chosen_losses, rejected_losses), 0).nanmean()
            _ = chosen_logits.nansum().item(), rejected_logits.nansum().item()  # L252-262 metrics
            return losses

    return LlamaFactoryKTO


def measure(case: Any) -> int:
    """Live-tensor peak of the second optimizer step of LLaMA-Factory's DPO step."""
    import trl
    from transformers import TrainerCallback

    out: dict[str, int] = {}
    PROBE["marks"] = []
    name = "KTOTrainer" if case.trainer is trl_truth.TrainerKind.KTO else "DPOTrainer"
    original = getattr(trl, name)
    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        setattr(trl, name, _kto_trainer_class() if name == "KTOTrainer" else _trainer_class())
        try:
            trainer = trl_truth.build_trainer(case, path)
        finally:
            setattr(trl, name, original)
        state: dict[str, Any] = {"tracker": None}

        class Measure(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == 1:
                    state["tracker"] = trl_truth._start_tracker(trainer)
                    PROBE["tracker"] = state["tracker"]
                return control

            def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                tracker = state["tracker"]
                if tracker is not None and st.global_step == 2:
                    _mark("backward + optimizer")
                    PROBE["tracker"] = None
                    tracker.stop()
                    out["peak"] = max([tracker.peak, *(m[2] for m in PROBE["marks"])])
                    state["tracker"] = None
                return control

        trainer.add_callback(Measure())
        trainer.train()
    return out["peak"]


def main() -> int:
    from fitcheck.core import estimate

    print(f"{'case':28} {'measured':>12} {'estimate':>12} {'error':>8}")
    for case in CASES:
        real = measure(case)
        est = estimate(spec_for(case)).peak_allocated_bytes
        print(f"{case.name:28} {real:12,} {est:12,} {100 * (est - real) / real:+7.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
