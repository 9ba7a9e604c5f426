"""tune_micro_batch on a real TRL 1.16 DPOTrainer (CPU, tiny random Llama saved to a temporary folder so TRL can
load its reference copy by path; in-memory preference rows).

DPO's collator stacks chosen and rejected: ``micro`` samples are ``2 × micro`` rows. The trial batch used to be
cut to ``micro`` rows, so a trial measured half a DPO step (peak 35.1 MB against 69.7 MB for the real step at
micro-batch 8) and the tuner set a size that ran out of memory in ``train()``. Under a budget 0.3% above the real
peak at 4 x 2 (plus the reference model's weights) the tuner must land on 4 x 2, train there without running out
of memory, and end with the weights of an untuned run at 4 x 2. The CPU trial peak counts the reference model.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fitcheck.integrations.tuner import tune_micro_batch  # noqa: E402
from tuner_budget import UNBOUNDED, WIDTHS, _tokenizer, budget_for  # noqa: E402

SEQ = 32
STEPS = 2


def _words(n: int, i: int) -> str:
    return " ".join(f"t{2 + (7 * i + j) % 250}" for j in range(n))


def build_dpo(path: Path, micro: int, accum: int) -> Any:
    """A DPOTrainer on a seeded tiny Llama (saved under ``path``: TRL loads the reference model from there)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**WIDTHS, "attention_dropout": 0.1}))
    model.save_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    data = datasets.Dataset.from_dict({"prompt": [_words(8, i) for i in range(32)],
                                       "chosen": [" " + _words(8, i + 100) for i in range(32)],
                                       "rejected": [" " + _words(8, i + 200) for i in range(32)]})
    args = trl.DPOConfig(output_dir=str(path / "out"), per_device_train_batch_size=micro,
                         gradient_accumulation_steps=accum, max_steps=STEPS, max_length=SEQ, use_cpu=True,
                         report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
                         optim="adamw_torch", bf16=False)
    return trl.DPOTrainer(model=model, args=args, train_dataset=data, processing_class=_tokenizer())


def test_dpo_trial_counts_chosen_and_rejected_rows(tmp_path: Path) -> None:
    reference = build_dpo(tmp_path / "peak", 4, 2)
    with budget_for(reference.model, UNBOUNDED) as mode:
        reference.train()
    # the reference model's weights are resident too: the CPU trial counts them, BudgetMode (policy only) does not
    ref_bytes = sum(p.numel() * p.element_size() for p in reference.ref_model.parameters())
    budget = int(mode.peak * 1.003) + ref_bytes
    tuned = build_dpo(tmp_path / "tuned", 8, 1)
    with budget_for(tuned.model, budget):
        result = tune_micro_batch(tuned, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
    assert (result.micro_batch, result.grad_accum) == (4, 2), result.table()
    if result.predicted_micro_batch == 4:
        assert len(result.trials) <= 2, result.table()
    fitting = next(t for t in result.trials if t.fits)
    assert fitting.peak_bytes is not None and fitting.peak_bytes >= ref_bytes + 0.99 * mode.peak
    with budget_for(tuned.model, budget) as mode:
        tuned.train()
    assert mode.ooms == 0 and tuned.state.global_step == STEPS
    untuned = build_dpo(tmp_path / "untuned", 4, 2)
    untuned.train()
    a, b = dict(tuned.model.named_parameters()), dict(untuned.model.named_parameters())
    assert all(torch.equal(a[n], b[n]) for n in a)
