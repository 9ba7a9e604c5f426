"""Trial steps of an FSDP-prepared ``transformers.Trainer`` (accelerate enables FSDP on GPU backends only).

FSDP2 shards the user's module **in place** inside ``Trainer.train`` (transformers 5.23 trainer.py
``_prepare_for_training`` → ``accelerator.prepare(model, optimizer)`` → accelerate 1.15 accelerator.py
``_prepare_fsdp2`` → utils/fsdp_utils.py ``fsdp2_prepare_model``: the fp32 upcast of trainable low-precision
parameters, then ``fully_shard`` on every wrapped block and the root, which turns the parameters into DTensor
shards and registers FSDP's hooks on the same module objects). That cannot be undone, and it need not be: a
second ``fsdp2_prepare_model`` on an ``FSDPModule`` returns it unchanged (``is_type_fsdp`` early return), and
``_prepare_fsdp2`` maps the new optimizer's parameters onto the same shards. So a trial here:

* prepares the Trainer the way ``train()`` does (``_prepare_for_training``: optimizer built, the model sharded on
  the first trial, kept sharded afterwards), its allocation part of what must fit;
* allocates the optimizer state with a boundary micro-step whose ``lr`` and ``weight_decay`` are 0 (the update
  is ``p`` bit for bit, as in :mod:`.tuner_engine`), then measures min(2, accumulation) micro-steps through
  ``trainer.training_step`` with the state resident;
* tears down what ``auto_find_batch_size`` tears down between attempts (``accelerator.free_memory()``: the
  optimizer and the accelerator's lists), and puts the Trainer's optimizer, scheduler and bookkeeping back.

Unlike the DeepSpeed session, FSDP's hooks are never removed (the sharded module needs them, and ``train()``
then re-prepares the already sharded module exactly as above), and the model stays on the GPU in fp32 shards:
what ``train()`` would do first.

FSDP1 wraps instead of sharding in place: ``_prepare_for_training`` (FSDP1 delays the optimizer) runs
``accelerator.prepare(self.model)`` → accelerate 1.15 accelerator.py ``prepare_model``, FSDP branch:
``FullyShardedDataParallel(model, ...)`` (flat parameters replace the module's own; trainable low-precision flat
parameters upcast to fp32), then ``create_optimizer(model)`` over the wrapper's parameters and
``self.model = self.model_wrapped = model`` (trainer.py, "breaking convention for FSDP model"). The same session
works because both halves are idempotent too: ``prepare_model`` skips the wrapping of a model that already is an
``FullyShardedDataParallel`` (its ``is_type_fsdp`` check) and the upcast of an fp32 flat parameter, and
``_wrap_model`` returns an already wrapped ``model_wrapped`` as is. So the first trial wraps the model once, for
good (what ``train()`` would do first), and the session leaves the Trainer as ``train()``'s own first
``_prepare_for_training`` leaves it: ``model`` and ``model_wrapped`` the wrapper, optimizer and scheduler None. Two
more things differ from FSDP2:

* the Trainer's ``_signature_columns`` (which batch keys ``model.forward`` accepts, cached on first use by
  ``_set_signature_columns_if_needed``) would be read from the wrapper's ``forward(*args, **kwargs)`` once the
  model is wrapped, dropping ``input_ids`` from every batch, the trials' and ``train()``'s: they are cached from
  the unwrapped model when the session starts, as an untuned ``train()`` caches them (its dataloader is built
  before the model is prepared);
* a step that raised (out of memory) is reset by FSDP1's own end-of-backward bookkeeping
  (:func:`_reset_fsdp1_after_error`).

Checked on CPU gloo with a real Trainer (tests/test_tuner_fsdp.py: FSDP1 with and without ``use_orig_params``,
an out-of-memory in forward or backward, the trained weights equal to an untuned run's). One process only: with
several, every rank runs the same trials as under DeepSpeed (see :mod:`.tuner_engine`), not run here.
"""

from __future__ import annotations

from typing import Any

from fitcheck.integrations.tuner_engine import EngineTrialSession


def fsdp_version(trainer: Any) -> int | None:
    """The FSDP version of an FSDP-enabled Trainer (``None`` when FSDP is not enabled)."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return None
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "fsdp_plugin", None)
    return int(getattr(plugin, "fsdp_version", 1) or 1)


def reset_after_error(model: Any) -> bool:
    """Put FSDP2's per-iteration state back to idle after a step that raised (an out-of-memory trial); FSDP1: below.

    A forward or backward that raises leaves FSDP2 mid-iteration: parameter groups unsharded (their bf16 copies
    registered on the modules), states in FORWARD/PRE_BACKWARD, and, after a backward started,
    ``post_backward_final_callback_queued`` set, so no later backward would queue the callback that reduces and
    reshards. This runs that callback (torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_state.py``
    ``_root_post_backward_final_callback``: ``post_backward`` on every group not past it, which the source calls
    "idempotent and safe to call even when this FSDP parameter group was not used in backward", then IDLE), and
    reshards every FSDP module (``FSDPModule.reshard``). Run it once the failed step's tensors are released (the
    next trial, or the session's end), not while the error propagates.

    Returns:
        True when something was mid-iteration and was reset.
    """
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        return _reset_fsdp1_after_error(model)
    root = modules[0]._get_fsdp_state()  # modules() starts at the root
    ctx = root._state_ctx
    idle = [str(getattr(s, "_training_state", "")).endswith("IDLE") for s in ctx.all_states]
    busy = bool(ctx.post_backward_final_callback_queued) or not all(idle)
    if busy:
        ctx.is_last_backward = True
        root._root_post_backward_final_callback()
    for module in modules:
        module.reshard()
    for p in model.parameters():
        p.grad = None
    return busy


def _reset_fsdp1_after_error(model: Any) -> bool:
    """FSDP1's counterpart of :func:`reset_after_error`: every FSDP state of ``model`` back to idle, resharded.

    A step that raised leaves FSDP1 (torch 2.13 ``distributed/fsdp/_runtime_utils.py``) with the root in
    ``FORWARD_BACKWARD``, flat parameters unsharded, post-backward hooks registered on them
    (``_post_backward_hook_state``), ``_saved_grad_shard`` on the units whose backward ran (the next backward would
    add to it, ``_accumulate_sharded_grad``), and, after a backward started, ``_post_backward_callback_queued`` set,
    so no later backward queues the callback that finalises the step. This does what that callback
    (``_post_backward_final_callback``) does, without its gradient hand-over to the optimizer (the failed step's
    gradients are dropped): ``_catch_all_reshard``, the hooks removed, every state and handle IDLE, the execution
    order advanced (``_exec_order_data.next_iter``), the queued flag cleared.

    Returns:
        True when something was mid-iteration and was reset.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._common_utils import HandleTrainingState, TrainingState
    from torch.distributed.fsdp._runtime_utils import _catch_all_reshard

    states = FullyShardedDataParallel.fsdp_modules(model)
    if not states or not getattr(states[0], "_is_root", False):
        return False
    root: Any = states[0]  # torch's private FSDP1 state attributes are not in its type stubs
    busy = bool(getattr(root, "_post_backward_callback_queued", False)) or any(
        s.training_state != TrainingState.IDLE for s in root._all_fsdp_states)
    if not busy:
        return False
    for state in root._all_fsdp_states:
        _catch_all_reshard(state)
        state.training_state = TrainingState.IDLE
        handle: Any = state._handle
        if handle is None:
            continue
        if handle._use_orig_params:
            # forward leaves the original parameters as plain (non-leaf) views of the unsharded flat parameter;
            # _catch_all_reshard skips a unit whose flat parameter already is its shard (one rank), so the next
            # optimizer built over them raised "can't optimize a non-leaf Tensor": back to sharded Parameter views
            handle._use_sharded_views()
        flat: Any = handle.flat_param
        hooks = getattr(flat, "_post_backward_hook_state", None)
        if hooks:
            hooks[-1].remove()
            delattr(flat, "_post_backward_hook_state")
        if hasattr(flat, "_saved_grad_shard"):
            delattr(flat, "_saved_grad_shard")
        flat.grad = None
        flat._post_backward_called = False
        handle._ran_pre_backward_hook = False
        handle._needs_pre_backward_unshard = False
        handle._post_forward_index = None
        handle._training_state = HandleTrainingState.IDLE
        handle._prefetched = False
    root._exec_order_data.next_iter()
    root._post_backward_callback_queued = False
    return True


class FsdpTrialSession(EngineTrialSession):  # type: ignore[misc]  # fitcheck.integrations is Any to mypy
    """Trial steps on the Trainer's own FSDP2 (or FSDP1) preparation of its model, kept sharded between trials.

    Args:
        trainer: A constructed, not yet trained ``transformers.Trainer`` with FSDP enabled (version 2 or 1).
        seq_len: The worst-case sequence length of the trial batches.
    """

    drops_new_hooks = False  # FSDP2's hooks stay: the module stays sharded for the next trial and for train()

    def _prepare(self, micro: int, grad_accum: int) -> Any:
        reset_after_error(self.trainer.model)  # an earlier trial ran out of memory mid-step
        return super()._prepare(micro, grad_accum)

    def __enter__(self) -> FsdpTrialSession:
        super().__enter__()
        if hasattr(self.trainer, "_set_signature_columns_if_needed"):
            self.trainer._set_signature_columns_if_needed()  # from the unwrapped model: see FSDP1 above
        return self

    def __exit__(self, *exc: object) -> None:
        reset_after_error(self.trainer.model)
        super().__exit__(*exc)

    def _teardown(self) -> None:
        """Drop the trial's optimizer and scheduler as ``auto_find_batch_size`` does; keep the sharded module."""
        self._engine = None
        self.trainer.accelerator.free_memory()  # accelerator.py free_memory: _models/_optimizers/_schedulers
        self._restore_prepared()  # model_wrapped is the module FSDP2 sharded in place: the same object
        t = self.trainer
        if t.model is not self.model:  # FSDP1: the wrapper _prepare_for_training set as model and model_wrapped
            t.model_wrapped = t.model

    def _micro_steps(self, micro: int, n: int) -> None:
        """``n`` micro-steps through ``trainer.training_step``, then the optimizer step of the boundary at lr 0.

        Unlike a DeepSpeed engine (whose ``backward`` steps at the boundary), an FSDP Trainer steps in its loop
        (transformers 5.23 trainer.py ``_run_epoch``: ``accelerator.clip_grad_norm_`` with ``max_grad_norm``,
        ``optimizer.step()``, ``model.zero_grad()``), so the trial runs the same three: the AdamW states are
        allocated at their real (sharded, fp32) shapes and the step's temporaries counted; lr and weight decay 0
        leave every parameter as it was.
        """
        super()._micro_steps(micro, n)
        t = self.trainer
        self._zero_lr()
        max_norm = float(getattr(t.args, "max_grad_norm", 0) or 0)
        if max_norm > 0:
            t.accelerator.clip_grad_norm_(t.model.parameters(), max_norm)
        t.optimizer.step()
        t.model.zero_grad(set_to_none=True)

