"""Real TRL 1.16 trainers on CPU vs the fitcheck estimate (``device_type=cpu``): signed error of the peak.

Each case builds a tiny Llama from a config dict (random weights, saved to a temporary directory so that TRL can
load its own reference copy by path, as it does for a Hub id), a tiny in-memory dataset
(``datasets.Dataset.from_dict``) whose every sample tokenizes to exactly the stated length (a word-level tokenizer
built in memory: one word = one token), and runs the REAL trainer (``SFTTrainer``, ``DPOTrainer``,
``GRPOTrainer``, ``RewardTrainer``) for two optimizer steps. The second step's live-tensor peak is measured with
fitcheck's dispatch-mode recorder (``fitcheck.torch_adapters.live_tracker``), which counts the policy's and the
reference model's parameters, gradients and optimizer states plus every tensor the step creates. For GRPO the
peak of ``generate`` (the generation phase) is recorded apart from the rest of the step.

The estimate is ``fitcheck.core.estimate.estimate(spec)`` with the case's ``TrainerSpec``.

Run: ``PYTHONPATH=. python benchmarks/trl_truth.py [name-substring ...]``
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

from fitcheck.core.trainers import KTO_DEFAULT_LOSS, TrainerKind, TrainerSpec
from fitcheck.report import Phase
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    OptimizerSpec,
    PrecisionSpec,
    TrainingSpec,
)

VOCAB = 2000
LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": VOCAB,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1,
}
TRL_LORA = LoraSpec(r=16, alpha=32, dropout=0.05, target_modules=("all-linear",))  # TRL ModelConfig defaults
# A family with nn.Dropout modules (GPT2Config defaults: attn_pdrop, resid_pdrop, embd_pdrop 0.1), as tiny
GPT2: dict[str, Any] = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 256, "n_head": 4, "n_layer": 2,
    "n_positions": 1024, "vocab_size": VOCAB, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1,
}


@dataclass(frozen=True)
class Case:
    """One real trainer run.

    Attributes:
        name: Row label.
        trainer: Which TRL trainer.
        batch: ``per_device_train_batch_size`` (prompts x num_generations for GRPO).
        length: SFT/reward: tokens per sample; DPO/GRPO: completion tokens.
        prompt: DPO/GRPO prompt tokens.
        lora: Train a LoRA adapter (peft) instead of the full model.
        ckpt: ``gradient_checkpointing`` (TRL configs default it to True).
        extra: Further TRL config fields.
        vocab: Vocabulary size of the tiny Llama (and of its word-level tokenizer).
        model: The config.json of the tiny model (None: :data:`LLAMA`); ``vocab_size`` is the case's.
    """

    name: str
    trainer: TrainerKind
    batch: int = 2
    length: int = 128
    prompt: int = 0
    lora: LoraSpec | None = None
    ckpt: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    vocab: int = VOCAB
    model: dict[str, Any] | None = None


CASES: tuple[Case, ...] = (
    Case("sft full", TrainerKind.SFT),
    Case("sft full no-ckpt", TrainerKind.SFT, ckpt=False),
    Case("sft LoRA", TrainerKind.SFT, lora=TRL_LORA),
    Case("sft packing padding_free", TrainerKind.SFT, extra={"packing": True, "padding_free": True}),
    Case("dpo full implicit ref", TrainerKind.DPO, length=48, prompt=32),
    Case("dpo LoRA adapters-off ref", TrainerKind.DPO, length=48, prompt=32, lora=TRL_LORA),
    Case("dpo precompute_ref_log_probs", TrainerKind.DPO, length=48, prompt=32,
         extra={"precompute_ref_log_probs": True}),
    Case("dpo rpo_alpha", TrainerKind.DPO, length=48, prompt=32, extra={"rpo_alpha": 1.0}),
    Case("grpo beta 0", TrainerKind.GRPO, batch=4, length=32, prompt=16, extra={"num_generations": 4}),
    Case("grpo beta 0.04", TrainerKind.GRPO, batch=4, length=32, prompt=16,
         extra={"num_generations": 4, "beta": 0.04}),
    Case("reward", TrainerKind.REWARD, length=64),
    Case("kto full implicit ref", TrainerKind.KTO, length=48, prompt=32),
    Case("kto LoRA adapters-off ref", TrainerKind.KTO, length=48, prompt=32, lora=TRL_LORA),
    Case("kto precompute_ref_log_probs", TrainerKind.KTO, length=48, prompt=32,
         extra={"precompute_ref_log_probs": True}),
)


def trainer_spec_for(case: Case) -> TrainerSpec:
    """The TrainerSpec describing a case (TRL defaults for what the case leaves out)."""
    extra = case.extra
    kind = case.trainer
    if kind is TrainerKind.GRPO:
        return TrainerSpec(kind=kind, prompt_length=case.prompt, completion_length=case.length,
                           num_generations=int(extra.get("num_generations", 8)), beta=float(extra.get("beta", 0.0)),
                           steps_per_generation=extra.get("steps_per_generation"))
    if kind in (TrainerKind.DPO, TrainerKind.KTO):
        kto_loss = (str(extra["loss_type"]),) if "loss_type" in extra else KTO_DEFAULT_LOSS
        return TrainerSpec(kind=kind, prompt_length=case.prompt, completion_length=case.length,
                           precompute_ref_log_probs=bool(extra.get("precompute_ref_log_probs", False)),
                           rpo_alpha=extra.get("rpo_alpha"),
                           **({"loss_type": kto_loss} if kind is TrainerKind.KTO else {}))
    return TrainerSpec(kind=kind, packing=bool(extra.get("packing", False)),
                       padding_free=bool(extra.get("padding_free", False)))


def spec_for(case: Case) -> TrainingSpec:
    """The TrainingSpec for a case: bf16 model, TRL's bf16 autocast, AdamW (torch), CPU."""
    from fitcheck.readers import inventory_from_config

    config = {**(case.model or LLAMA), "vocab_size": case.vocab}
    if case.trainer is TrainerKind.REWARD:
        config.update(architectures=[config["architectures"][0].replace("LMHeadModel", "ForCausalLM").replace(
            "ForCausalLM", "ForSequenceClassification")], num_labels=1)
    inv = inventory_from_config(config, case.name, "benchmarks/trl_truth.py")
    seq = case.length + case.prompt
    return TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16),
        optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(micro_batch=case.batch, seq_len=seq,
                        grad_accum=int(case.extra.get("gradient_accumulation_steps", 1))),
        activations=ActivationSpec(checkpointing=case.ckpt, attn_implementation=AttnImpl.SDPA),
        hardware=HardwareSpec(device_type=DeviceType.CPU),
        lora=case.lora,
        trainer=trainer_spec_for(case),
    )


def _tokenizer(vocab_size: int = VOCAB) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _words(n: int, seed: int) -> str:
    return " ".join(f"w{2 + (seed * 31 + j * 7) % (VOCAB - 2)}" for j in range(n))


def _dataset(case: Case, rows: int) -> Any:
    from datasets import Dataset

    kind = case.trainer
    if kind is TrainerKind.SFT:  # SFTTrainer appends EOS: length - 1 words
        return Dataset.from_dict({"text": [_words(case.length - 1, i) for i in range(rows)]})
    if kind is TrainerKind.GRPO:
        return Dataset.from_dict({"prompt": [_words(case.prompt, i) for i in range(rows)]})
    prompt = [_words(case.prompt, i) for i in range(rows)]
    chosen = [" " + _words(case.length - 1, i + 100) for i in range(rows)]  # + EOS appended by the trainer
    rejected = [" " + _words(case.length - 1, i + 200) for i in range(rows)]
    if kind is TrainerKind.KTO:  # unpaired: one completion per row, half desirable
        return Dataset.from_dict({"prompt": prompt, "completion": chosen, "label": [i % 2 == 0 for i in range(rows)]})
    if kind is TrainerKind.REWARD:
        return Dataset.from_dict({"chosen": [_words(case.length - 1, i) for i in range(rows)],
                                  "rejected": [_words(case.length - 1, i + 50) for i in range(rows)]})
    return Dataset.from_dict({"prompt": prompt, "chosen": chosen, "rejected": rejected})


def build_trainer(case: Case, path: str, callbacks: list[Any] | None = None, use_cpu: bool = True) -> Any:
    """The real TRL trainer of a case (model and tokenizer saved under ``path``); ``use_cpu=False``: on the
    accelerator (``benchmarks/trl_gpu.py``; the model is initialised there, then saved, as a checkpoint would be)."""
    import torch
    import trl
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    raw = case.model or LLAMA
    config = AutoConfig.for_model(raw["model_type"],
                                  **{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    config.vocab_size = case.vocab
    torch.manual_seed(0)
    with torch.device("cpu" if use_cpu else "cuda"):  # initialising a real-width model is fast on the GPU
        if case.trainer is TrainerKind.REWARD:
            config.num_labels = 1
            model = AutoModelForSequenceClassification.from_config(config, dtype=torch.bfloat16)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    if not use_cpu:
        torch.cuda.empty_cache()
    tok = _tokenizer(case.vocab)
    tok.save_pretrained(path)
    common: dict[str, Any] = {
        "output_dir": os.path.join(path, "out"), "max_steps": 2, "per_device_train_batch_size": case.batch,
        "report_to": [], "use_cpu": use_cpu, "save_strategy": "no", "logging_steps": 1, "seed": 0,
        "gradient_checkpointing": case.ckpt, "learning_rate": 1e-4, "optim": "adamw_torch",
        "model_init_kwargs": {"dtype": "bfloat16"}, "dataloader_drop_last": True,
    }
    peft = None
    if case.lora is not None:
        peft = LoraConfig(r=case.lora.r, lora_alpha=case.lora.alpha, lora_dropout=case.lora.dropout,
                          target_modules="all-linear",
                          task_type="SEQ_CLS" if case.trainer is TrainerKind.REWARD else "CAUSAL_LM")
    extra = {k: v for k, v in case.extra.items() if k not in ("rpo_alpha", "model_init_kwargs")}
    common["model_init_kwargs"] = {**common["model_init_kwargs"], **case.extra.get("model_init_kwargs", {})}
    kind = case.trainer
    rows = 4 * case.batch
    if kind is TrainerKind.SFT:
        args = trl.SFTConfig(**common, max_length=case.length, **extra)
        return trl.SFTTrainer(model=path, args=args, train_dataset=_dataset(case, rows), processing_class=tok,
                              peft_config=peft, callbacks=callbacks)
    if kind is TrainerKind.DPO:
        if "rpo_alpha" in case.extra:
            extra.update(loss_type=["sigmoid", "sft"], loss_weights=[1.0, float(case.extra["rpo_alpha"])])
        args = trl.DPOConfig(**common, max_length=case.length + case.prompt, **extra)
        return trl.DPOTrainer(model=path, args=args, train_dataset=_dataset(case, rows), processing_class=tok,
                              peft_config=peft, callbacks=callbacks)
    if kind is TrainerKind.GRPO:
        args = trl.GRPOConfig(**common, max_completion_length=case.length,
                              generation_kwargs={"min_new_tokens": case.length}, **extra)
        return trl.GRPOTrainer(model=path, args=args, train_dataset=_dataset(case, rows), processing_class=tok,
                               reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                               peft_config=peft, callbacks=callbacks)
    if kind is TrainerKind.KTO:
        args = trl.KTOConfig(**common, max_length=case.length + case.prompt, **extra)
        return trl.KTOTrainer(model=path, args=args, train_dataset=_dataset(case, rows), processing_class=tok,
                              peft_config=peft, callbacks=callbacks)
    args = trl.RewardConfig(**common, max_length=case.length, **extra)
    return trl.RewardTrainer(model=path, args=args, train_dataset=_dataset(case, rows), processing_class=tok,
                             peft_config=peft, callbacks=callbacks)


def _start_tracker(trainer: Any) -> Any:
    """A live-tensor tracker started on the trainer's model, optimizer and reference model (if any)."""
    from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

    tracker = LiveTensorTracker()
    tracker.track(model_state_tensors(trainer.model, trainer.optimizer))
    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        tracker.track(model_state_tensors(ref))
    return tracker.start()


def measure(case: Case) -> dict[str, int]:
    """Live-tensor peaks of the second optimizer step: ``{"peak": ..., "generation": ...}``."""
    from transformers import TrainerCallback


    out: dict[str, int] = {}

    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = build_trainer(case, path)
        state: dict[str, Any] = {"tracker": None}

        class Measure(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == 1:
                    state["tracker"] = _start_tracker(trainer)
                return control

            def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                tracker = state["tracker"]
                if tracker is not None and st.global_step == 2:
                    tracker.stop()
                    out["peak"] = max(tracker.peak, out.get("generation", 0), out.get("before", 0))
                    out["training"] = tracker.peak
                    state["tracker"] = None
                return control

        if case.trainer is TrainerKind.GRPO:
            generate = trainer._generate

            def timed_generate(*a: Any, **kw: Any) -> Any:
                tracker = state["tracker"]
                if tracker is None:
                    return generate(*a, **kw)
                out["before"] = tracker.peak
                tracker.reset_peak()
                result = generate(*a, **kw)
                out["generation"] = tracker.peak
                tracker.reset_peak()
                return result

            trainer._generate = timed_generate
        trainer.add_callback(Measure())
        trainer.train()
    return out


def measure_backward(case: Case) -> int:
    """Live-tensor peak of the second step's backward AFTER TRL's fused LM head has run its backward.

    The window opens when ``ChunkedLogProbFunction.backward`` (trl/kernels/chunked_logprob.py, TRL 1.16) returns
    and closes at ``on_pre_optimizer_step``: the layers' backward with every gradient so far. It is what the
    estimate's ``Phase.BACKWARD`` total describes (the fused head's own backward is ``Phase.BACKWARD_START``).
    """
    from transformers import TrainerCallback
    from trl.kernels import chunked_logprob


    state: dict[str, Any] = {"tracker": None, "backward": None}
    fn = chunked_logprob.ChunkedLogProbFunction
    original = fn.__dict__["backward"]

    def backward(ctx: Any, *grads: Any) -> Any:
        result = original.__func__(ctx, *grads)
        tracker = state["tracker"]
        if tracker is not None:
            tracker.reset_peak()  # the window opens with the head's gradients handed back
            state["backward"] = tracker.peak
        return result

    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = build_trainer(case, path)

        class Measure(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                if st.global_step == 1:
                    state["tracker"] = _start_tracker(trainer)
                return control

            def on_pre_optimizer_step(self, args: Any, st: Any, control: Any, **kw: Any) -> Any:
                tracker = state["tracker"]
                if tracker is not None and state["backward"] is not None:
                    state["backward"] = tracker.peak
                    tracker.stop()
                    state["tracker"] = None
                return control

        trainer.add_callback(Measure())
        fn.backward = staticmethod(backward)
        try:
            trainer.train()
        finally:
            fn.backward = original
    if state["backward"] is None:
        raise RuntimeError(f"{case.name}: the fused LM head's backward never ran")
    return int(state["backward"])


# The fused-head trainers' backward after the head (measure_backward): a vocabulary whose full-logits gradient
# would stand out (32000, Llama-2's) and enough positions (4 rows x 128 tokens)
BACKWARD_CASES: tuple[Case, ...] = (
    Case("kto backward vocab 32000", TrainerKind.KTO, batch=4, length=96, prompt=32, vocab=32000),
)


# Evaluation phase: (name, trainer, per_device_eval_batch_size, tokens per eval sample); plain Trainer and SFT
EVAL_CASES: tuple[tuple[str, TrainerKind, int, int], ...] = (
    ("eval trainer bs4", TrainerKind.TRAINER, 4, 128),
    ("eval sft bs4", TrainerKind.SFT, 4, 128),
)


def eval_spec_for(kind: TrainerKind, eval_batch: int, length: int) -> TrainingSpec:
    """The spec of an evaluation case (training micro-batch 2 of the same length)."""
    case = Case("eval", TrainerKind.SFT, length=length)
    spec = spec_for(case)
    return dataclasses.replace(spec, trainer=TrainerSpec(kind=kind, eval_batch_size=eval_batch))


def measure_eval(kind: TrainerKind, eval_batch: int, length: int) -> int:
    """Live-tensor peak of ``trainer.evaluate()`` after one training step (weights and optimizer states counted)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments


    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind is TrainerKind.SFT:
            case = Case("eval", TrainerKind.SFT, length=length)
            trainer = build_trainer(case, path)
            trainer.args.per_device_eval_batch_size = eval_batch
            trainer.eval_dataset = trainer.train_dataset
        else:
            config = LlamaConfig(**{k: v for k, v in LLAMA.items() if k not in ("model_type", "architectures")})
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
            ids = [[2 + (i * 7 + j) % (VOCAB - 2) for j in range(length)] for i in range(3 * eval_batch)]
            data = Dataset.from_dict({"input_ids": ids, "labels": ids})
            args = TrainingArguments(output_dir=path, per_device_train_batch_size=2, max_steps=1, report_to=[],
                                     per_device_eval_batch_size=eval_batch, use_cpu=True, save_strategy="no",
                                     optim="adamw_torch", bf16=True, gradient_checkpointing=True)
            trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
        return _evaluate_peak(trainer)


# Evaluation of the other TRL trainers (their own prediction_step): (name, training case, per_device_eval_batch_size,
# compute_metrics given -- prediction_loss_only false)
TRL_EVAL_CASES: tuple[tuple[str, Case, int, bool], ...] = (
    ("eval dpo bs4 implicit ref", Case("eval dpo", TrainerKind.DPO, length=48, prompt=32), 4, False),
    ("eval dpo LoRA bs4", Case("eval dpo lora", TrainerKind.DPO, length=48, prompt=32, lora=TRL_LORA), 4, False),
    ("eval dpo bs4 compute_metrics", Case("eval dpo", TrainerKind.DPO, length=48, prompt=32), 4, True),
    ("eval grpo beta 0.04 bs8", Case("eval grpo", TrainerKind.GRPO, batch=4, length=32, prompt=16,
                                     extra={"num_generations": 4, "beta": 0.04}), 8, False),
    ("eval grpo beta 0 bs8", Case("eval grpo", TrainerKind.GRPO, batch=4, length=32, prompt=16,
                                  extra={"num_generations": 4}), 8, False),
    ("eval reward bs8", Case("eval reward", TrainerKind.REWARD, length=64), 8, False),
    ("eval kto bs8 implicit ref", Case("eval kto", TrainerKind.KTO, length=48, prompt=32), 8, False),
)


def trl_eval_spec_for(case: Case, eval_batch: int, metrics: bool = False) -> TrainingSpec:
    """The spec of a TRL evaluation case: the training case with its evaluation batch."""
    spec = spec_for(case)
    trainer = dataclasses.replace(spec.trainer, eval_batch_size=eval_batch, prediction_loss_only=not metrics,
                                  eval_accumulation_steps=1 if metrics else None)
    return dataclasses.replace(spec, trainer=trainer)


def measure_trl_eval(case: Case, eval_batch: int, metrics: bool = False, one_batch: bool = False) -> int:
    """Live-tensor peak of the real trainer's ``evaluate()`` after one training step (reference model counted).

    ``one_batch``: evaluate one evaluation batch, not the training set (every batch has the same shapes here:
    fixed-length rows, GRPO's ``min_new_tokens``); what the later batches add is their scalar losses and metrics
    (GRPO bs8: 53,895,224 B after one batch, 53,895,480 B after the 8, in 6.6 instead of 17.4 CPU-seconds;
    session 20). The tests take it; the table keeps the whole set."""

    with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = build_trainer(case, path)
        trainer.args.per_device_eval_batch_size = eval_batch
        trainer.eval_dataset = trainer.train_dataset
        if one_batch:  # GRPO: each prompt is evaluated num_generations_eval times (trl 1.16 grpo_trainer.py
            # _get_eval_sampler's RepeatSampler)
            repeat = getattr(trainer, "num_generations_eval", None) or 1
            trainer.eval_dataset = trainer.train_dataset.select(range(eval_batch // repeat))
        if metrics:  # prediction_loss_only false: evaluation_loop gathers the logits for compute_metrics. One
            # evaluation step only: on a CPU run the logits "moved to the CPU" (nested_numpify: an fp32 copy of
            # bf16 logits) stay in the measured process memory, where a GPU run frees them from the device
            trainer.compute_metrics = lambda pred: {}
            trainer.args.eval_accumulation_steps = 1
            trainer.eval_dataset = trainer.train_dataset.select(range(eval_batch))
        return _evaluate_peak(trainer)


def _evaluate_peak(trainer: Any) -> int:
    """One training step, then the live-tensor peak of ``evaluate()`` (weights, optimizer states and a TRL
    reference model counted as resident)."""
    trainer.args.max_steps = 1
    trainer.train()
    tracker = _start_tracker(trainer)
    try:
        trainer.evaluate()
    finally:
        tracker.stop()
    return int(tracker.peak)


def main(argv: list[str]) -> int:
    """Print the table; exit 1 when a row is off by more than 2 %."""
    from fitcheck.core import estimate

    cases = [c for c in CASES if not argv or any(a in c.name for a in argv)]
    print(f"{'case':32} {'real MiB':>10} {'est MiB':>10} {'error':>8}  est peak phase; GRPO: real / est generation MiB")
    worst = 0.0
    for case in cases:
        real = measure(case)
        report = estimate(spec_for(case))
        est = report.peak_allocated_bytes
        err = (est - real["peak"]) / real["peak"] * 100
        worst = max(worst, abs(err))
        gen = ""
        if "generation" in real:
            est_gen = report.phase_totals().get(Phase.GENERATION, 0)
            gen = f"{real['generation'] / 2**20:.3f} / {est_gen / 2**20:.3f}"
        print(f"{case.name:32} {real['peak'] / 2**20:10.3f} {est / 2**20:10.3f} {err:+7.2f}%  "
              f"{report.peak_phase.value}  {gen}", flush=True)
    for name, kind, eval_batch, length in EVAL_CASES:
        if argv and not any(a in name for a in argv):
            continue
        real_eval = measure_eval(kind, eval_batch, length)
        est_eval = estimate(eval_spec_for(kind, eval_batch, length)).phase_totals()[Phase.EVALUATION]
        err = (est_eval - real_eval) / real_eval * 100
        worst = max(worst, abs(err))
        print(f"{name:32} {real_eval / 2**20:10.3f} {est_eval / 2**20:10.3f} {err:+7.2f}%  evaluation", flush=True)
    for name, case, eval_batch, metrics in TRL_EVAL_CASES:
        if argv and not any(a in name for a in argv):
            continue
        real_eval = measure_trl_eval(case, eval_batch, metrics)
        report = estimate(trl_eval_spec_for(case, eval_batch, metrics))
        est_eval = report.phase_totals()[Phase.EVALUATION]
        err = (est_eval - real_eval) / real_eval * 100
        worst = max(worst, abs(err))
        flag = "  (the peak: above training)" if report.peak_phase is Phase.EVALUATION else ""
        print(f"{name:32} {real_eval / 2**20:10.3f} {est_eval / 2**20:10.3f} {err:+7.2f}%  evaluation{flag}",
              flush=True)
    for case in BACKWARD_CASES:
        if argv and not any(a in case.name for a in argv):
            continue
        real_bwd = measure_backward(case)
        est_bwd = estimate(spec_for(case)).phase_totals()[Phase.BACKWARD]
        err = (est_bwd - real_bwd) / real_bwd * 100
        worst = max(worst, abs(err))
        print(f"{case.name:32} {real_bwd / 2**20:10.3f} {est_bwd / 2**20:10.3f} {err:+7.2f}%  during backward "
              "(after the fused head)", flush=True)
    print(f"worst |error| {worst:.2f}%")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))



