"""Trial steps of a DeepSpeed-prepared ``transformers.Trainer``: a real engine per trial, torn down afterwards.

DeepSpeed shards the model inside ``Trainer.train`` (transformers 5.23 trainer.py ``_prepare_for_training``:
``deepspeed_init`` then ``accelerator.prepare`` → ``deepspeed.initialize``), so a trial step on the plain model
would measure neither the flat 16-bit buffers, the fp32 master partitions and their Adam states, nor ZeRO's
gradient buckets. Three designs were weighed:

(a) **build the engine for each trial the way ``train()`` builds it, then tear it down** — chosen. The session
    calls the Trainer's own ``_prepare_for_training`` (the exact code ``_inner_training_loop`` runs: the same
    ``deepspeed_init``, optimizer/scheduler choice, ``accelerator.prepare``), with the DeepSpeed batch keys set
    for that trial; the teardown is what transformers' ``auto_find_batch_size`` does between attempts
    (trainer.py ``_inner_training_loop`` → ``accelerator.free_memory()``, which calls ``engine.destroy()``
    (hooks and buffers released, accelerate 1.15 accelerator.py ``free_memory``), and ``_update_auto_batch_size``:
    ``model_wrapped = model``). The following ``train()`` then prepares a fresh engine from the same module, as it
    would have without tuning. The config dict is restored to what it was (so ``auto`` keys are filled again by
    ``train()``, and ``trainer_config_finalize`` sees no mismatch), then the batch keys are set once to the
    chosen size.
(b) run the search from inside ``train()`` at the first step: the engine's batch size is fixed at
    ``deepspeed.initialize`` (``train_micro_batch_size_per_gpu`` sizes its buffers, the dataloader is built before
    it), so changing the micro-batch there means re-preparing anyway, inside a loop the Trainer owns;
(c) estimate only, no trials: no verification, against the tuner's promise.

FSDP2 is handled by :mod:`.tuner_fsdp` (a subclass of this session that keeps the in-place sharded module). On
CPU, FSDP does not turn on: in one process transformers 5.23 raises "Using fsdp only works in distributed
training." (trainer.py ``__init__``); under a gloo group (``MULTI_CPU``) accelerate 1.15 state.py enables FSDP
only for GPU-type distributed types, so ``is_fsdp_enabled`` stays False and the Trainer trains under
``DistributedDataParallel`` (checked with ``fsdp="full_shard"``, FSDP2 config, 1 gloo process), which the plain
trial path handles.

A trial (``run``): the engine is prepared (its allocation is part of what must fit: ``train()`` does the same),
every param group's ``lr`` and ``weight_decay`` are set to 0, one micro-step with a boundary allocates the
optimizer state by a real ``engine.step()`` that cannot move a weight (AdamW: ``p·(1 − 0·0) − 0·m/(√v + ε)`` = p
bit for bit; the 16-bit parameters are copied back from unchanged fp32 masters), then the measured step:
min(2, accumulation) micro-steps through ``trainer.training_step`` (accelerate's
``DeepSpeedEngineWrapper.backward``: ``engine.backward`` then, at the boundary, ``engine.step``) with the state
resident. Gradient-accumulation boundaries are set through accelerate's ``gradient_state`` as
``Trainer._run_epoch`` sets them.

Several processes: every rank prepares the same engine and runs the same trials (the verdicts are all-reduced by
the tuner). Unlike the DDP trials (``no_sync``), a DeepSpeed step has collectives inside it (ZeRO's
reduce-scatter at the boundary, ZeRO-3's all-gathers in forward), so a rank that runs out of memory in the middle
of a trial while the others do not leaves them waiting in that collective until the process group's timeout.
Ranks with the same memory fail at the same allocation (same batch, same shapes).

The engine casts the module to the run's 16-bit dtype in place (deepspeed 0.19.8 runtime/engine.py
``_configure_distributed_model``); ``train()`` would do the same first thing, so the training that follows
starts from the same bits (``tests/test_tuner_deepspeed.py`` compares with an untuned run).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from fitcheck.integrations.tuner_batch import deepspeed_configs, set_trainer_micro_batch
from fitcheck.integrations.tuner_trial import (
    TRAINER_BOOKKEEPING,
    TrialMeasure,
    disable_checkpointing,
    enable_checkpointing,
    restore_rng_state,
    save_rng_state,
    trial_batch,
)

# Trainer attributes that _prepare_for_training sets: restored after every trial.
_PREPARED = ("model_wrapped", "deepspeed", "optimizer", "lr_scheduler", "_created_lr_scheduler")


def is_deepspeed_trainer(trainer: Any) -> bool:
    """True when the Trainer runs under DeepSpeed (transformers' ``is_deepspeed_enabled``)."""
    return bool(getattr(trainer, "is_deepspeed_enabled", False))


def _trial_max_steps(trainer: Any, micro: int, grad_accum: int) -> int:
    """The ``max_steps`` ``train()`` would size the scheduler with (``set_initial_training_values``)."""
    args = trainer.args
    if int(getattr(args, "max_steps", -1) or -1) > 0:
        return int(args.max_steps)
    world = int(getattr(args, "world_size", 1) or 1)
    try:
        n = len(trainer.train_dataset)
    except TypeError:  # iterable dataset without max_steps: transformers refuses it; any positive size will do
        return 1
    per_epoch = max(1, math.ceil(math.ceil(n / (micro * world)) / grad_accum))
    return max(1, math.ceil(float(args.num_train_epochs) * per_epoch))


def _remove_module_hooks(engine: Any) -> None:
    """Remove the hooks a DeepSpeed engine put on the user's module, which ``engine.destroy()`` leaves.

    deepspeed 0.19.8 runtime/engine.py registers ``module_forward_pre_hook`` / ``module_forward_post_hook``
    (closures over the engine, ``_create_module_forward_pre_hook``) and ``first_dataloader_check`` on the module;
    ``destroy()`` removes neither of the first two, so every torn-down engine stayed reachable from the model
    (its fp32 master partition and Adam states with it: 0.49 MB of the tiny Llama's ZeRO-2 run, measured) and
    its prologue ran on every later forward. Under ZeRO-3 each parameter also keeps its optimizer.
    """
    if engine is None:
        return
    module = getattr(engine, "module", None)
    if module is not None:
        # ZeRO-3 (deepspeed 0.19.8 runtime/zero/stage3.py ``p._z3_optimizer = self``): every parameter holds its
        # optimizer, with the fp32 partition and Adam states, until the next engine overwrites it
        for p in module.parameters():
            if getattr(p, "_z3_optimizer", None) is not None:
                p._z3_optimizer = None
            active = getattr(p, "ds_active_sub_modules", None)
            if active:
                # a trial that ran out of memory inside a ZeRO-3 forward left the parameter marked in use by the
                # submodule whose pre-forward hook gathered it (its post-forward hook never ran): the next engine's
                # partition() then refuses to free it ("Cannot free a ZeRO-3 parameter while it is still active
                # in submodules", deepspeed 0.19.8 runtime/zero/partition_parameters.py free_param)
                active.clear()
    for name in ("module_forward_pre_hook", "module_forward_post_hook", "first_dataloader_check"):
        handle = getattr(engine, name, None)
        if handle is not None:
            handle.remove()
            setattr(engine, name, None)


_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_TENSOR_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")


def _hook_keys(model: Any) -> dict[tuple[int, str], set[int]]:
    """The hook handles on every submodule and parameter of ``model`` (torch keeps them in dicts by id)."""
    out: dict[tuple[int, str], set[int]] = {}
    for owners, names in ((model.modules(), _MODULE_HOOKS), (model.parameters(), _TENSOR_HOOKS)):
        for owner in owners:
            for name in names:
                hooks = getattr(owner, name, None)
                if isinstance(hooks, dict):
                    out[(id(owner), name)] = set(hooks)
    return out


def _drop_new_hooks(model: Any, before: Mapping[tuple[int, str], set[int]]) -> None:
    """Remove the hooks added since ``before``: an engine whose build ran out of memory is never destroyed."""
    for owners, names in ((model.modules(), _MODULE_HOOKS), (model.parameters(), _TENSOR_HOOKS)):
        for owner in owners:
            for name in names:
                hooks = getattr(owner, name, None)
                if isinstance(hooks, dict):
                    for key in set(hooks) - before.get((id(owner), name), set()):
                        del hooks[key]


class EngineTrialSession:
    """Trial steps on a DeepSpeed engine prepared as ``Trainer.train`` prepares it, torn down after each.

    Args:
        trainer: A constructed, not yet trained ``transformers.Trainer`` with ``is_deepspeed_enabled``.
        seq_len: The worst-case sequence length of the trial batches.
    """

    drops_new_hooks = True  # an engine whose build ran out of memory left hooks on the module (see run)

    def __init__(self, trainer: Any, seq_len: int) -> None:
        self.trainer = trainer
        self.seq_len = seq_len
        self.model = trainer.model
        self._saved: dict[str, Any] = {}
        self._engine: Any = None

    def __enter__(self) -> EngineTrialSession:
        t, args = self.trainer, self.trainer.args
        gradient_state = t.accelerator.gradient_state
        self._saved = {
            "rng": save_rng_state(),
            "training": self.model.training,
            "attrs": {a: copy.deepcopy(getattr(t, a)) for a in TRAINER_BOOKKEEPING if hasattr(t, a)},
            "prepared": {a: getattr(t, a) for a in _PREPARED if hasattr(t, a)},
            "handler": {a: getattr(t.callback_handler, a, None)
                        for a in ("model", "optimizer", "lr_scheduler", "train_dataloader")},
            # plain config values (numbers, strings, "auto"): restored in place, so shared references stay valid
            "configs": [(c, copy.deepcopy(c)) for c in deepspeed_configs(t)],
            "batch": (args.per_device_train_batch_size, args.gradient_accumulation_steps,
                      getattr(t, "_train_batch_size", None)),
            "accel_gas": t.accelerator.gradient_accumulation_steps,
            "plugin_kwargs": dict(getattr(gradient_state, "plugin_kwargs", {}) or {}),
            "sync": gradient_state.sync_gradients,
        }
        self._saved["checkpointing_enabled"] = enable_checkpointing(t)
        return self

    def __exit__(self, *exc: object) -> None:
        t, saved = self.trainer, self._saved
        self._teardown()
        for config, snapshot in saved["configs"]:
            config.clear()
            config.update(snapshot)
        for holder in (getattr(t.args, "hf_deepspeed_config", None),
                       getattr(t.accelerator.state.deepspeed_plugin, "hf_ds_config", None)):
            if holder is not None and hasattr(holder, "mismatches"):
                holder.mismatches = []
        micro, gas, train_bs = saved["batch"]
        t.args.per_device_train_batch_size, t.args.gradient_accumulation_steps = micro, gas
        if train_bs is not None:
            t._train_batch_size = train_bs
        t.accelerator.gradient_accumulation_steps = saved["accel_gas"]
        gradient_state = t.accelerator.gradient_state
        if isinstance(getattr(gradient_state, "plugin_kwargs", None), dict):
            gradient_state.plugin_kwargs.clear()
            gradient_state.plugin_kwargs.update(saved["plugin_kwargs"])
        gradient_state._set_sync_gradients(saved["sync"])
        self.model.train(saved["training"])
        if saved["checkpointing_enabled"]:
            disable_checkpointing(self.model)
        for name in TRAINER_BOOKKEEPING:
            if name in saved["attrs"]:
                setattr(t, name, saved["attrs"][name])
            elif hasattr(t, name):
                delattr(t, name)
        restore_rng_state(saved["rng"])
        self._saved = {}

    def _teardown(self) -> None:
        """Release the trial engine as ``auto_find_batch_size`` does between attempts; put the Trainer back."""
        t = self.trainer
        wrapped = getattr(t.accelerator, "deepspeed_engine_wrapped", None)
        engine = getattr(wrapped, "engine", None) or self._engine
        self._engine = None
        _remove_module_hooks(engine)
        t.accelerator.free_memory()  # engine.destroy(): ZeRO hooks and buffers; accelerate's lists emptied
        self._restore_prepared()

    def _restore_prepared(self) -> None:
        """The Trainer's prepared objects and callback handler as before the trial; gradients and cache freed."""
        t, saved = self.trainer, self._saved
        for name, value in saved.get("prepared", {}).items():
            setattr(t, name, value)
        for name, value in saved.get("handler", {}).items():
            setattr(t.callback_handler, name, value)
        for p in self.model.parameters():
            p.grad = None
        with suppress(Exception):
            from accelerate.utils import release_memory

            release_memory()  # gc.collect() + the device cache

    def _prepare(self, micro: int, grad_accum: int) -> Any:
        t = self.trainer
        for config, snapshot in self._saved["configs"]:  # train() finalizes the config from its "auto" state
            config.clear()
            config.update(copy.deepcopy(snapshot))
        set_trainer_micro_batch(t, micro)  # args, _train_batch_size, the three DeepSpeed batch keys
        assert (t.args.per_device_train_batch_size, t.args.gradient_accumulation_steps) == (micro, grad_accum)
        engine, _ = t._prepare_for_training(_trial_max_steps(t, micro, grad_accum), None, None)
        self._engine = engine
        return engine

    def _zero_lr(self) -> None:
        """``lr`` and ``weight_decay`` 0 in every param group of the engine's optimizer (before each step)."""
        opt = getattr(self._engine, "optimizer", None) or self.trainer.optimizer
        for group in opt.param_groups:
            group["lr"] = 0.0
            if "weight_decay" in group:
                group["weight_decay"] = 0.0

    def _batch(self, micro: int) -> Any:
        """One micro-step's input, as the train dataloader would give it."""
        return trial_batch(self.trainer, micro, self.seq_len)

    def _micro_steps(self, micro: int, n: int) -> None:
        """``n`` micro-steps through ``trainer.training_step``; the last one is an accumulation boundary."""
        t = self.trainer
        gradient_state = t.accelerator.gradient_state
        for i in range(n):
            self._zero_lr()
            gradient_state._set_sync_gradients(i == n - 1)  # Trainer._run_epoch: sync at the last micro-step
            batch = self._batch(micro)
            t.training_step(self._engine, batch, None)  # num_items_in_batch: see tuner_trial
            del batch

    def run(self, micro: int, grad_accum: int) -> TrialMeasure:
        """One trial at ``micro`` × ``grad_accum`` on a fresh engine; raises the OOM error when it does not fit.

        Order: engine prepared, optimizer state allocated (a boundary micro-step at lr 0), the measured step
        (min(2, accumulation) micro-steps, state resident), engine torn down — fit or not.
        """
        import torch

        t = self.trainer
        cuda = torch.cuda.is_available() and getattr(getattr(t.args, "device", None), "type", "") == "cuda"
        tracker = None
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

            tracker = LiveTensorTracker()
            tracker.track(model_state_tensors(self.model))
        t.current_gradient_accumulation_steps = grad_accum
        hooks = _hook_keys(self.model)
        try:
            if tracker is not None:
                tracker.start()
            self._prepare(micro, grad_accum)
            self._micro_steps(micro, 1)
            self._micro_steps(micro, min(2, grad_accum))
        finally:
            if tracker is not None:
                tracker.stop()
            self._teardown()
            if self.drops_new_hooks:
                _drop_new_hooks(self.model, hooks)
        if cuda:
            return TrialMeasure(int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated")
        assert tracker is not None
        return TrialMeasure(int(tracker.peak), "live-tensor peak (CPU)")
