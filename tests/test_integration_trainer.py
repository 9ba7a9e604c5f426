"""FitcheckCallback and preflight: a real tiny Trainer on CPU, strict mode, auto_find_batch_size, 4.x paths."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fitcheck.integrations import spec_build, trainer_estimate  # noqa: E402
from fitcheck.integrations import trainer as fc_trainer  # noqa: E402
from fitcheck.integrations.trainer import DoesNotFitError  # noqa: E402

from fitcheck import FitcheckCallback, preflight  # noqa: E402
from fitcheck.spec import Dtype, Strategy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-llama"
SEQ = 32


class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, vocab: int, n: int = 8) -> None:
        self.data = torch.randint(0, vocab, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def _args(tmp_path: Path, **kw: Any) -> Any:
    base: dict[str, Any] = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                optim="adamw_torch", use_cpu=True, report_to="none", save_strategy="no",
                                logging_strategy="no", disable_tqdm=True)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def _model() -> Any:
    cfg = transformers.AutoConfig.from_pretrained(TINY)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.slow
def test_one_training_run_with_the_callback_records_predicted_vs_measured(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "record.json"
    cb = FitcheckCallback(max_seq_length=SEQ, record_path=str(record))
    model = _model()
    trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=Tokens(1024), callbacks=[cb])
    assert cb.report is not None  # estimated inside Trainer(...), at on_init_end
    spec = cb.report.spec
    assert spec.batch.micro_batch == 2 and spec.batch.seq_len == SEQ
    assert spec.hardware.device_type.value == "cpu" and spec.precision.load_dtype is Dtype.FLOAT32
    assert spec.lora is None and spec.quant is None and spec.freeze is None
    assert cb.report.trainable_params == sum(p.numel() for p in model.parameters())
    trainer.train()
    out = capsys.readouterr().out
    assert "FITS" in out and "fitcheck: step 2: predicted" in out
    data = json.loads(record.read_text())
    assert data["measured"]["device"] == "cpu" and data["measured"]["step"] == 2
    assert data["predicted"]["peak_allocated_bytes"] == cb.report.peak_allocated_bytes
    measured = data["measured"]["live_tensor_peak"]
    # the live tensors of the real step: params + grads + AdamW states + activations; the estimate must be close
    assert measured > 3 * sum(p.numel() * 4 for p in model.parameters())
    assert abs(data["relative_error"]) < 0.05, data


def test_strict_raises_inside_trainer_constructor_before_any_step(tmp_path: Path) -> None:
    cb = FitcheckCallback(strict=True, max_seq_length=SEQ, gpu_memory="1MiB", print_report=False)
    with pytest.raises(DoesNotFitError, match="per GPU"):
        transformers.Trainer(model=_model(), args=_args(tmp_path), train_dataset=Tokens(1024), callbacks=[cb])


def test_non_strict_warns_and_internal_errors_never_break_training(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cb = FitcheckCallback(max_seq_length=SEQ, gpu_memory="1MiB", print_report=False)
    with pytest.warns(UserWarning, match="exceeds"):
        transformers.Trainer(model=_model(), args=_args(tmp_path), train_dataset=Tokens(1024), callbacks=[cb])

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("internal fitcheck bug")

    monkeypatch.setattr(trainer_estimate, "estimate_with", boom)
    cb2 = FitcheckCallback(max_seq_length=SEQ, print_report=False)  # strict fails closed: test_callback_defects
    with pytest.warns(UserWarning, match="internal fitcheck bug"):
        trainer = transformers.Trainer(model=_model(), args=_args(tmp_path, max_steps=1), train_dataset=Tokens(1024),
                                       callbacks=[cb2])
    trainer.train()  # no exception: fitcheck stays out of the way
    assert cb2.report is None


def test_only_the_main_process_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cb = FitcheckCallback(max_seq_length=SEQ)
    state = SimpleNamespace(is_world_process_zero=False)
    cb.on_init_end(_args(tmp_path), state, SimpleNamespace(), model=_model())
    assert cb.report is not None and capsys.readouterr().out == ""
    cb.on_init_end(_args(tmp_path), SimpleNamespace(is_world_process_zero=True), SimpleNamespace(), model=_model())
    assert "FITS" in capsys.readouterr().out


def test_auto_find_batch_size_retries_reestimate_once_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """on_train_begin fires on every retry (trainer.py _inner_training_loop); the report is not reprinted."""
    args = _args(tmp_path, per_device_train_batch_size=8, auto_find_batch_size=True)
    cb = FitcheckCallback(max_seq_length=SEQ)
    model = _model()
    cb.on_init_end(args, SimpleNamespace(is_world_process_zero=True), SimpleNamespace(), model=model)
    first = cb.report
    assert first is not None and first.spec.batch.micro_batch == 8
    capsys.readouterr()
    control = SimpleNamespace()
    cb.on_train_begin(args, SimpleNamespace(is_world_process_zero=True, train_batch_size=8), control, model=model)
    assert cb.report is first and capsys.readouterr().out == ""  # same batch: nothing new
    cb.on_train_begin(args, SimpleNamespace(is_world_process_zero=True, train_batch_size=7), control, model=model)
    out = capsys.readouterr().out
    assert out.count("micro-batch 7 (auto_find_batch_size attempt 2)") == 1 and "allocated per phase" not in out
    assert cb.report is not None and cb.report.spec.batch.micro_batch == 7
    assert cb.report.peak_allocated_bytes < first.peak_allocated_bytes
    cb.on_train_end(args, SimpleNamespace(), control)


def test_preflight_with_config_objects_builds_the_same_run_as_flags() -> None:
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0)
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    report = preflight("meta-llama/Meta-Llama-3-8B", None, peft_config=lora, quantization_config=bnb,
                       gpu="RTX4090-24GB", max_seq_length=1024, per_device_train_batch_size=1)
    spec = report.spec
    assert spec.lora is not None and spec.lora.r == 16 and spec.lora.target_modules == ("all-linear",)
    assert spec.quant is not None and spec.quant.bits == 4 and spec.quant.double_quant
    assert spec.quant.compute_dtype is Dtype.BFLOAT16
    assert report.trainable_params == 41_943_040


def test_preflight_reads_a_live_peft_model_not_the_flags() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_model(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    report = preflight(model, None, max_seq_length=SEQ, device_type="cpu", gpu_memory="8GiB",
                       peft_config=peft.LoraConfig(r=64, target_modules=["o_proj"]))  # ignored: model has LoRA
    assert report.spec.lora is not None and report.spec.lora.r == 4
    assert set(report.spec.lora.target_modules) == {"q_proj", "v_proj"}
    assert report.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_preflight_strict_and_device_map(tmp_path: Path) -> None:
    with pytest.raises(DoesNotFitError):
        preflight("meta-llama/Meta-Llama-3-8B", gpu="RTX4090-24GB", strict=True, max_seq_length=1024)
    report = preflight("meta-llama/Meta-Llama-3-8B", gpu_memory="24GiB", dtype="float32", bf16=True,
                       device_map="auto", max_memory={"0": 24 * 1024**3, "cpu": 200 * 1024**3})
    assert "trainable-offloaded" in {f.code for f in report.errors}


def test_field_findings_eval_batch_and_use_cache(tmp_path: Path) -> None:
    args = _args(tmp_path, per_device_eval_batch_size=16, eval_strategy="steps", eval_steps=10,
                 gradient_checkpointing=True)
    report = preflight(_model(), args, max_seq_length=SEQ, device_type="cpu", gpu_memory="8GiB")
    codes = {f.code for f in report.findings}
    assert "eval-batch-larger" in codes and "use-cache-with-checkpointing" in codes


def test_deepspeed_dict_of_a_live_trainer_is_read(tmp_path: Path) -> None:
    """args.hf_deepspeed_config.config is the dict transformers resolved; the callback reads it directly."""
    args = _args(tmp_path)
    ds = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "train_batch_size": 16, "bf16": {"enabled": True}}
    fake = SimpleNamespace(**{k: getattr(args, k) for k in dir(args) if not k.startswith("_")
                              and not callable(getattr(args, k, None))})
    fake.hf_deepspeed_config = SimpleNamespace(config=ds)
    fake.world_size = 8
    cb = FitcheckCallback(max_seq_length=SEQ, print_report=False, gpu="A100-80GB")
    cb.on_init_end(fake, SimpleNamespace(is_world_process_zero=True), SimpleNamespace(), model=_model())
    assert cb.report is not None
    sh = cb.report.spec.sharding
    assert sh.strategy is Strategy.DEEPSPEED and sh.num_processes == 8
    assert sh.deepspeed is not None and sh.deepspeed.stage == 3


@pytest.mark.parametrize("fsdp", ["full_shard auto_wrap", True])
def test_fsdp_training_arguments_as_transformers_resolves_them(tmp_path: Path, fsdp: object) -> None:
    """transformers 5.23 ``_process_fsdp_args`` turns any ``fsdp`` into True and moves its options into
    ``fsdp_config``; the estimate of a live Trainer's arguments read that True as an unknown option (exit 2 on the
    first real FSDP Trainer, found on an H100: benchmarks/data/tuner_fsdp_gpu.json)."""
    args = _args(tmp_path, fsdp=fsdp, bf16=True,
                 fsdp_config={"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    assert args.fsdp is True and args.fsdp_config["version"] == 2
    spec, _ = trainer_estimate.trainer_spec(args, _model(), gpu="A100-80GB", device_type="cuda")
    fs = spec.sharding.fsdp
    assert spec.sharding.strategy is Strategy.FSDP and fs is not None
    assert fs.version == 2 and fs.reshard_after_forward and fs.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"


def test_transformers_4_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4.x: from_pretrained defaults to float32; TrainingArguments spell gradient_checkpointing and
    evaluation_strategy; models expose is_gradient_checkpointing. Exercised without a second install."""
    monkeypatch.setattr(spec_build, "transformers_major", lambda: 4)
    monkeypatch.setattr(fc_trainer, "transformers_major", lambda: 4)
    r4 = preflight("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", max_seq_length=512)
    assert r4.spec.precision.load_dtype is Dtype.FLOAT32
    args4 = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, gradient_checkpointing=True,
                            evaluation_strategy="no", per_device_eval_batch_size=4, bf16=True, fp16=False,
                            optim="adamw_torch", deepspeed=None, fsdp="", fsdp_config=None, world_size=1,
                            process_index=0, device=torch.device("cpu"), n_gpu=0)
    model = _model()
    cb = FitcheckCallback(max_seq_length=SEQ, print_report=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no internal error may be swallowed here
        cb.on_init_end(args4, SimpleNamespace(), SimpleNamespace(), model=model)  # no is_world_process_zero
    assert cb.report is not None
    spec = cb.report.spec
    assert spec.activations.checkpointing and spec.batch.grad_accum == 2 and spec.batch.micro_batch == 4
    from fitcheck.torch_adapters.live_model import _checkpointing_on

    class Model4:  # transformers 4.x models have only the older property name
        is_gradient_checkpointing = True

    assert _checkpointing_on(Model4()) and not _checkpointing_on(model)


def test_cuda_measurement_path_reads_max_memory_allocated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch.cuda's counters are stubbed; the record must hold them next to the prediction."""
    record = tmp_path / "cuda.json"
    cb = FitcheckCallback(max_seq_length=SEQ, gpu="A100-80GB", record_path=str(record), print_report=False,
                          measure_steps=1)
    cb.on_init_end(_args(tmp_path), SimpleNamespace(is_world_process_zero=True), SimpleNamespace(), model=_model())
    assert cb.report is not None and cb.report.spec.hardware.device_type.value == "cuda"
    cb._device_type = "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 123_456_789)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 150_000_000)
    cb.on_step_end(_args(tmp_path), SimpleNamespace(global_step=1), SimpleNamespace())
    data = json.loads(record.read_text())
    assert data["measured"] == {"device": "cuda", "max_memory_allocated": 123_456_789,
                                "max_memory_reserved": 150_000_000, "step": 1}
    assert data["predicted"]["peak_reserved_bytes"] == cb.report.peak_reserved_bytes
    assert data["gpu"] == "A100-80GB"
    cb.on_step_end(_args(tmp_path), SimpleNamespace(global_step=2), SimpleNamespace())  # past measure_steps: no-op
    assert json.loads(record.read_text())["measured"]["step"] == 1


def _peft_config(kind: str) -> Any:
    peft = pytest.importorskip("peft")
    return {"IA3": peft.IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
            "PROMPT_TUNING": peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
            "BOFT": peft.BOFTConfig(boft_block_size=4, target_modules=["q_proj"])}[kind]


@pytest.mark.parametrize("kind", ["IA3", "PROMPT_TUNING"])
def test_callback_estimates_a_live_non_lora_peft_model_from_its_peft_config(tmp_path: Path, kind: str) -> None:
    """A real Trainer given ``get_peft_model(model, IA3Config / PromptTuningConfig)``: the callback reads the
    adapter from the model's ``peft_config`` (the adapter-config reader) and estimates it as the CLI does (peft's
    model, traced step), within 2 % of the step's live tensors. On main it was estimated silently as a model with
    0 trainable parameters (+10 % / +7 % over the measured peak)."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_model(), _peft_config(kind))
    cb = FitcheckCallback(max_seq_length=SEQ, measure_steps=1, print_report=False)
    trainer = transformers.Trainer(model=model, args=_args(tmp_path, max_steps=1), train_dataset=Tokens(1024),
                                   callbacks=[cb])
    assert cb.report is not None and cb.report.spec.peft is not None and cb.report.spec.peft.peft_type == kind
    assert "peft-adapter-traced" in {f.code for f in cb.report.findings} and not cb.report.pinned
    assert cb.report.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    trainer.train()
    assert cb.measured is not None
    measured = cb.measured["live_tensor_peak"]
    assert cb.report.peak_allocated_bytes == pytest.approx(measured, rel=0.02)


def test_callback_on_a_peft_method_not_modelled_fails_closed_or_warns(tmp_path: Path) -> None:
    """BOFT (refused: fake tensors cannot build it): strict raises inside ``Trainer(...)``; non-strict warns with
    the reason and training runs (never estimated as partly frozen base parameters)."""
    peft = pytest.importorskip("peft")
    from fitcheck.integrations.trainer import EstimateUnavailableError

    model = peft.get_peft_model(_model(), _peft_config("BOFT"))
    with pytest.raises(EstimateUnavailableError, match="BOFT adapters are not modelled"):
        transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=Tokens(1024),
                             callbacks=[FitcheckCallback(strict=True, max_seq_length=SEQ, print_report=False)])
    cb = FitcheckCallback(max_seq_length=SEQ, print_report=False)
    with pytest.warns(UserWarning, match="BOFT adapters are not modelled"):
        trainer = transformers.Trainer(model=model, args=_args(tmp_path, max_steps=1), train_dataset=Tokens(1024),
                                       callbacks=[cb])
    trainer.train()
    assert cb.report is None


def test_preflight_with_a_non_lora_peft_config_estimates_that_adapter() -> None:
    """``preflight(model, peft_config=IA3Config(...))`` before ``get_peft_model``: the adapter, not LoRA."""
    peft = pytest.importorskip("peft")
    model = _model()
    report = preflight(model, None, peft_config=_peft_config("IA3"), max_seq_length=SEQ, device_type="cpu",
                       gpu_memory="8GiB")
    assert report.spec.peft is not None and report.spec.peft.peft_type == "IA3" and report.spec.lora is None
    wrapped = peft.get_peft_model(model, _peft_config("IA3"))
    assert report.trainable_params == sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
