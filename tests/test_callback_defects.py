"""The callback and preflight defects of issue 11, each on the real library (a real Trainer, peft, torch modes).

Each test failed on the code before the fix (see the CHANGELOG entry): strict let a run through when no
estimate could be made; a ``peft_config`` with a model without adapters was estimated as full fine-tuning; a
custom module around ``LlamaModel`` was estimated as ``LlamaForCausalLM``; the CPU tracker stayed on torch's
dispatch-mode stack when ``train()`` raised; an error finding was reported as "needs X but has Y" with X < Y.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from fitcheck.integrations.trainer import DoesNotFitError  # noqa: E402

from fitcheck import FitcheckCallback, FitcheckError, preflight  # noqa: E402
from fitcheck.findings import Finding, Severity  # noqa: E402

SEQ = 16
WIDTHS: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, vocab_size=128, max_position_embeddings=64)


class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, fail_at: int | None = None) -> None:
        self.data = torch.randint(0, 128, (8, SEQ), generator=torch.Generator().manual_seed(0))
        self.fail_at = fail_at

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.fail_at is not None:
            raise RuntimeError("broken dataset")
        return {"input_ids": self.data[i], "labels": self.data[i]}


def _args(tmp_path: Path, **kw: Any) -> Any:
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1, optim="adamw_torch", use_cpu=True,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, **kw)


def _llama() -> Any:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**WIDTHS))


class Plain(torch.nn.Module):  # type: ignore[misc]
    """A plain nn.Module language model: no transformers config, nothing to estimate from."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(128, 32)
        self.out = torch.nn.Linear(32, 128)

    def forward(self, input_ids: Any, labels: Any = None) -> dict[str, Any]:
        logits = self.out(self.emb(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()), "logits": logits}


class Wrapper(torch.nn.Module):  # type: ignore[misc]
    """A custom module around LlamaModel with the config attached (a classifier, not LlamaForCausalLM)."""

    def __init__(self) -> None:
        super().__init__()
        cfg = transformers.LlamaConfig(**WIDTHS)
        self.model = transformers.LlamaModel(cfg)
        self.config = cfg
        self.head = torch.nn.Linear(32, 2)

    def forward(self, input_ids: Any, labels: Any = None) -> dict[str, Any]:
        logits = self.head(self.model(input_ids=input_ids).last_hidden_state[:, -1])
        return {"loss": logits.sum() * 0.0, "logits": logits}


def test_strict_fails_closed_when_the_estimate_cannot_be_made(tmp_path: Path) -> None:
    cb = FitcheckCallback(strict=True, max_seq_length=SEQ, print_report=False)
    with pytest.raises(FitcheckError, match="could not be made"):
        transformers.Trainer(model=Plain(), args=_args(tmp_path), train_dataset=Tokens(), callbacks=[cb])
    lenient = FitcheckCallback(max_seq_length=SEQ, print_report=False)
    with pytest.warns(UserWarning, match="skipped"):
        transformers.Trainer(model=Plain(), args=_args(tmp_path), train_dataset=Tokens(), callbacks=[lenient])


def test_preflight_applies_peft_config_to_a_model_without_adapters(tmp_path: Path) -> None:
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = _llama()
    expected = sum(p.numel() for p in peft.get_peft_model(copy.deepcopy(model), lora).parameters()
                   if p.requires_grad)  # what SFTTrainer(model=..., peft_config=...) will train
    report = preflight(model, _args(tmp_path), peft_config=lora, gpu="H100-80GB", max_seq_length=SEQ)
    assert report.spec.lora is not None and report.spec.lora.r == 8
    assert report.trainable_params == expected < report.total_params


def test_a_custom_module_around_llama_model_is_refused_with_a_finding(tmp_path: Path) -> None:
    report = preflight(Wrapper(), _args(tmp_path), gpu="H100-80GB", max_seq_length=SEQ)
    codes = [f.code for f in report.errors]
    assert "model-class-not-modelled" in codes, codes
    cb = FitcheckCallback(max_seq_length=SEQ, gpu="H100-80GB", print_report=False)
    with pytest.warns(UserWarning) as caught:
        transformers.Trainer(model=Wrapper(), args=_args(tmp_path), train_dataset=Tokens(), callbacks=[cb])
    text = " ".join(str(w.message) for w in caught)
    assert "Wrapper" in text and "LlamaForCausalLM" in text
    assert "exceeds" not in text and "but has" not in text  # it fits: the finding is the reason, not the budget


def test_error_messages_say_what_the_finding_says(tmp_path: Path) -> None:
    report = preflight(_llama(), _args(tmp_path), gpu="H100-80GB", max_seq_length=SEQ)
    assert report.fits
    finding = Finding("trainable-offloaded", Severity.ERROR, "trainable parameters sit on the cpu")
    message = str(DoesNotFitError(dataclasses.replace(report, findings=(finding,))))
    assert "trainable parameters sit on the cpu" in message
    assert "but has" not in message and "exceeds" not in message


def _train_raises_and_the_mode_stack_is_restored(trainer: Any) -> None:
    """``trainer.train()`` raises on the broken dataset and leaves torch's dispatch-mode stack as it found it."""
    from torch.utils._python_dispatch import _len_torch_dispatch_stack, _pop_mode

    before = _len_torch_dispatch_stack()
    try:
        with warnings.catch_warnings(), pytest.raises(RuntimeError, match="broken dataset"):
            warnings.simplefilter("ignore")
            trainer.train()
        assert _len_torch_dispatch_stack() == before
    finally:
        while _len_torch_dispatch_stack() > before:  # the old code's leak must not slow the other tests
            _pop_mode()


def test_the_cpu_tracker_leaves_the_mode_stack_when_train_raises(tmp_path: Path) -> None:
    cb = FitcheckCallback(max_seq_length=SEQ, print_report=False)  # CPU: the live-tensor tracker measures
    trainer = transformers.Trainer(model=_llama(), args=_args(tmp_path), train_dataset=Tokens(fail_at=0),
                                   callbacks=[cb])
    _train_raises_and_the_mode_stack_is_restored(trainer)


def test_a_callback_added_after_init_keeps_its_safeguards(tmp_path: Path) -> None:
    """Issue 21: ``trainer.add_callback(FitcheckCallback(strict=True))`` gets no on_init_end; it still fails closed on
    a model it cannot estimate, and its tracker still leaves torch's mode stack when training raises."""
    trainer = transformers.Trainer(model=Plain(), args=_args(tmp_path), train_dataset=Tokens())
    trainer.add_callback(FitcheckCallback(strict=True, max_seq_length=SEQ, print_report=False))
    before_params = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(FitcheckError, match="could not be made"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before_params, trainer.model.parameters(), strict=True))

    trainer = transformers.Trainer(model=_llama(), args=_args(tmp_path), train_dataset=Tokens(fail_at=0))
    trainer.add_callback(FitcheckCallback(max_seq_length=SEQ, print_report=False))
    _train_raises_and_the_mode_stack_is_restored(trainer)


def test_preflight_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    """Issue 21: preflight(None), a misspelt keyword and a non-TrainingArguments ``args`` are refused; use_cpu=True
    estimates the CPU (its RAM), not an H100."""
    with pytest.raises(FitcheckError, match="model_or_config"):
        preflight(None)
    with pytest.raises(FitcheckError, match="did you mean 'max_seq_length'"):
        preflight(_llama().config, max_seq_lenght=131072)
    with pytest.raises(FitcheckError, match="TrainingArguments"):
        preflight(_llama().config, args={"per_device_train_batch_size": 2})
    report = preflight(_llama().config, _args(tmp_path), max_seq_length=SEQ)
    assert report.spec.hardware.device_type.value == "cpu"
    assert report.spec.hardware.gpu_name is None
    assert report.budget_bytes != 85027979264  # not the H100-80GB's total_memory
