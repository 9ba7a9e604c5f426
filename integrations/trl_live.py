"""Recognise a live TRL 1.16 trainer from its config object (and the trainer itself, when reachable).

``FitcheckCallback`` receives the ``args`` (an ``SFTConfig``/``DPOConfig``/``GRPOConfig``/``RewardConfig``) and the
model, never the trainer. The config's class says which trainer runs; its fields give the memory-relevant
settings. The trainer object is found on the call stack (``Trainer.__init__`` calls ``on_init_end``,
``Trainer.train`` calls ``on_train_begin``: a frame whose ``self`` is a ``transformers.Trainer``); from it come the
real lengths of the prepared dataset (the longest row: what a micro-batch pads to at worst) and, once training
starts, the reference model whose weights the measurement must count.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from fitcheck.core.trainers import CONFIG_CLASSES, ReferenceRule, trainer_row
from fitcheck.spec import TrainerKind, TrainerSpec, TrainingSpec, VllmMode


def trainer_kind_of(args: Any) -> TrainerKind:
    """The trainer a config object belongs to (by class, subclasses included); plain Trainer otherwise."""
    for cls in type(args).__mro__:
        if cls.__name__ in CONFIG_CLASSES and cls.__module__.startswith("trl"):
            return CONFIG_CLASSES[cls.__name__]
    return TrainerKind.TRAINER


def find_trainer() -> Any | None:
    """The ``transformers.Trainer`` whose method is on the call stack (None when there is none)."""
    try:
        from transformers import Trainer
    except ImportError:  # pragma: no cover - transformers is what calls the callback
        return None
    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer):
                return candidate
            frame = frame.f_back
    finally:
        del frame
    return None


def _longest(dataset: Any, column: str, limit: int = 100_000) -> int:
    """Length of the longest list in a ``datasets`` column (first ``limit`` rows); 0 when absent."""
    names = getattr(dataset, "column_names", None) or []
    if column not in names:
        return 0
    rows = dataset[column] if len(dataset) <= limit else dataset.select(range(limit))[column]
    return max((len(r) for r in rows), default=0)


def dataset_lengths(kind: TrainerKind, trainer: Any) -> dict[str, int]:
    """Real lengths read off the trainer's prepared train dataset: ``max_seq_length`` / prompt / completion."""
    dataset = getattr(trainer, "train_dataset", None)
    if dataset is None or not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__"):
        return {}  # absent, or a streamed ``datasets.IterableDataset`` (no length, no ``select``): not read
    columns = trainer_row(kind).dataset_columns
    if columns and not trainer_row(kind).prompt_completion:  # Trainer / SFT: input_ids; reward: chosen/rejected
        n = max(_longest(dataset, c) for c in columns)
        return {"max_seq_length": n} if n else {}
    if columns:  # DPO: chosen/rejected ids; KTO: completion_ids (kto_trainer.py _prepare_dataset)
        prompt, completion = _longest(dataset, "prompt_ids"), max(_longest(dataset, c) for c in columns)
        return {"prompt": prompt, "completion": completion} if completion else {}
    if kind is TrainerKind.GRPO:  # prompts stay text until generation: tokenize them as _tokenize_prompts does
        tok = getattr(trainer, "processing_class", None)
        tok = getattr(tok, "tokenizer", tok)
        names = getattr(dataset, "column_names", None) or []
        if tok is None or "prompt" not in names:
            return {}
        prompts = [p for p in dataset.select(range(min(len(dataset), 1000)))["prompt"] if isinstance(p, str)]
        n = max((len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts), default=0)
        return {"prompt": n} if n else {}
    return {}


def trainer_spec_from_args(args: Any, lengths: Mapping[str, int]) -> TrainerSpec:
    """The ``TrainerSpec`` of a live TRL config (TRL 1.16 field names)."""
    kind = trainer_kind_of(args)

    def get(name: str, default: Any = None) -> Any:
        return getattr(args, name, default)

    if kind is TrainerKind.SFT:
        return TrainerSpec(kind=kind, packing=bool(get("packing", False)),
                           padding_free=bool(get("padding_free", False)))
    if trainer_row(kind).reference is ReferenceRule.IN_STEP:  # DPO, KTO
        max_length = get("max_length")
        prompt, completion = int(lengths.get("prompt", 0)), int(lengths.get("completion", 0))
        if max_length and prompt + completion > max_length:  # truncation_mode keep_start: the completion is cut
            completion = max(0, int(max_length) - prompt)
        losses = get("loss_type") or ["sigmoid"]
        return TrainerSpec(kind=kind, prompt_length=prompt, completion_length=completion,
                           precompute_ref_log_probs=bool(get("precompute_ref_log_probs", False)),
                           loss_type=tuple(str(x) for x in (losses if isinstance(losses, list) else [losses])))
    if kind is TrainerKind.GRPO:
        gbs = get("generation_batch_size")
        return TrainerSpec(
            kind=kind, prompt_length=int(lengths.get("prompt", 0)),
            completion_length=int(get("max_completion_length", 0) or 0),
            num_generations=int(get("num_generations", 8) or 8), beta=float(get("beta", 0.0) or 0.0),
            generation_batch_size=int(gbs) if gbs else None,  # global: per device = gbs / processes
            steps_per_generation=get("steps_per_generation"), use_vllm=bool(get("use_vllm", False)),
            vllm_mode=VllmMode(str(get("vllm_mode", "colocate"))),
            vllm_gpu_memory_utilization=float(get("vllm_gpu_memory_utilization", 0.3) or 0.3),
        )
    if kind is TrainerKind.REWARD:
        return TrainerSpec(kind=kind)
    return TrainerSpec()


def reference_model_of(trainer: Any) -> Any | None:
    """The trainer's separate reference model (DPO/GRPO), unwrapped; None when there is none."""
    ref = getattr(trainer, "ref_model", None) if trainer is not None else None
    return getattr(ref, "module", ref)


def with_trainer(spec: TrainingSpec, trainer: TrainerSpec) -> TrainingSpec:
    """``spec`` with its trainer set; DPO/GRPO rows are prompt + completion long when both are known."""
    seq = trainer.prompt_length + trainer.completion_length
    if trainer_row(trainer.kind).prompt_completion and trainer.prompt_length and trainer.completion_length:
        spec = dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, seq_len=seq))
    return dataclasses.replace(spec, trainer=trainer)
