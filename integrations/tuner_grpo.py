"""Trial steps of TRL's ``GRPOTrainer``: generation, then a training micro-step, at the trial's micro-batch.

What one GRPO training step allocates (TRL 1.16 trl/trainer/grpo_trainer.py): the train dataloader yields a
*generation batch* of ``per_device_train_batch_size × steps_per_generation`` samples (``get_train_dataloader``;
``RepeatSampler`` repeats each prompt ``num_generations`` times in a row), and ``_prepare_inputs`` — when
``_step % (steps_per_generation × num_iterations) == 0`` or ``_buffered_inputs`` is None — generates completions
for all of it (``_generate_and_score_completions``: ``generate``, the rewards, the old/reference
log-probabilities in chunks of ``per_device_train_batch_size``), splits it into ``steps_per_generation`` slices
of ``per_device_train_batch_size`` rows (``split_tensor_dict``), keeps them in ``_buffered_inputs`` and returns
slice ``_step % steps_per_generation``; ``training_step`` then runs forward + backward on that slice and adds 1
to ``_step``.

A trial therefore runs ``training_step`` with ``_step = 0`` and no buffer on one real generation batch (the
dataset's longest prompt among its first 1,000 rows — a streamed dataset: its first prompts — each repeated
``num_generations`` times as ``RepeatSampler`` repeats them): the
generation at the run's own generation batch, then forward + backward at the trial micro-batch, and (with
accumulation > 1) the next slice from the buffer, as ``train()`` does. Completions are generated at their
worst case: ``min_new_tokens = max_new_tokens`` (``max_completion_length``) for the trials, so an early EOS does
not make a size look cheaper than its longest step; the longest prompt does the same for the prompt side
(TRL 1.16 grpo_trainer.py ``_generate_single_turn`` left-pads a batch's prompts to the longest and does not
truncate them).

The sizes tried keep the generation batch: ``generation_batch_size`` stays, ``steps_per_generation`` becomes
``generation_batch_size / (micro × processes)``; ``GRPOConfig.__post_init__`` refuses a generation batch that is
not a multiple of ``micro × processes`` (``fitcheck.core.trainers.grpo_batch.grpo_batch_error`` holds that rule,
and the tuner filters its sizes with it), so only those sizes are tried. The ratio
``steps_per_generation / gradient_accumulation_steps`` (generations per optimizer step) is unchanged, as are the
prompts of each generation round.

:class:`GRPOTrialSession` restores, on top of what :class:`~fitcheck.integrations.tuner_trial.TrialSession`
restores (RNG — generation samples with torch's — gradients, optimizer, ``state``, ``_metrics``): every trainer
attribute a step rebinds (``_step``, ``_buffered_inputs``, ``_current_train_step_time``, ``_last_loaded_step``,
``entropy_coef`` and its window, tool/environment lists, the generation config), by a snapshot of the trainer's
``__dict__``, the completion logs it appends to (``_logs``, ``_pending_extra_logs``) by deep copies, and the
batch fields of ``trainer.args``.
"""

from __future__ import annotations

import copy
from typing import Any

from fitcheck.integrations.tuner_batch import steps_per_generation
from fitcheck.integrations.tuner_engine import EngineTrialSession
from fitcheck.integrations.tuner_fsdp import FsdpTrialSession
from fitcheck.integrations.tuner_trial import TRAINER_BOOKKEEPING, TrialSession

# GRPOTrainer containers a step appends to in place (``_generate_and_score_completions``): deep-copied.
_APPENDED = ("_logs", "_pending_extra_logs")
# GRPOConfig fields a trial sets (its shape) and the session puts back.
_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
         "generation_batch_size")


def is_grpo_trainer(trainer: Any) -> bool:
    """True for TRL's GRPOTrainer (and trainers built the same way: a generation buffer, a step counter)."""
    return hasattr(trainer, "_buffered_inputs") and hasattr(trainer, "_generate_and_score_completions") \
        and hasattr(getattr(trainer, "args", None), "steps_per_generation")


class _GRPOTrial:
    """What a GRPO trial adds to a session (plain or DeepSpeed engine): the snapshot of everything a GRPO step
    rebinds, worst-case generation, the generation batch from the longest prompt. Mixed in before the session."""

    trainer: Any
    _longest: int | None

    def __enter__(self) -> Any:
        t = self.trainer
        self._longest: int | None = None
        self._dict = dict(vars(t))
        self._appended = {n: copy.deepcopy(getattr(t, n)) for n in _APPENDED if hasattr(t, n)}
        self._args = {n: getattr(t.args, n) for n in _ARGS}
        super().__enter__()  # type: ignore[misc]  # the session class mixed in after this one
        self._worst_case_generation()
        return self

    def __exit__(self, *exc: object) -> None:
        t = self.trainer
        try:
            super().__exit__(*exc)  # type: ignore[misc]
        finally:
            now = vars(t)
            for name in [n for n in now if n not in self._dict]:
                delattr(t, name)
            for name, value in self._dict.items():
                if name not in TRAINER_BOOKKEEPING and now.get(name) is not value:
                    setattr(t, name, value)
            for name, value in self._appended.items():
                setattr(t, name, value)
            for name, value in self._args.items():
                setattr(t.args, name, value)

    def _worst_case_generation(self) -> None:
        """Every completion ``max_new_tokens`` long for the trials (copies; the originals come back on exit)."""
        t = self.trainer
        config = getattr(t, "generation_config", None)
        longest = getattr(config, "max_new_tokens", None)
        if config is None or not longest:
            return
        config = copy.deepcopy(config)
        config.min_new_tokens = longest
        t.generation_config = config
        kwargs = getattr(t, "generation_kwargs", None)
        if isinstance(kwargs, dict):
            t.generation_kwargs = {**kwargs, "min_new_tokens": longest}

    def _batch(self, micro: int) -> Any:
        """One generation batch (``micro × steps_per_generation`` samples), as GRPO's dataloader yields it."""
        t = self.trainer
        dataset = t.train_dataset
        if dataset is None:
            raise ValueError("the GRPOTrainer has no train_dataset: the tuner generates from its prompts")
        n = micro * int(t.args.steps_per_generation)
        repeat = int(getattr(t, "num_generations", 1) or 1)
        import torch

        prompts: list[Any] = []
        if not isinstance(dataset, torch.utils.data.IterableDataset) and hasattr(dataset, "__len__"):
            size = len(dataset)
            if size == 0:
                raise ValueError("the GRPOTrainer's train_dataset is empty")
            longest = dataset[self._longest_row()]
            prompts = [longest] * -(-n // repeat)
        else:
            for sample in dataset:
                prompts.append(sample)
                if len(prompts) * repeat >= n:
                    break
            if not prompts:
                raise ValueError("the GRPOTrainer's train_dataset is empty")
            prompts = [prompts[i % len(prompts)] for i in range(-(-n // repeat))]
        samples = [p for p in prompts for _ in range(repeat)][:n]  # RepeatSampler: mini_repeat_count in a row
        return t.data_collator(samples)

    def _longest_row(self) -> int:
        """Index of the longest prompt among the first 1,000 rows (tokenized as ``dataset_lengths`` does).

        GRPO pads the prompts of a generation batch to the longest one (left padding) and TRL 1.16 does not
        truncate them, so a batch of the longest prompt is the worst case a generation round can meet.
        Prompts that are not text (conversations) are ranked by the length of their ``str``.
        """
        if self._longest is None:
            t = self.trainer
            dataset = t.train_dataset
            tok = getattr(t, "processing_class", None)
            tok = getattr(tok, "tokenizer", tok)
            best, index = -1, 0
            for i in range(min(len(dataset), 1000)):
                prompt = dataset[i].get("prompt", "") if isinstance(dataset[i], dict) else dataset[i]
                if isinstance(prompt, str) and callable(tok):
                    length = len(tok(prompt, add_special_tokens=False)["input_ids"])
                else:
                    length = len(str(prompt))
                if length > best:
                    best, index = length, i
            self._longest = index
        return self._longest


class GRPOTrialSession(_GRPOTrial, TrialSession):  # type: ignore[misc]  # fitcheck.integrations.* is Any to mypy
    """Trial steps of a ``GRPOTrainer``; everything a step changes is put back when the ``with`` block ends."""

    def _before_trial(self, micro: int, grad_accum: int) -> None:
        """The trial's shape in ``args``; the step counter and buffer as at the start of a generation round."""
        t = self.trainer
        t.args.steps_per_generation = steps_per_generation(t.args, micro)
        t.args.per_device_train_batch_size = micro
        t.args.gradient_accumulation_steps = grad_accum
        if hasattr(t, "_train_batch_size"):
            t._train_batch_size = micro
        t._step = 0
        t._buffered_inputs = None
        super()._before_trial(micro, grad_accum)

    def _clear(self) -> None:
        """Drop the trial's gradients, optimizer state and generation buffer."""
        self.trainer._buffered_inputs = None
        super()._clear()


class _GRPOOnPrepared:
    """GRPO on a session that prepares the Trainer per trial (DeepSpeed engine, FSDP): each of the session's step
    sequences starts a generation round as ``train()`` does (``_step`` 0, no buffer: ``_prepare_inputs``
    generates the generation batch on the prepared model, then trains slice 0; the next micro-step trains slice 1
    from the buffer). TRL 1.16 ``GRPOTrainer`` generates under ``unwrap_model_for_generation(self.model_wrapped,
    ...)``, the model ``_prepare_for_training`` set (ZeRO-3: gathered parameters; FSDP2: ``generate`` registered
    as an FSDP forward method by transformers 5.23 ``_prepare_for_training``)."""

    trainer: Any

    def _prepare(self, micro: int, grad_accum: int) -> Any:
        self.trainer._buffered_inputs = None
        return super()._prepare(micro, grad_accum)  # type: ignore[misc]  # set_trainer_micro_batch: spg follows

    def _micro_steps(self, micro: int, n: int) -> None:
        t = self.trainer
        t._step = 0  # the start of a generation round
        t._buffered_inputs = None
        super()._micro_steps(micro, n)  # type: ignore[misc]

    def _teardown(self) -> None:
        self.trainer._buffered_inputs = None  # the generation batch's tensors
        super()._teardown()  # type: ignore[misc]


class GRPOEngineTrialSession(_GRPOTrial, _GRPOOnPrepared, EngineTrialSession):  # type: ignore[misc]
    """GRPO trial steps on a DeepSpeed engine (ZeRO-1/2/3) prepared as ``Trainer.train`` prepares it (tested on
    CPU gloo with ZeRO-2 and ZeRO-3, tests/test_tuner_grpo.py)."""


class GRPOFsdpTrialSession(_GRPOTrial, _GRPOOnPrepared, FsdpTrialSession):  # type: ignore[misc]
    """GRPO trial steps on the Trainer's own FSDP2/FSDP1 preparation (tested on CPU gloo, tests/test_tuner_grpo.py)."""

    _KEPT = ("model", "model_wrapped", "_signature_columns")

    def __exit__(self, *exc: object) -> None:
        """As the GRPO session, except what the FSDP session leaves as ``train()`` would: under FSDP1 the wrapper
        as ``model`` / ``model_wrapped`` (the snapshot of the Trainer's ``__dict__`` would put the unwrapped
        module back, which ``train()`` then wraps a second time: "FSDP auto wrapping requires modules to not
        already have FSDP applied"), and the signature columns read from the unwrapped model."""
        t = self.trainer
        kept = {name: getattr(t, name) for name in self._KEPT if hasattr(t, name)}
        super().__exit__(*exc)
        for name, value in kept.items():
            setattr(t, name, value)
