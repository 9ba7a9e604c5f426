"""The optimizer the HF Trainer builds, for the tracer's steps: its parameter groups and ``optim`` handlers.

Split out of ``tracer.py`` unchanged.
"""

from __future__ import annotations

from typing import Any


def trainer_param_groups(model: Any) -> list[dict[str, Any]]:
    """The HF Trainer's two param groups over the trainable parameters, in ``named_parameters()`` order.

    transformers 5.23 ``trainer.py::create_optimizer``: weight decay for ``get_decay_parameter_names`` (all but
    biases, norm weights and ``nn.LayerNorm`` parameters), none for the rest; ``weight_decay`` is the
    ``TrainingArguments`` default 0.0 (``AdamW`` decays in place, so the value changes no memory).
    """
    import torch

    from fitcheck.core.optimizers import trainer_decays

    # the Trainer's own rule (its name patterns and nn.LayerNorm; tests/test_optimizers_measured.py checks it
    # against Trainer.get_decay_parameter_names), without importing transformers.trainer: 0.7 s of CPU in a fresh
    # process that the optimizer-free activation traces do not pay
    norms = {f"{m}.{n}" if m else n for m, mod in model.named_modules() if isinstance(mod, torch.nn.LayerNorm)
             for n, _ in mod.named_parameters(recurse=False)}
    decay = {n for n, _ in model.named_parameters() if trainer_decays(n, layer_norm=n in norms)}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decay], "weight_decay": 0.0},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]


def make_trainer_optimizer(name: str, model: Any, cuda: bool = False) -> Any:
    """The optimizer the Trainer builds for ``optim=name`` (``trainer_optimizer.py`` handlers), lr 1e-3.

    Args:
        name: ``TrainingArguments.optim`` value.
        model: The model (or PEFT model) being trained.
        cuda: Step it as on CUDA: torch's non-fused optimizers take their foreach path there
            (``torch/optim/optimizer.py`` ``_default_to_fused_or_foreach``), the single-tensor one on a CPU.

    Returns:
        A torch optimizer over :func:`trainer_param_groups`.
    """
    import torch

    from fitcheck.core.optimizers import canonical_optimizer
    from fitcheck.torch_adapters.tracer_bnb_optim import BNB_OPTIMIZERS, make_bnb_optimizer

    lowered, _ = canonical_optimizer(name)
    groups = trainer_param_groups(model)
    foreach = True if cuda else None
    if lowered == "sgd":
        # _get_sgd: torch SGD, no momentum unless optim_args say so
        return torch.optim.SGD(groups, lr=1e-3, foreach=foreach)
    if lowered == "adafactor":
        from transformers.optimization import Adafactor

        # _get_adafactor: scale_parameter=False, relative_step=False
        return Adafactor(groups, lr=1e-3, relative_step=False, scale_parameter=False)  # type: ignore[no-untyped-call]
    if lowered in BNB_OPTIMIZERS:  # bitsandbytes' own optimizer, allocating as on CUDA (tracer_bnb_optim)
        return make_bnb_optimizer(lowered, groups, model)
    # _get_adamw_torch: torch AdamW, fused=True for adamw_torch_fused; otherwise torch picks the path
    # (optim/optimizer.py::_default_to_fused_or_foreach: single-tensor on CPU, foreach on CUDA). Other names
    # (GaLore, ...) are stepped as adamw_torch: only the OPTIMIZER_STEP phase of the trace differs,
    # and trace_components leaves that phase's optimizer bytes to fitcheck.core.states.model_states.
    if lowered == "adamw_torch_fused":
        return torch.optim.AdamW(groups, lr=1e-3, fused=True)
    if name.strip().lower() == "adamw_hf":
        # transformers.AdamW (transformers < 4.50, not installed) loops over the parameters on every device; torch's
        # single-tensor loop is the nearest installed step (one more param-sized buffer: it divides the sqrt
        # before adding eps, transformers adds eps to the sqrt in place).
        return torch.optim.AdamW(groups, lr=1e-3, foreach=False)
    return torch.optim.AdamW(groups, lr=1e-3, foreach=foreach)
