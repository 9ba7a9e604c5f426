"""Trial steps of an FSDP2-prepared ``transformers.Trainer`` (GPU only: accelerate enables FSDP on GPU backends).

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
what ``train()`` would do first. FSDP1 (a wrapper object, flat parameters) is not handled and stays refused.
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
    """Put FSDP2's per-iteration state back to idle after a step that raised (an out-of-memory trial).

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
        return False
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


class FsdpTrialSession(EngineTrialSession):  # type: ignore[misc]  # fitcheck.integrations is Any to mypy
    """Trial steps on the Trainer's own FSDP2 preparation of its model, kept sharded between trials.

    Args:
        trainer: A constructed, not yet trained ``transformers.Trainer`` with FSDP2 enabled.
        seq_len: The worst-case sequence length of the trial batches.
    """

    drops_new_hooks = False  # FSDP2's hooks stay: the module stays sharded for the next trial and for train()

    def _prepare(self, micro: int, grad_accum: int) -> Any:
        reset_after_error(self.trainer.model)  # an earlier trial ran out of memory mid-step
        return super()._prepare(micro, grad_accum)

    def __exit__(self, *exc: object) -> None:
        reset_after_error(self.trainer.model)
        super().__exit__(*exc)

    def _teardown(self) -> None:
        """Drop the trial's optimizer and scheduler as ``auto_find_batch_size`` does; keep the sharded module."""
        self._engine = None
        self.trainer.accelerator.free_memory()  # accelerator.py free_memory: _models/_optimizers/_schedulers
        self._restore_prepared()  # model_wrapped is the module FSDP2 sharded in place: the same object

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

