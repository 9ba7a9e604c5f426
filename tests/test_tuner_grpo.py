"""tune_micro_batch on a real TRL 1.16 GRPOTrainer (CPU, tiny random Llama, in-memory prompts; issue 21).

Before: ``dict(batch)`` on GRPO's list batch raised ValueError in the first trial, ``training_step`` was called
without ``num_items_in_batch`` (GRPO's has no default), and nothing restored ``_step`` / ``_buffered_inputs``.
Now a trial generates the run's generation batch and trains from its buffer; the size found is the real maximum
under a simulated budget, only sizes GRPOConfig accepts are tried, everything a GRPO step changes is put back,
and training afterwards ends with the weights of an untuned run at that size.
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

from fitcheck.integrations.tuner import set_trainer_micro_batch, tune_micro_batch  # noqa: E402
from tuner_budget import UNBOUNDED, WIDTHS, _tokenizer, budget_for  # noqa: E402

COMPLETION = 8
SEQ = 20  # prompt (8-12 words) + completion


def build_grpo(out: str, micro: int, accum: int, max_steps: int = 2, stream: bool = False, spread: int = 1,
               **extra: Any) -> Any:
    """A GRPOTrainer (4 generations per prompt, attention dropout on) on a seeded tiny Llama.

    Prompts are 10 words (``spread`` 1: every prompt as long as the longest, so two real steps meet the worst
    case the trials run at), or 8 to 8 + ``spread`` - 1 words.
    """
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**WIDTHS, "attention_dropout": 0.1}))
    words = [10] * 32 if spread == 1 else [8 + i % spread for i in range(32)]
    prompts = [" ".join(f"t{2 + (7 * i + j) % 250}" for j in range(n)) for i, n in enumerate(words)]
    args = trl.GRPOConfig(
        output_dir=out, per_device_train_batch_size=micro, gradient_accumulation_steps=accum, max_steps=max_steps,
        num_generations=4, max_completion_length=COMPLETION, use_cpu=True, report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True, seed=0, optim="adamw_torch", bf16=False, **extra,
    )
    data = datasets.Dataset.from_dict({"prompt": prompts})
    return trl.GRPOTrainer(model=model, args=args, train_dataset=data.to_iterable_dataset() if stream else data,
                           processing_class=_tokenizer(),
                           reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions])


def real_peak(out: str, micro: int, accum: int) -> int:
    trainer = build_grpo(out, micro, accum)
    with budget_for(trainer.model, UNBOUNDED) as mode:
        trainer.train()
    return int(mode.peak)


def test_grpo_tuner_finds_the_max_restores_the_trainer_and_trains_like_an_untuned_run(tmp_path: Path) -> None:
    out = str(tmp_path)
    budget = (real_peak(out, 2, 4) + real_peak(out, 4, 2)) // 2  # the largest micro-batch that trains is 2
    tuned = build_grpo(out, 8, 1)
    assert (tuned.args.generation_batch_size, tuned.args.steps_per_generation) == (8, 1)
    rng = torch.get_rng_state()
    with budget_for(tuned.model, budget):
        result = tune_micro_batch(tuned, gpu_memory=budget, device_type="cpu", max_seq_length=SEQ)
    assert (result.micro_batch, result.grad_accum) == (2, 4), result.table()
    assert all(t.fits == (t.micro_batch <= 2) for t in result.trials), result.table()
    if result.predicted_micro_batch == 2:
        assert len(result.trials) <= 2, result.table()
    # the generation batch is kept, its slices follow the micro-batch (GRPOConfig's default relation)
    assert (tuned.args.per_device_train_batch_size, tuned.args.gradient_accumulation_steps) == (2, 4)
    assert (tuned.args.generation_batch_size, tuned.args.steps_per_generation) == (8, 4)
    # what a GRPO step changes is back
    assert tuned._step == 0 and tuned._buffered_inputs is None
    assert tuned.generation_config.min_new_tokens is None
    assert not tuned._logs["prompt"] and not tuned._metrics["train"]
    assert tuned.optimizer is None and all(p.grad is None for p in tuned.model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    tuned.train()
    untuned = build_grpo(out, 2, 4)
    untuned.train()
    a, b = dict(tuned.model.named_parameters()), dict(untuned.model.named_parameters())
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_grpo_sizes_grpoconfig_refuses_are_not_tried(tmp_path: Path) -> None:
    # 4 x 2 with one slice per generation: generation batch 4; micro-batch 8 keeps the per-GPU batch of 8, but
    # GRPOConfig refuses a generation batch that is not a multiple of the micro-batch
    with pytest.raises(ValueError, match="generation_batch_size"):
        trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, generation_batch_size=4,
                       num_generations=4, use_cpu=True, report_to="none")
    trainer = build_grpo(str(tmp_path), 4, 2, steps_per_generation=1)
    assert trainer.args.generation_batch_size == 4
    with budget_for(trainer.model, UNBOUNDED):
        result = tune_micro_batch(trainer, gpu_memory=10**9, device_type="cpu", max_seq_length=SEQ)
    assert (result.micro_batch, result.grad_accum) == (4, 2), result.table()
    assert all(t.micro_batch != 8 for t in result.trials)
    assert trainer.args.steps_per_generation == 1
    with pytest.raises(ValueError, match="generation_batch_size"):
        set_trainer_micro_batch(trainer, 8)
    assert trainer.args.per_device_train_batch_size == 4


def test_grpo_on_a_streamed_dataset(tmp_path: Path) -> None:
    """A ``datasets.IterableDataset`` (no length): its lengths are not read (``dataset_lengths`` called ``len``
    on it), the trial takes the first prompts it yields, and training runs after tuning."""
    trainer = build_grpo(str(tmp_path), 4, 2, stream=True)
    with budget_for(trainer.model, UNBOUNDED):
        result = tune_micro_batch(trainer, gpu_memory=10**9, device_type="cpu", max_seq_length=SEQ)
    assert (result.micro_batch, result.grad_accum) == (8, 1), result.table()
    assert trainer.train().global_step == 2


def test_grpo_trials_generate_from_the_longest_prompt(tmp_path: Path) -> None:
    """GRPO left-pads a generation batch's prompts to the longest and does not truncate them (TRL 1.16), so the
    trial's generation batch is the dataset's longest prompt, repeated."""
    from fitcheck.integrations.tuner_grpo import GRPOTrialSession

    trainer = build_grpo(str(tmp_path), 4, 2, spread=5)
    prompts = list(trainer.train_dataset["prompt"])
    tok = trainer.processing_class
    longest = max(prompts, key=lambda p: len(tok(p, add_special_tokens=False)["input_ids"]))
    assert len(set(map(len, prompts))) > 1
    with GRPOTrialSession(trainer, SEQ) as session:
        session._before_trial(2, 4)
        batch = session._batch(2)
    assert len(batch) == 8 and {row["prompt"] for row in batch} == {longest}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["zero2", "zero3", "fsdp2", "fsdp1"])
def test_grpo_under_deepspeed_or_fsdp_lands_on_the_max_and_trains_like_an_untuned_run(
        tmp_path: Path, free_port: int, backend: str) -> None:
    """GRPO trials on a real ZeRO-2/3 engine or the Trainer's FSDP2/FSDP1 preparation (all refused before session
    7): 2 trials, the true maximum under the simulated allocator, no out-of-memory in train() at that size, the
    weights of an untuned run at 2 × 4. ZeRO-3 also failed before the ``ds_active_sub_modules`` reset
    (tuner_engine): after the trial at 4 ran out of memory inside a forward, train()'s engine raised "Cannot free
    a ZeRO-3 parameter while it is still active in submodules"; FSDP1 before ``GRPOFsdpTrialSession.__exit__``
    kept the wrapper: "FSDP auto wrapping requires modules to not already have FSDP applied"."""
    import json
    import os
    import subprocess

    pytest.importorskip("deepspeed" if backend.startswith("zero") else "accelerate")
    script = Path(__file__).resolve().parent / "grpo_sharded_cpu.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    proc = subprocess.run([sys.executable, str(script), str(free_port), str(tmp_path), backend],
                          capture_output=True, text=True, timeout=600, env={**env, "OMP_NUM_THREADS": "1"},
                          check=False)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("GRPO_SHARDED_RESULT ")]
    assert rows, proc.stderr[-3000:]
    r = json.loads(rows[0][len("GRPO_SHARDED_RESULT "):])
    assert r["sharded"]
    low, high = r["peaks"]
    assert [t[:2] for t in r["trials"]] == [[2, True], [4, False]] and r["predicted"] == 2
    assert low * 0.99 <= r["trials"][0][2] <= high  # the trial costs what a real 2 x 4 GRPO step costs
    assert r["batch"] == [2, 4, 4, 8]  # micro, accumulation, steps_per_generation, generation batch kept
    assert all(r["restored"])  # _step, buffer, generation config, optimizer, RNG
    assert r["train_ooms"] == 0 and r["steps"] == 2
    assert r["equal"]
