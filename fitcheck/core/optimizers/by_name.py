"""Optimizer memory for every ``TrainingArguments.optim`` value, as each implementation allocates it.

Names are transformers 5.23 ``training_args.OptimizerNames``; the Trainer builds them in
``trainer_optimizer.py`` (``_OPTIMIZER_HANDLERS``) with two parameter groups (weight decay / no decay: biases
and norms) over the parameters with ``requires_grad``. This module maps names and models the torch
optimizers; :mod:`fitcheck.core.optimizers.other_families` the other families;
:mod:`fitcheck.core.optimizers.step_tensors` the step order and the transient bytes of one step.

torch ``AdamW`` (``adamw_torch``, ``adamw_torch_fused``): ``exp_avg`` + ``exp_avg_sq`` ``zeros_like(p)`` (param
dtype) and a 0-d fp32 ``step`` (CPU unless fused/capturable) per tensor (``torch/optim/adam.py::_init_group``).
Step temporaries (torch 2.13 ``optim/adam.py``, measured in ``tests/test_optimizers_measured.py``):

* single-tensor loop (``_single_tensor_adam``, the CPU default): ``denom = (exp_avg_sq.sqrt() / c).add_(eps)``
  holds the ``sqrt`` and the quotient of tensor i while tensor i-1's ``denom`` is still bound to the loop
  variable: ``max_i(bytes[i-1] + 2 * bytes[i])`` over consecutive tensors of one param group;
* foreach (``_multi_tensor_adam``, the CUDA default): ``exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)`` per
  (device, dtype) sub-list of a group, the previous sub-list's still bound: ``max_k(S[k-1] + S[k])``;
* fused (``_fused_adamw_``, ``adamw_torch_fused``, CPU and CUDA): in place, nothing.

transformers' own ``AdamW`` (``adamw_hf``, on a stack with transformers < 4.50 only: PR #36177 removed the class;
4.16.2 and 4.49.0 ``optimization.py`` ``AdamW.step``): the same two states (``torch.zeros_like(p.data)``), a Python
int ``step`` (no tensor), and one loop over the parameters of each group: ``denom = exp_avg_sq.sqrt().add_(eps)``
allocates one param-sized buffer while the previous parameter's ``denom`` is still bound (from one param group into
the next: one method loops over both), whatever the device.

Everything not listed raises :class:`fitcheck.errors.NotModelledError` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fitcheck.core.optimizers.other_families import (
    BNB_NAMES,
    adafactor_memory,
    anyprecision_memory,
    arg_float,
    arg_true,
    bnb_memory,
    count,
    galore_memory,
    other_memory,
    torch_states,
    torchao_memory,
)
from fitcheck.core.optimizers.step_tensors import (
    OptimizerMemory,
    TensorGroup,
    dtype_totals,
    foreach_peak,
    one_loop_peak,
    pair_peak,
    single_tensor_peak,
    trainer_groups,
)
from fitcheck.errors import NotModelledError
from fitcheck.findings import Finding, Severity
from fitcheck.spec import LEGACY_OPTIMIZER_NAMES, OPTIMIZER_NAMES, OptimizerName, OptimizerSpec

__all__ = [
    "OPTIMIZER_NAMES",
    "OptimizerMemory",
    "TensorGroup",
    "canonical_optimizer",
    "optimizer_memory",
]

# Names earlier transformers releases accepted and 5.x rejects, with their current equivalent.
_RETIRED: dict[str, tuple[OptimizerName, str]] = {
    # transformers <= 4.49: "adamw_hf" = transformers.AdamW, removed with that class in 4.50 (PR #36177); torch
    # AdamW is the same math. Kept as "adamw_hf" for a stack that still has it (_LEGACY_UNTIL).
    "adamw_hf": ("adamw_torch", "transformers' own AdamW was removed; torch.optim.AdamW is its replacement"),
    # transformers 4.x: apex FusedAdam; 5.x dropped apex; torch's fused AdamW kernel is the equivalent.
    "adamw_apex_fused": (
        "adamw_torch_fused",
        "apex FusedAdam support was removed; torch's fused AdamW replaces it",
    ),
}

_NOT_MODELLED: dict[str, str] = {
    "adamw_torch_xla": "runs on XLA (TPU) devices, which fitcheck does not model",
    "adamw_torch_npu_fused": "runs on Ascend NPUs, which fitcheck does not model",
    "grokadamw": "grokadamw's state layout (gradient EMA for the grokking signal) is not modelled yet",
    "apollo_adamw": "APOLLO's random-projection state layout is not modelled yet",
    "apollo_adamw_layerwise": "APOLLO's random-projection state layout is not modelled yet",
}


# The first transformers release without each legacy name's class (PR #36177, released in 4.50.0).
_LEGACY_UNTIL: dict[str, tuple[int, int]] = {"adamw_hf": (4, 50)}


def canonical_optimizer(name: str, transformers: tuple[int, ...] | None = None) -> tuple[OptimizerName, Finding | None]:
    """Map an ``optim`` value to the name the stack's transformers builds.

    Args:
        name: What the user passed (``--optim``, ``TrainingArguments.optim``).
        transformers: ``(major, minor, ...)`` of the stack's transformers (``StackSpec.release``); None: the
            modelled 5.23. A legacy name (``LEGACY_OPTIMIZER_NAMES``) is kept on a release that still has it.

    Returns:
        The canonical name and, for a retired name, an info finding that says what it was mapped to.

    Raises:
        NotModelledError: If the name is neither a current nor a known retired optimizer name.
    """
    key = name.strip().lower()
    current = next((n for n in OPTIMIZER_NAMES if n == key), None)
    if current is not None:
        return current, None
    legacy = next((n for n in LEGACY_OPTIMIZER_NAMES if n == key), None)
    if legacy is not None and transformers is not None and tuple(transformers[:2]) < _LEGACY_UNTIL[legacy]:
        return legacy, None
    if key in _RETIRED:
        new, why = _RETIRED[key]
        return new, Finding(
            code="optimizer-renamed",
            severity=Severity.INFO,
            message=f"optim={name!r} is not accepted by transformers 5 ({why}); estimated as {new!r}",
            hint=f"pass --optim {new} (transformers 5 raises ValueError for {name!r})",
        )
    raise NotModelledError(
        f"optimizer {name!r} is not a transformers TrainingArguments.optim value; known names: "
        + ", ".join(OPTIMIZER_NAMES)
    )


def _adagrad_foreach(tensors: Sequence[TensorGroup]) -> int:
    # _multi_tensor_adagrad: std = _foreach_sqrt(state_sums) then numerator = _foreach_mul(grads, -clr) per
    # (device, dtype) sub-list; the previous sub-list's std and numerator are rebound one at a time.
    return max(
        (max(pair_peak(dtype_totals(g), 2, 1), pair_peak(dtype_totals(g), 1, 2)) for g in trainer_groups(tensors)),
        default=0,
    )


def optimizer_memory(
    opt: OptimizerSpec,
    tensors: Sequence[TensorGroup],
    *,
    cuda: bool = True,
    transformers: tuple[int, ...] | None = None,
) -> OptimizerMemory:
    """State, counter and step-temporary bytes the optimizer allocates for these trainable tensors.

    Args:
        opt: The optimizer spec (canonical name, ``optim_args``).
        tensors: The trainable tensors (only these get states), in inventory (module) order: the step
            temporaries depend on which tensors are consecutive in the Trainer's param groups.
        cuda: The step runs on a CUDA device (decides torch's foreach vs single-tensor path).
        transformers: The stack's transformers release (decides whether a legacy name is still its class).

    Returns:
        The optimizer's memory for one unsharded replica.

    Raises:
        NotModelledError: For optimizers whose memory fitcheck does not model.
    """
    name, _ = canonical_optimizer(opt.name, transformers)
    if name in _NOT_MODELLED:
        raise NotModelledError(f"optimizer {name!r}: {_NOT_MODELLED[name]}")
    if not tensors:
        return OptimizerMemory(states=0, detail="no trainable parameters", source="")
    torch_family = _torch_memory(name, opt, tensors, cuda)
    if torch_family is not None:
        return torch_family
    args = opt.args
    if name == "adafactor":
        return adafactor_memory(tensors)
    if name == "adamw_anyprecision":
        return anyprecision_memory(opt, tensors)
    if name in ("adamw_torch_4bit", "adamw_torch_8bit"):
        block = int(args.get("block_size", 256))  # trainer_optimizer.py _get_torchao_optimizer default 256
        return torchao_memory(tensors, bits=4 if name.endswith("4bit") else 8, block=block)
    if name in BNB_NAMES:
        return bnb_memory(name, tensors, cuda=cuda)
    if name.startswith("galore_"):
        return galore_memory(opt, tensors, name)
    other = other_memory(name, opt, tensors)
    if other is None:  # pragma: no cover - every name is handled
        raise NotModelledError(f"optimizer {name!r} is not modelled")
    return other


def _torch_memory(
    name: OptimizerName, opt: OptimizerSpec, tensors: Sequence[TensorGroup], cuda: bool
) -> OptimizerMemory | None:
    """torch's own optimizers (AdamW, SGD, Adagrad, RMSprop); None for the other families."""
    n_tensors = count(tensors)
    args = opt.args
    if name in ("adamw_torch", "adamw_torch_fused"):
        fused = name == "adamw_torch_fused"
        if fused:
            temp, path = 0, "fused kernel, in place"
        elif cuda:
            temp, path = foreach_peak(tensors, 1, 1), "foreach: sqrt of exp_avg_sq per param group and dtype"
        else:
            temp, path = single_tensor_peak(tensors, 1, 2), "single-tensor loop: sqrt + denom per tensor"
        return OptimizerMemory(
            states=torch_states(tensors, 2),
            step_counters_host=0 if fused else 4 * n_tensors,
            step_counters_device=4 * n_tensors if fused else 0,
            step_temporary=temp,
            detail=f"torch AdamW: exp_avg + exp_avg_sq in param dtype ({path})",
            source="torch 2.13 optim/adam.py _init_group, _single_tensor_adam, _multi_tensor_adam, _fused_adam",
        )
    if name == "adamw_hf":
        return OptimizerMemory(
            states=torch_states(tensors, 2),
            step_temporary=one_loop_peak(tensors, 1, 1),
            detail="transformers AdamW: exp_avg + exp_avg_sq in param dtype (per-parameter loop: sqrt per tensor)",
            source="transformers 4.16.2 / 4.49.0 optimization.py AdamW.step",
        )
    if name == "sgd":
        sgd_momentum = arg_float(args, "momentum", 0.0)  # _get_sgd passes momentum only from optim_args
        nesterov = arg_true(args, "nesterov") and sgd_momentum > 0
        # optim/sgd.py: _single_tensor_sgd's nesterov `grad = grad.add(buf)` is one tensor at a time (the
        # previous copy is unbound first); _multi_tensor_sgd adds into the grads in place.
        temp = 0 if (cuda or not nesterov) else single_tensor_peak(tensors, 0, 1)
        return OptimizerMemory(
            states=torch_states(tensors, 1 if sgd_momentum else 0),
            step_temporary=temp,
            detail=f"torch SGD, momentum={sgd_momentum:g}" + ("" if sgd_momentum else ": no state"),
            source="torch 2.13 optim/sgd.py (momentum_buffer only when momentum != 0)",
        )
    if name == "adagrad":
        return OptimizerMemory(
            states=torch_states(tensors, 1),
            step_counters_host=4 * n_tensors,
            # _single_tensor_adagrad: std = state_sum.sqrt() beside the previous tensor's std.
            step_temporary=_adagrad_foreach(tensors) if cuda else single_tensor_peak(tensors, 1, 1),
            detail="torch Adagrad: state 'sum' in param dtype (std + numerator temporaries)",
            source="torch 2.13 optim/adagrad.py _single_tensor_adagrad, _multi_tensor_adagrad",
        )
    if name == "rmsprop":
        n_states = 1 + (1 if arg_float(args, "momentum", 0.0) > 0 else 0) + (1 if arg_true(args, "centered") else 0)
        return OptimizerMemory(
            states=torch_states(tensors, n_states),
            step_counters_host=4 * n_tensors,
            # avg = sqrt(square_avg) (centered: addcmul then sqrt_), beside the previous tensor's / sub-list's.
            step_temporary=foreach_peak(tensors, 1, 1) if cuda else single_tensor_peak(tensors, 1, 1),
            detail=f"torch RMSprop: {n_states} state(s) in param dtype",
            source="torch 2.13 optim/rmsprop.py _single_tensor_rmsprop, _multi_tensor_rmsprop",
        )
    return None
