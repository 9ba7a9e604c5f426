"""The Trainer's bitsandbytes optimizers, built for a fake-tensor trace the way they allocate on CUDA.

transformers 5.23 ``trainer_optimizer.py`` builds every name of ``_BITSANDBYTES_OPTIMIZERS`` (``adamw_bnb_8bit``,
``adamw_8bit``, ``paged_adamw_8bit``, the 32-bit, Lion, RMSprop and AdEMAMix variants) with
``_get_bitsandbytes_optimizer``; :func:`make_bnb_optimizer` calls that handler and the class it returns. The
optimizer is bitsandbytes 0.50.2's own (``bitsandbytes/optim/optimizer.py``): ``init_state`` allocates, on the first
step, ``state1``/``state2`` (``uint8`` for an 8-bit optimizer, ``float32`` for a 32-bit one or a parameter of
fewer than ``min_8bit_size`` = 4096 elements) and, for 8-bit states, ``absmax1``/``absmax2`` (``float32``, one per
256-element block) and ``unorm_vec`` only when ``max_unorm > 0`` (the Trainer leaves it 0). ``update_step`` runs
``torch.ops.bitsandbytes.optimizer_update_8bit_blockwise`` / ``optimizer_update_32bit``, in-place CUDA kernels
with no temporaries (``_ops.py``: their ``register_fake`` returns None, so a fake trace allocates nothing there).
Before this module the tracer stepped these names as ``torch.optim.AdamW``: fp32 states and, unfused, a
``denom`` per parameter, which is neither the memory nor the allocation order of the run.

Two things CUDA does that a CPU fake trace would not, reproduced here from the same source:

- The Trainer registers every ``nn.Embedding`` weight for 32-bit states under an 8-bit optimizer
  (``trainer.py`` ``create_optimizer``: ``register_module_override(module, "weight", {"optim_bits": 32})``). The
  override goes to a manager private to this optimizer: bitsandbytes' ``GlobalOptimManager`` is a process-wide
  singleton keyed by ``id(p)``, so an earlier trace's entries could match a later model's parameters.
- A paged optimizer's ``get_state_buffer`` takes states of at least 1e5 elements from ``F.get_paged``
  (``cudaMallocManaged``: memory the caching allocator never sees); on a CPU device bitsandbytes falls back to
  ``torch.zeros_like``. Here those buffers are made inside ``tracer_recorder.outside_allocator``: the trace
  knows their storages and counts none of their bytes, so the allocator replay leaves paged state out.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

PAGED_MIN_NUMEL = 100_000  # bitsandbytes 0.50.2 optim/optimizer.py get_state_buffer: `p.numel() < 1e5` stays in torch

# transformers 5.23 trainer_optimizer.py _BITSANDBYTES_OPTIMIZERS (OptimizerNames values, training_args.py)
BNB_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "ademamix", "ademamix_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "lion_32bit", "lion_8bit", "paged_lion_32bit",
    "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})


def make_bnb_optimizer(name: str, groups: list[dict[str, Any]], model: Any) -> Any:
    """The bitsandbytes optimizer the Trainer builds for ``optim=name``, lr 1e-3, TrainingArguments' defaults.

    Args:
        name: A canonical name of :data:`BNB_OPTIMIZERS`.
        groups: The Trainer's parameter groups (``tracer_trainer_optim.trainer_param_groups``).
        model: The model (its ``nn.Embedding`` modules get 32-bit states under an 8-bit optimizer).

    Returns:
        The bitsandbytes optimizer.
    """
    import torch
    from bitsandbytes.optim.optimizer import GlobalOptimManager
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers.trainer_optimizer import OptimizerContext, _get_bitsandbytes_optimizer

    # TrainingArguments 5.23 defaults: adam_beta1 0.9, adam_beta2 0.999, adam_epsilon 1e-8, no optim_args
    args = SimpleNamespace(optim=name, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    ctx = OptimizerContext(args, model, {"lr": 1e-3}, {"betas": (0.9, 0.999), "eps": 1e-8}, {})  # type: ignore[arg-type]
    cls, kwargs = _get_bitsandbytes_optimizer(ctx)
    # an 8-bit optimizer's __init__ builds its quantisation maps (F.create_dynamic_map, data-dependent) as real
    # CPU tensors, as in a real run; the first init_state moves them to the parameters' device
    with unset_fake_temporarily():
        opt = cls(groups, **kwargs)
    mng = GlobalOptimManager.__new__(GlobalOptimManager)  # as get_instance() makes it, but this optimizer's own
    mng.initialize()  # type: ignore[no-untyped-call]
    opt.mng = mng
    if kwargs.get("optim_bits") == 8:  # trainer.py create_optimizer
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                mng.register_module_override(module, "weight", {"optim_bits": 32})  # type: ignore[no-untyped-call]
    if opt.is_paged:
        opt.get_state_buffer = _paged_state_buffer
    return opt


def _paged_state_buffer(p: Any, dtype: Any = None) -> Any:
    """``Optimizer8bit.get_state_buffer`` of a paged optimizer on CUDA, as the trace records it: a buffer of at
    least :data:`PAGED_MIN_NUMEL` elements is managed memory (``F.get_paged``), outside the caching allocator."""
    import torch

    from fitcheck.torch_adapters.tracer_recorder import outside_allocator

    dtype = torch.float32 if dtype is None else dtype
    if p.numel() < PAGED_MIN_NUMEL:
        return torch.zeros_like(p, dtype=dtype, device=p.device)
    with outside_allocator():
        return torch.zeros_like(p, dtype=dtype, device=p.device)
