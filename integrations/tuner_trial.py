"""Trial steps of a ``transformers.Trainer`` that measure a micro-batch without training the model.

A trial runs what one optimizer step of ``Trainer.train`` allocates, at the real shapes:

* forward + backward through ``trainer.training_step`` (the Trainer's — or TRL's — own loss, input preparation
  and ``accelerator.backward``) on a real batch: the first samples of ``trainer.train_dataset`` through
  ``trainer.data_collator``, each 2-D tensor tiled along its sequence axis to the worst-case length (real token
  ids, attention mask all ones: no padding shortcut). With gradient accumulation > 1 it runs two micro-steps,
  so the second backward runs with the first one's gradients held (the accumulation buffer);
* the optimizer's state at its real shapes, resident through forward and backward as it is from the second
  training step on (the steady state fitcheck estimates), then the optimizer step's own temporaries. Both
  come from steps that cannot move the parameters: every gradient is zero (zeroed in place) and every param
  group's ``lr`` and ``weight_decay`` are 0 for that step (AdamW's update is then ``p·(1 − 0) + (−0)·m/(√v + ε)``
  with ``m = 0``: ``p`` bit for bit; torch/optim/adamw.py, torch 2.13). The state is dropped after the trial.

:class:`TrialSession` keeps what a trial could change and puts it back when the session ends: gradients (by
reference), the optimizer (a user-given one keeps its state object and hyper-parameters; one created for the
trials is dropped), the global RNG states (torch, CUDA, numpy, python), floating buffers, the model's train/eval
mode, activation checkpointing (turned on for the trials as ``train()`` turns it on, off again after), and the
Trainer's bookkeeping (``state``, ``control``, TRL's ``_metrics``/``_total_train_tokens``).
The train dataloader is never built (``get_train_dataloader`` registers it with the accelerator), so training
starts where it would have without tuning. Nothing copies the parameters.

Under DDP (``torch.distributed`` initialised with more than one process) the model is wrapped in
``DistributedDataParallel`` for the trials (its gradient buckets are real memory) and each trial runs under
``no_sync()`` (no collective inside a step that may fail on one rank); the verdict of each trial is
all-reduced (MIN), as is the starting prediction, so every rank takes the same search path and the same answer.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

# Trainer attributes a training step (Trainer or TRL SFTTrainer.compute_loss) may write: restored after the trials.
TRAINER_BOOKKEEPING = ("state", "control", "_metrics", "_total_train_tokens", "current_gradient_accumulation_steps")


@dataclass(frozen=True)
class TrialMeasure:
    """What one trial measured.

    Attributes:
        peak_bytes: ``torch.cuda.max_memory_allocated`` over the trial (CUDA), or the live-tensor peak (CPU).
        peak_source: Which of the two.
    """

    peak_bytes: int
    peak_source: str


def distributed_world() -> int:
    """Processes in the default ``torch.distributed`` group (1 when it is not initialised)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def all_ranks_min(value: int, device: Any) -> int:
    """The smallest ``value`` over the ranks (an all-reduce MIN when ``torch.distributed`` is initialised)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    on = device if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([value], dtype=torch.int64, device=on)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return int(flag.item())


def all_ranks_ok(ok: bool, device: Any) -> bool:
    """``ok`` on every rank (an all-reduce MIN when ``torch.distributed`` is initialised; else ``ok``)."""
    return bool(all_ranks_min(1 if ok else 0, device))


def save_rng_state() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        out["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        out["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with torch wheels
        pass
    return out


def restore_rng_state(saved: Mapping[str, Any]) -> None:
    import torch

    torch.set_rng_state(saved["torch"])
    random.setstate(saved["python"])
    if "cuda" in saved:
        torch.cuda.set_rng_state_all(saved["cuda"])
    if "numpy" in saved:
        import numpy as np

        np.random.set_state(saved["numpy"])


def _inner_optimizer(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the torch one


def _tile(value: Any, seq_len: int) -> Any:
    """A batch tensor with, for 2-D ones, ``seq_len`` columns (tiled along the sequence).

    Rows are the collator's own: ``micro`` samples collate to ``micro`` rows for most trainers but to
    ``2 × micro`` for TRL's DPOTrainer (chosen and rejected stacked, trl/trainer/dpo_trainer.py
    ``DataCollatorForPreference``); cutting them to ``micro`` measured half a DPO step.
    """
    import torch

    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    if value.dim() == 2 and value.shape[1] < seq_len:
        reps = -(-seq_len // value.shape[1])
        value = value.repeat(1, reps)[:, :seq_len]
    return value


def trial_batch(trainer: Any, micro: int, seq_len: int) -> Any:
    """``micro`` real samples of the train dataset, collated as the Trainer collates them, at ``seq_len``.

    The samples are the dataset's first ones (an iterable dataset: the first ones it yields), cycled when
    the dataset is smaller than ``micro``; 2-D tensors (ids, mask, labels, position ids) shorter than
    ``seq_len`` are tiled along the sequence to it.

    Raises:
        ValueError: The Trainer has no train dataset.
    """
    import torch

    dataset = trainer.train_dataset
    if dataset is None:
        raise ValueError("the Trainer has no train_dataset: the tuner measures a real batch from it")
    collator = trainer.data_collator
    try:
        import datasets  # type: ignore[import-untyped]

        if isinstance(dataset, datasets.Dataset) and hasattr(trainer, "_remove_unused_columns"):
            dataset = trainer._remove_unused_columns(dataset, description="training")
        elif hasattr(trainer, "_get_collator_with_removed_columns"):
            collator = trainer._get_collator_with_removed_columns(collator, description="training")
    except ImportError:  # pragma: no cover - datasets is a transformers dependency
        pass
    samples: list[Any] = []
    if isinstance(dataset, torch.utils.data.IterableDataset):
        for sample in dataset:
            samples.append(sample)
            if len(samples) >= micro:
                break
    else:
        n = len(dataset)
        samples = [dataset[i % n] for i in range(min(micro, n))]
    if not samples:
        raise ValueError("the Trainer's train_dataset is empty")
    samples = [samples[i % len(samples)] for i in range(micro)]  # a dataset smaller than micro: cycled
    batch = collator(samples)
    if not isinstance(batch, Mapping):  # a collator that keeps the samples (TRL's GRPO ``identity``): as is
        return batch
    return {k: _tile(v, seq_len) for k, v in dict(batch).items()}


def _checkpointing_on(model: Any) -> bool:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or hasattr(model, name):
            return bool(getattr(model, name, False))
    return False


def enable_checkpointing(trainer: Any) -> bool:
    """Turn activation checkpointing on as ``Trainer.train`` does (True when this call turned it on).

    transformers 5.23 trainer.py ``train``: ``args.activation_checkpointing`` → ``model.activation_checkpointing_
    enable(activation_checkpointing_kwargs=..., every_n_layers=..., offload=...)``, else the deprecated
    ``gradient_checkpointing_enable``; 4.x ``_inner_training_loop``: ``args.gradient_checkpointing`` →
    ``gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)``.
    """
    args, model = trainer.args, trainer.model
    on = getattr(args, "activation_checkpointing", None)
    if on is None:
        on = getattr(args, "gradient_checkpointing", False)
    if not on or _checkpointing_on(model):
        return False
    kwargs = dict(getattr(args, "activation_checkpointing_kwargs", None)
                  or getattr(args, "gradient_checkpointing_kwargs", None) or {})
    every = kwargs.pop("every_n_layers", 1)
    offload = kwargs.pop("offload", False)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None,
                                              every_n_layers=every, offload=offload)
    elif hasattr(args, "activation_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None, every_n_layers=every,
                                            offload=offload)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
    return True


def disable_checkpointing(model: Any) -> None:
    for name in ("activation_checkpointing_disable", "gradient_checkpointing_disable"):
        if hasattr(model, name):
            getattr(model, name)()
            return


class TrialSession:
    """Runs trial steps on a Trainer and restores what they touched when the ``with`` block ends.

    Args:
        trainer: A constructed, not yet trained ``transformers.Trainer`` (TRL trainers included).
        seq_len: The worst-case sequence length of the trial batches.
    """

    def __init__(self, trainer: Any, seq_len: int) -> None:
        self.trainer = trainer
        self.seq_len = seq_len
        self.model = trainer.model
        self._saved: dict[str, Any] = {}
        self._step_model: Any = self.model
        self._optimizer: Any = None

    # ---- session ---------------------------------------------------------------------------------------
    def __enter__(self) -> TrialSession:
        t, model = self.trainer, self.model
        self._saved = {
            "rng": save_rng_state(),
            "training": model.training,
            "grads": [(p, p.grad) for p in model.parameters()],
            "buffers": [(b, b.detach().clone()) for b in model.buffers() if b.is_floating_point()],
            "optimizer": t.optimizer,
            "attrs": {a: copy.deepcopy(getattr(t, a)) for a in TRAINER_BOOKKEEPING if hasattr(t, a)},
        }
        for p in model.parameters():
            p.grad = None
        given = t.optimizer
        if given is not None:  # a user-given optimizer: trials run on a fresh state object, its own is put back
            inner = _inner_optimizer(given)
            self._saved["opt_state"] = inner.state
            self._saved["opt_groups"] = [(g.get("lr"), g.get("weight_decay")) for g in inner.param_groups]
            inner.state = defaultdict(dict)
            self._optimizer = inner
        else:
            self._optimizer = _inner_optimizer(t.create_optimizer())
        self._saved["checkpointing_enabled"] = enable_checkpointing(t)
        if distributed_world() > 1:
            self._step_model = self._ddp(model)
        return self

    def __exit__(self, *exc: object) -> None:
        t, model, saved = self.trainer, self.model, self._saved
        for p in model.parameters():
            p.grad = None
        if "opt_state" in saved:
            inner = self._optimizer
            inner.state = saved["opt_state"]
            for group, (lr, wd) in zip(inner.param_groups, saved["opt_groups"], strict=True):
                group["lr"], group["weight_decay"] = lr, wd
        t.optimizer = saved["optimizer"]
        self._optimizer = None
        self._step_model = model
        for p, grad in saved["grads"]:
            p.grad = grad
        import torch

        with torch.no_grad():
            for b, value in saved["buffers"]:
                b.copy_(value)
        model.train(saved["training"])
        if saved["checkpointing_enabled"]:
            disable_checkpointing(model)
        for name in TRAINER_BOOKKEEPING:
            if name in saved["attrs"]:
                setattr(t, name, saved["attrs"][name])
            elif hasattr(t, name):
                delattr(t, name)
        restore_rng_state(saved["rng"])
        self._saved = {}

    def _ddp(self, model: Any) -> Any:
        """``DistributedDataParallel`` as the Trainer's accelerator builds it (the TrainingArguments' DDP knobs)."""
        import torch

        args = self.trainer.args
        kwargs: dict[str, Any] = {}
        if getattr(args, "ddp_find_unused_parameters", None) is not None:
            kwargs["find_unused_parameters"] = bool(args.ddp_find_unused_parameters)
        if getattr(args, "ddp_bucket_cap_mb", None) is not None:
            kwargs["bucket_cap_mb"] = args.ddp_bucket_cap_mb
        if getattr(args, "ddp_broadcast_buffers", None) is not None:
            kwargs["broadcast_buffers"] = bool(args.ddp_broadcast_buffers)
        device = getattr(args, "device", None)
        if device is not None and getattr(device, "type", "cpu") == "cuda":
            kwargs["device_ids"] = [device.index or 0]
        return torch.nn.parallel.DistributedDataParallel(model, **kwargs)

    # ---- one trial -------------------------------------------------------------------------------------
    def run(self, micro: int, grad_accum: int) -> TrialMeasure:
        """One trial at ``micro`` × ``grad_accum``; raises the OOM error when it does not fit.

        Order: optimizer state allocated (frozen step on zero gradients), gradients dropped, forward + backward
        (twice with accumulation), frozen optimizer step.

        Leaves no gradient and no optimizer state behind, fit or not.
        """
        import torch

        t, model = self.trainer, self._step_model
        cuda = torch.cuda.is_available() and getattr(getattr(t.args, "device", None), "type", "") == "cuda"
        tracker = None
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            from fitcheck.integrations.trl_live import reference_model_of

            from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

            tracker = LiveTensorTracker()
            tracker.track(model_state_tensors(self.model, self._optimizer))
            ref = reference_model_of(t)  # TRL's separate reference model (DPO, KTO, GRPO with beta > 0)
            if ref is not None and ref is not self.model:
                tracker.track(model_state_tensors(ref))
        sync = model.no_sync() if hasattr(model, "no_sync") else nullcontext()
        self._before_trial(micro, grad_accum)
        try:
            if tracker is not None:
                tracker.start()
            self._allocate_optimizer_state()
            with sync:
                for _ in range(min(2, grad_accum)):
                    batch = self._batch(micro)
                    # num_items_in_batch: None (the loss is divided by the accumulation, trainer.py
                    # ``training_step``); TRL's GRPOTrainer.training_step takes it without a default
                    t.training_step(model, batch, None)
                    del batch
            self._frozen_optimizer_step()
        finally:
            if tracker is not None:
                tracker.stop()
            self._clear()
        if cuda:
            return TrialMeasure(int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated")
        assert tracker is not None
        return TrialMeasure(int(tracker.peak), "live-tensor peak (CPU)")

    def _before_trial(self, micro: int, grad_accum: int) -> None:
        """What ``Trainer.train`` sets before a step of this shape (the accumulation the loss is divided by)."""
        self.trainer.current_gradient_accumulation_steps = grad_accum

    def _batch(self, micro: int) -> Any:
        """One micro-step's input, as the train dataloader would give it."""
        return trial_batch(self.trainer, micro, self.seq_len)

    def _allocate_optimizer_state(self) -> None:
        """The optimizer state as it is resident from the second training step on, before the forward."""
        import torch

        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        self._frozen_optimizer_step()
        for p in self.model.parameters():
            p.grad = None  # Trainer: model.zero_grad(set_to_none) after each optimizer step

    def _frozen_optimizer_step(self) -> None:
        """Allocate the optimizer state at its real shapes by a step that cannot move a parameter."""
        import torch

        opt = self._optimizer
        groups = [(g.get("lr"), g.get("weight_decay")) for g in opt.param_groups]
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.zero_()
        try:
            for g in opt.param_groups:
                g["lr"] = 0.0
                if "weight_decay" in g:
                    g["weight_decay"] = 0.0
            opt.step()
        finally:
            for g, (lr, wd) in zip(opt.param_groups, groups, strict=True):
                g["lr"] = lr
                if wd is not None:
                    g["weight_decay"] = wd

    def _clear(self) -> None:
        """Drop the trial's gradients and optimizer state."""
        for p in self.model.parameters():
            p.grad = None
        opt = self._optimizer
        if opt is not None:
            opt.state = defaultdict(dict)


@contextmanager
def trial_session(trainer: Any, seq_len: int) -> Iterator[TrialSession]:
    """:class:`TrialSession` as a context manager function."""
    with TrialSession(trainer, seq_len) as session:
        yield session
