"""Optimizer state memory for every ``TrainingArguments.optim`` value, as each implementation allocates it.

Names are transformers 5.23 ``training_args.OptimizerNames``; the Trainer builds them in
``trainer_optimizer.py`` (``_OPTIMIZER_HANDLERS``) with two parameter groups (weight decay / no decay:
biases and
norms) over the parameters with ``requires_grad``. Per implementation:

* torch ``AdamW`` (``adamw_torch``, ``adamw_torch_fused``): ``exp_avg`` + ``exp_avg_sq`` ``zeros_like(p)``
  (param
  dtype) and a 0-d fp32 ``step`` (CPU unless fused/capturable) per tensor
  (``torch/optim/adam.py::_init_group``).
  The foreach path (CUDA default for ``adamw_torch``) allocates ``exp_avg_sq_sqrt =
  _foreach_sqrt(exp_avg_sqs)``:
  one state-dtype copy of each param group (``_multi_tensor_adam``); the single-tensor path (CPU) one
  tensor at a
  time; the fused kernel (``_fused_adamw_``) updates in place.
* bitsandbytes (``optim/optimizer.py``): 32-bit states are fp32 whatever the param dtype; 8-bit states are
  uint8
  with an fp32 absmax per 256 elements, but tensors under ``min_8bit_size`` = 4096 elements keep fp32
  states; the
  Trainer registers every ``nn.Embedding`` weight for 32-bit states (``trainer.py::create_optimizer``). Paged
  optimizers put state tensors of >= 1e5 elements in CUDA managed memory (``get_state_buffer``) — outside
  torch's
  allocator. AdEMAMix keeps a double-size ``state1`` (fast + slow EMA) and ``state2`` (``optim/ademamix.py``).
* transformers ``Adafactor`` (``optimization.py``): no first moment (``beta1=None``); fp32
  ``exp_avg_sq_row`` +
  ``exp_avg_sq_col`` for tensors of >= 2 dims, full fp32 ``exp_avg_sq`` for 1-D; per-parameter fp32
  temporaries.

Everything not listed in :data:`_MODELS` raises :class:`fitcheck.errors.NotModelledError` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fitcheck.errors import NotModelledError
from fitcheck.findings import Finding, Severity
from fitcheck.spec import Dtype, OptimizerSpec

# transformers 5.23 training_args.py OptimizerNames, in declaration order.
OPTIMIZER_NAMES: tuple[str, ...] = (
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_torch_xla",
    "adamw_torch_npu_fused",
    "adafactor",
    "adamw_anyprecision",
    "adamw_torch_4bit",
    "adamw_torch_8bit",
    "ademamix",
    "sgd",
    "adagrad",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "ademamix_8bit",
    "lion_8bit",
    "lion_32bit",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
    "galore_adamw",
    "galore_adamw_8bit",
    "galore_adafactor",
    "galore_adamw_layerwise",
    "galore_adamw_8bit_layerwise",
    "galore_adafactor_layerwise",
    "lomo",
    "adalomo",
    "grokadamw",
    "schedule_free_radam",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "apollo_adamw",
    "apollo_adamw_layerwise",
    "stable_adamw",
)

# Names earlier transformers releases accepted and 5.x rejects, with their current equivalent.
_RETIRED: dict[str, tuple[str, str]] = {
    # transformers <= 4.4x: "adamw_hf" = transformers.AdamW, removed with that class; torch AdamW is the
    # same math.
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


def canonical_optimizer(name: str) -> tuple[str, Finding | None]:
    """Map an ``optim`` value to the name transformers 5.23 accepts.

    Args:
        name: What the user passed (``--optim``, ``TrainingArguments.optim``).

    Returns:
        The canonical name and, for a retired name, an info finding that says what it was mapped to.

    Raises:
        NotModelledError: If the name is neither a current nor a known retired optimizer name.
    """
    key = name.strip().lower()
    if key in OPTIMIZER_NAMES:
        return key, None
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


@dataclass(frozen=True)
class TensorGroup:
    """``repeat`` trainable tensors of one shape and dtype, as the optimizer sees them.

    Attributes:
        name: Parameter name (layer index as ``*``).
        shape: Shape of one tensor.
        dtype: Parameter (and gradient) dtype.
        repeat: Number of tensors.
        embedding: An ``nn.Embedding`` weight (bnb 8-bit: the Trainer forces 32-bit states).
        decay: In the Trainer's weight-decay group (not a bias or norm).
        low_rank: A GaLore target (``optim_target_modules``, an ``nn.Linear`` weight).
    """

    name: str
    shape: tuple[int, ...]
    dtype: Dtype
    repeat: int = 1
    embedding: bool = False
    decay: bool = True
    low_rank: bool = False

    @property
    def numel_each(self) -> int:
        """Elements of one tensor."""
        return math.prod(self.shape)

    @property
    def nbytes_each(self) -> int:
        """Bytes of one tensor."""
        return self.numel_each * self.dtype.nbytes


@dataclass(frozen=True)
class OptimizerMemory:
    """What an optimizer holds and allocates for a set of trainable tensors (one process, unsharded).

    Attributes:
        states: State bytes in torch's caching allocator.
        managed: State bytes in CUDA managed memory (paged optimizers; outside torch's allocator).
        projections: GaLore projection matrices (torch allocator).
        step_counters_host: 0-d step tensors kept on the CPU.
        step_counters_device: 0-d step tensors on the device.
        step_temporary: Largest transient allocation during ``optimizer.step()``.
        in_backward: The update runs inside backward (LOMO, layer-wise GaLore): no full gradient set exists.
        detail: One line on the layout.
        source: Where the layout comes from.
    """

    states: int
    managed: int = 0
    projections: int = 0
    step_counters_host: int = 0
    step_counters_device: int = 0
    step_temporary: int = 0
    in_backward: bool = False
    detail: str = ""
    source: str = ""


_MIN_8BIT = (
    4096  # bitsandbytes optim/optimizer.py min_8bit_size default; torchao optim/adam.py same threshold
)
_BNB_BLOCK = 256  # bitsandbytes Optimizer2State.init_state: blocksize = 256
_PAGED_MIN = 100_000  # bitsandbytes get_state_buffer: p.numel() < 1e5 -> ordinary torch allocation
_QMAP = 256 * 4  # bitsandbytes create_dynamic_map: 256 fp32 values


def _groups(tensors: Sequence[TensorGroup]) -> list[list[TensorGroup]]:
    decay = [t for t in tensors if t.decay]
    no_decay = [t for t in tensors if not t.decay]
    return [g for g in (decay, no_decay) if g]


def _foreach_copy(tensors: Sequence[TensorGroup], dtype_of: Mapping[Dtype, Dtype] | None = None) -> int:
    """One state-dtype copy of the largest Trainer param group (foreach kernels work per group)."""
    best = 0
    for group in _groups(tensors):
        total = 0
        for t in group:
            dt = dtype_of.get(t.dtype, t.dtype) if dtype_of else t.dtype
            total += t.numel_each * dt.nbytes * t.repeat
        best = max(best, total)
    return best


def _largest(tensors: Sequence[TensorGroup]) -> int:
    return max((t.numel_each for t in tensors), default=0)


def _count(tensors: Sequence[TensorGroup]) -> int:
    return sum(t.repeat for t in tensors)


def _torch_states(tensors: Sequence[TensorGroup], n_states: int) -> int:
    return n_states * sum(t.nbytes_each * t.repeat for t in tensors)


def _bnb(
    tensors: Sequence[TensorGroup], *, bits: int, n_states: int, paged: bool, ademamix: bool
) -> OptimizerMemory:
    device = managed = 0
    any_8bit = False
    for t in tensors:
        n = t.numel_each
        eight = bits == 8 and n >= _MIN_8BIT and not t.embedding
        elem = 1 if eight else 4
        # AdEMAMix: state1 is (2, *shape), state2 is shape -> 3 state tensors' worth.
        state_elems = (3 if ademamix else n_states) * n
        state_bytes = state_elems * elem
        if paged and n >= _PAGED_MIN:
            managed += state_bytes * t.repeat
        else:
            device += state_bytes * t.repeat
        if eight:
            any_8bit = True
            blocks = -(n // -_BNB_BLOCK)
            absmax_arrays = 3 if ademamix else n_states  # absmax1 (2,blocks) for AdEMAMix + absmax2
            device += 4 * blocks * absmax_arrays * t.repeat
    qmaps = 2 * _QMAP if any_8bit else 0  # name2qmap["dynamic"], ["udynamic"], moved to the device once
    kind = f"{bits}-bit" + (" paged" if paged else "")
    return OptimizerMemory(
        states=device + qmaps,
        managed=managed,
        detail=f"bitsandbytes {kind} states ({'3' if ademamix else n_states} per param)",
        source="bitsandbytes 0.50.2 optim/optimizer.py Optimizer2State/1State.init_state, get_state_buffer",
    )


def _torchao(tensors: Sequence[TensorGroup], *, bits: int, block: int) -> OptimizerMemory:
    states = 0
    for t in tensors:
        n = t.numel_each
        if n >= _MIN_8BIT and n % block == 0:
            codes = n if bits == 8 else n // 2
            qmap = 256 * 4 if bits == 8 else 16 * 4  # per-state fp32 lookup table (subclass_8bit/4bit.zeros)
            per_state = codes + 4 * (n // block) + qmap
        else:
            per_state = t.nbytes_each  # torch.zeros_like(p)
        states += 2 * per_state * t.repeat
    largest = _largest(tensors)
    return OptimizerMemory(
        states=states,
        step_counters_host=4 * _count(tensors),
        # single_param_adam under torch.compile: fp32 p, grad, exp_avg, exp_avg_sq of one tensor at a time.
        step_temporary=4 * 4 * largest,
        detail=f"torchao {bits}-bit AdamW states (block {block}); step temporaries assumed 4 fp32 "
        "copies of the largest tensor (compiled kernel, not measured)",
        source="torchao optim/adam.py _new_buffer + subclass_8bit.py/subclass_4bit.py zeros",
    )


def _adafactor(tensors: Sequence[TensorGroup]) -> int:
    total = 0
    for t in tensors:
        s = t.shape
        if len(s) >= 2:
            rows = math.prod(s[:-1])
            cols = math.prod(s[:-2]) * s[-1]
            total += 4 * (rows + cols) * t.repeat
        else:
            total += 4 * t.numel_each * t.repeat
    return total


def _adafactor_temp(tensors: Sequence[TensorGroup]) -> int:
    worst = 0
    for t in tensors:
        n = t.numel_each
        # optimization.py Adafactor.step: grad.float() and p.float() copies (16-bit params only), then
        # (grad**2) and (grad**2)+eps alive together, then _approx_sq_grad's full fp32 product beside
        # `update`;
        # plus the previous parameter's `update` still bound to the loop variable (bounded by the largest).
        copies = 4 if t.dtype.is_half else 2
        # + row/col means, r/c factors and their intermediates: ~5 fp32 vectors of rows+cols (measured, tests)
        vectors = (
            5 * (math.prod(t.shape[:-1]) + math.prod(t.shape[:-2]) * t.shape[-1]) if len(t.shape) >= 2 else 0
        )
        worst = max(worst, 4 * (n * copies + vectors))
    return worst + 4 * _largest(tensors)


def _galore_split(
    tensors: Sequence[TensorGroup], rank: int
) -> tuple[list[TensorGroup], int, int, tuple[int, int]]:
    """Non-target tensors, projected-state elements, projection bytes, shape of the largest target."""
    plain: list[TensorGroup] = []
    projected = proj_bytes = 0
    largest = (0, 0)
    for t in tensors:
        if not t.low_rank or len(t.shape) != 2:
            plain.append(t)
            continue
        m, n = t.shape
        r = min(rank, m, n)
        # galore_projector.py std: m >= n -> right projection B=(r, n), low-rank grad (m, r); else left (m,
        # r)/(r, n).
        projected += r * max(m, n) * t.repeat
        proj_bytes += r * min(m, n) * t.dtype.nbytes * t.repeat
        if m * n > largest[0] * largest[1]:
            largest = (m, n)
    return plain, projected, proj_bytes, largest


def _galore(
    opt: OptimizerSpec, tensors: Sequence[TensorGroup], base: str, layerwise: bool
) -> OptimizerMemory:
    if not any(t.low_rank for t in tensors):
        raise NotModelledError(
            f"{opt.name} needs optim_target_modules that match nn.Linear weights (transformers raises "
            "'No target modules found'); none matched"
        )
    rank = int(opt.args.get("rank", 128))  # trainer_optimizer.py _get_galore_optimizer default rank 128
    plain, projected, proj_bytes, largest = _galore_split(tensors, rank)
    dtype = next(t.dtype for t in tensors if t.low_rank)
    if base == "adafactor":
        states = _adafactor(plain)
        states += 4 * projected  # factored over the (m, r) projected grad: bounded by full fp32 for r << m
    elif base == "adamw_8bit":
        states = _bnb(plain, bits=8, n_states=2, paged=False, ademamix=False).states
        states += 2 * projected + 2 * 4 * (-(projected // -_BNB_BLOCK))
    else:
        states = _torch_states(plain, 2) + 2 * projected * dtype.nbytes
    # get_orthogonal_matrix every update_proj_gap steps: fp32 copy + U (m,k) + Vh (k,n) of the largest target,
    # plus project_back's full-rank update in the param dtype.
    m, n = largest
    k = min(m, n)
    svd = 4 * (m * n + m * k + k * n) + m * n * dtype.nbytes
    return OptimizerMemory(
        states=states,
        projections=proj_bytes,
        step_temporary=svd,
        in_backward=layerwise,
        detail=f"GaLore ({base}) rank {rank}: states in the projected space for optim_target_modules",
        source="galore_torch galore_projector.py (std projection) + transformers trainer_optimizer.py",
    )


def _arg_float(args: Mapping[str, str], key: str, default: float) -> float:
    try:
        return float(args.get(key, default))
    except ValueError:
        return default


def _arg_true(args: Mapping[str, str], key: str) -> bool:
    return str(args.get(key, "false")).lower() in ("true", "1", "yes")


def optimizer_memory(
    opt: OptimizerSpec, tensors: Sequence[TensorGroup], *, cuda: bool = True
) -> OptimizerMemory:
    """State, counter and step-temporary bytes the optimizer allocates for these trainable tensors.

    Args:
        opt: The optimizer spec (canonical name, ``optim_args``).
        tensors: The trainable tensors (only these get states).
        cuda: The step runs on a CUDA device (decides torch's foreach vs single-tensor path).

    Returns:
        The optimizer's memory for one unsharded replica.

    Raises:
        NotModelledError: For optimizers whose memory fitcheck does not model.
    """
    name, _ = canonical_optimizer(opt.name)
    if name in _NOT_MODELLED:
        raise NotModelledError(f"optimizer {name!r}: {_NOT_MODELLED[name]}")
    if not tensors:
        return OptimizerMemory(states=0, detail="no trainable parameters", source="")
    count = _count(tensors)
    largest_bytes = max(t.nbytes_each for t in tensors)
    args = opt.args
    if name in ("adamw_torch", "adamw_torch_fused"):
        fused = name == "adamw_torch_fused"
        if fused:
            temp = 0  # _fused_adamw_ updates params and states in place
        elif cuda:
            temp = _foreach_copy(tensors)  # _multi_tensor_adam: exp_avg_sq_sqrt per param group
        else:
            # _single_tensor_adam: sqrt and the divided denom of one tensor, while the previous tensor's
            # `denom`
            # is still bound to the loop variable (adjacent MLP matrices make this 3x the largest; measured)
            temp = 3 * largest_bytes
        return OptimizerMemory(
            states=_torch_states(tensors, 2),
            step_counters_host=0 if fused else 4 * count,
            step_counters_device=4 * count if fused else 0,
            step_temporary=temp,
            detail="torch AdamW: exp_avg + exp_avg_sq in param dtype"
            + (
                " (fused kernel, in place)"
                if fused
                else " (foreach: one state copy per param group)"
                if cuda
                else ""
            ),
            source="torch 2.13 optim/adam.py _init_group, _multi_tensor_adam, _fused_adam",
        )
    if name == "adamw_anyprecision":
        momentum = Dtype(args.get("momentum_dtype", "float32"))
        variance = Dtype(args.get("variance_dtype", "float32"))
        comp = Dtype(args.get("compensation_buffer_dtype", "bfloat16"))
        numel = sum(t.numel_each * t.repeat for t in tensors)
        states = numel * (momentum.nbytes + variance.nbytes)
        if _arg_true(args, "use_kahan_summation"):
            states += numel * comp.nbytes
        return OptimizerMemory(
            states=states,
            step_counters_host=4 * count,
            step_temporary=2 * _largest(tensors) * variance.nbytes,
            detail=f"AnyPrecisionAdamW: momentum {momentum.value}, variance {variance.value}",
            source="transformers trainer_optimizer.py _get_adamw_anyprecision + torchdistx AnyPrecisionAdamW",
        )
    if name == "adafactor":
        return OptimizerMemory(
            # + state["RMS"] = self._rms(p): a 0-d fp32 tensor per parameter (measured in the torch test)
            states=_adafactor(tensors) + 4 * count,
            step_temporary=_adafactor_temp(tensors),
            detail="Adafactor (beta1=None): factored fp32 row+col second moment, full fp32 for 1-D",
            source="transformers 5.23 optimization.py Adafactor.step; trainer_optimizer.py _get_adafactor",
        )
    if name in ("adamw_torch_4bit", "adamw_torch_8bit"):
        block = int(args.get("block_size", 256))  # trainer_optimizer.py _get_torchao_optimizer default 256
        return _torchao(tensors, bits=4 if name.endswith("4bit") else 8, block=block)
    if name in (
        "adamw_bnb_8bit",
        "adamw_8bit",
        "paged_adamw_32bit",
        "paged_adamw_8bit",
        "lion_8bit",
        "lion_32bit",
        "paged_lion_32bit",
        "paged_lion_8bit",
        "rmsprop_bnb",
        "rmsprop_bnb_8bit",
        "rmsprop_bnb_32bit",
        "ademamix",
        "ademamix_8bit",
        "paged_ademamix_32bit",
        "paged_ademamix_8bit",
    ):
        # trainer_optimizer.py _get_bitsandbytes_optimizer: bits from "8bit" in the name, paged from "paged".
        one_state = "lion" in name or "rmsprop" in name
        return _bnb(
            tensors,
            bits=8 if "8bit" in name else 32,
            n_states=1 if one_state else 2,
            paged="paged" in name,
            ademamix="ademamix" in name,
        )
    if name == "sgd":
        sgd_momentum = _arg_float(args, "momentum", 0.0)  # _get_sgd passes momentum only from optim_args
        nesterov = _arg_true(args, "nesterov")
        return OptimizerMemory(
            states=_torch_states(tensors, 1 if sgd_momentum else 0),
            step_temporary=_foreach_copy(tensors) if (nesterov and cuda) else 0,
            detail=f"torch SGD, momentum={sgd_momentum:g}" + ("" if sgd_momentum else ": no state"),
            source="torch 2.13 optim/sgd.py (momentum_buffer only when momentum != 0)",
        )
    if name == "adagrad":
        return OptimizerMemory(
            states=_torch_states(tensors, 1),
            step_counters_host=4 * count,
            step_temporary=2 * _foreach_copy(tensors) if cuda else 2 * largest_bytes,
            detail="torch Adagrad: state 'sum' in param dtype (std + numerator temporaries)",
            source="torch 2.13 optim/adagrad.py __init__ (state sum), _multi_tensor_adagrad",
        )
    if name == "rmsprop":
        n_states = (
            1
            + (1 if _arg_float(args, "momentum", 0.0) > 0 else 0)
            + (1 if _arg_true(args, "centered") else 0)
        )
        return OptimizerMemory(
            states=_torch_states(tensors, n_states),
            step_counters_host=4 * count,
            step_temporary=_foreach_copy(tensors) if cuda else largest_bytes,
            detail=f"torch RMSprop: {n_states} state(s) in param dtype",
            source="torch 2.13 optim/rmsprop.py _init_group, _multi_tensor_rmsprop (avg = sqrt(square_avg))",
        )
    if name.startswith("galore_"):
        base = "adafactor" if "adafactor" in name else "adamw_8bit" if "8bit" in name else "adamw"
        return _galore(opt, tensors, base, layerwise=name.endswith("layerwise"))
    if name == "lomo":
        return OptimizerMemory(
            states=0,
            in_backward=True,
            detail="LOMO: no states; the update is fused into backward (no full gradient set)",
            source="LOMO paper (arXiv 2306.09782) + transformers trainer_optimizer.py _get_lomo_optimizer",
        )
    if name == "adalomo":
        return OptimizerMemory(
            states=_adafactor(tensors),
            in_backward=True,
            detail="AdaLomo: factored fp32 second moment (row+col), update fused into backward",
            source="AdaLomo paper (arXiv 2310.10195): Adafactor-style factored second moment, "
            "LOMO fused update",
        )
    if name in ("schedule_free_adamw", "schedule_free_radam"):
        return OptimizerMemory(
            states=_torch_states(tensors, 2),
            detail="schedule-free AdamW/RAdam: z + exp_avg_sq in param dtype",
            source="schedulefree adamw_schedulefree.py / radam_schedulefree.py (state z, exp_avg_sq)",
        )
    if name == "schedule_free_sgd":
        return OptimizerMemory(
            states=_torch_states(tensors, 1),
            detail="schedule-free SGD: z in param dtype",
            source="schedulefree sgd_schedulefree.py (state z)",
        )
    if name == "stable_adamw":
        kahan = args.get("kahan_sum")
        per_tensor = 0
        for t in tensors:
            # optimi: kahan_sum=None enables Kahan compensation automatically for 16-bit params.
            use = t.dtype.is_half if kahan is None else _arg_true(args, "kahan_sum")
            per_tensor += (3 if use else 2) * t.nbytes_each * t.repeat
        return OptimizerMemory(
            states=per_tensor,
            detail="optimi StableAdamW: exp_avg + exp_avg_sq (+ Kahan compensation for 16-bit params)",
            source="torch-optimi stableadamw.py; transformers trainer_optimizer.py _get_stable_adamw",
        )
    raise NotModelledError(f"optimizer {name!r} is not modelled")  # pragma: no cover - every name is handled
