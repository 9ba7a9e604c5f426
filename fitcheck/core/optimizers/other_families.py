"""Optimizer memory for the non-torch families: bitsandbytes, torchao, Adafactor, GaLore and the rest.

* bitsandbytes (``optim/optimizer.py``): 32-bit states are fp32 whatever the param dtype; 8-bit states are
  uint8 with an fp32 absmax per 256 elements, but tensors under ``min_8bit_size`` = 4096 elements keep fp32
  states; the Trainer registers every ``nn.Embedding`` weight for 32-bit states
  (``trainer.py::create_optimizer``). Paged optimizers put state tensors of >= 1e5 elements in CUDA managed
  memory (``get_state_buffer``), outside torch's allocator. AdEMAMix keeps a double-size ``state1`` (fast +
  slow EMA) and ``state2`` (``optim/ademamix.py``). The CUDA 8-bit/32-bit update kernels write in place.
* transformers ``Adafactor`` (``optimization.py``): no first moment (``beta1=None``); fp32
  ``exp_avg_sq_row`` + ``exp_avg_sq_col`` for tensors of >= 2 dims, full fp32 ``exp_avg_sq`` for 1-D;
  per-parameter fp32 temporaries (:func:`fitcheck.core.optimizers.step_tensors.adafactor_peak`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from fitcheck.core.optimizers.step_tensors import OptimizerMemory, TensorGroup, adafactor_peak
from fitcheck.errors import NotModelledError
from fitcheck.spec import Dtype, OptimizerSpec

_MIN_8BIT = 4096  # bitsandbytes optim/optimizer.py min_8bit_size default; torchao optim/adam.py same threshold
_BNB_BLOCK = 256  # bitsandbytes Optimizer2State.init_state: blocksize = 256
_PAGED_MIN = 100_000  # bitsandbytes get_state_buffer: p.numel() < 1e5 -> ordinary torch allocation
_QMAP = 256 * 4  # bitsandbytes create_dynamic_map: 256 fp32 values

BNB_NAMES: frozenset[str] = frozenset(
    {
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
    }
)


def count(tensors: Sequence[TensorGroup]) -> int:
    """Number of tensors."""
    return sum(t.repeat for t in tensors)


def torch_states(tensors: Sequence[TensorGroup], n_states: int) -> int:
    """``n_states`` ``zeros_like(p)`` buffers per tensor (param dtype)."""
    return n_states * sum(t.nbytes_each * t.repeat for t in tensors)


def arg_float(args: Mapping[str, str], key: str, default: float) -> float:
    """A float ``optim_args`` value, or the default when absent or unparsable."""
    try:
        return float(args.get(key, default))
    except ValueError:
        return default


def arg_true(args: Mapping[str, str], key: str) -> bool:
    """A boolean ``optim_args`` value (``true``/``1``/``yes``)."""
    return str(args.get(key, "false")).lower() in ("true", "1", "yes")


def _largest(tensors: Sequence[TensorGroup]) -> int:
    return max((t.numel_each for t in tensors), default=0)


def _bnb_cpu_adam_temp(t: TensorGroup, eight: bool) -> int:
    # backends/cpu/ops.py _optimizer_update_{8bit_blockwise,32bit}_cpu (one tensor per call), fp32 per element:
    # g.float() * gnorm_scale, sqrt + denom, p.float() for 16-bit params, dequantized states when 8-bit
    # (measured: 20/24 B per element 8-bit fp32/bf16, 12/16 B 32-bit; tests/test_optimizers_measured.py).
    return t.numel_each * (12 + (4 if t.dtype.is_half else 0) + (8 if eight else 0))


def bnb_memory(name: str, tensors: Sequence[TensorGroup], *, cuda: bool = True) -> OptimizerMemory:
    """bitsandbytes optimizers (``trainer_optimizer.py::_get_bitsandbytes_optimizer``: bits from ``8bit`` in
    the name, paged from ``paged``).

    On CUDA the update kernels (``backends/cuda/ops.py``: the C library called on raw pointers) allocate
    nothing. On CPU the reference update of AdamW works per tensor in fp32 (:func:`_bnb_cpu_adam_temp`);
    the CPU temporaries of the other bnb families are not modelled (0).
    """
    bits = 8 if "8bit" in name else 32
    n_states = 1 if ("lion" in name or "rmsprop" in name) else 2
    paged, ademamix = "paged" in name, "ademamix" in name
    cpu_adam = not cuda and "adamw" in name
    device = managed = temp = 0
    any_8bit = False
    for t in tensors:
        n = t.numel_each
        eight = bits == 8 and n >= _MIN_8BIT and not t.embedding
        if cpu_adam:
            temp = max(temp, _bnb_cpu_adam_temp(t, eight))
        elem = 1 if eight else 4
        # AdEMAMix: state1 is (2, *shape), state2 is shape -> 3 state tensors' worth.
        state_bytes = (3 if ademamix else n_states) * n * elem
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
        step_temporary=temp,
        detail=f"bitsandbytes {kind} states ({'3' if ademamix else n_states} per param)",
        source="bitsandbytes 0.50.2 optim/optimizer.py Optimizer2State/1State.init_state, get_state_buffer",
    )


def torchao_memory(tensors: Sequence[TensorGroup], *, bits: int, block: int) -> OptimizerMemory:
    """torchao low-bit AdamW (``adamw_torch_4bit`` / ``adamw_torch_8bit``)."""
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
    return OptimizerMemory(
        states=states,
        step_counters_host=4 * count(tensors),
        # single_param_adam under torch.compile: fp32 p, grad, exp_avg, exp_avg_sq of one tensor at a time.
        step_temporary=4 * 4 * _largest(tensors),
        detail=f"torchao {bits}-bit AdamW states (block {block}); step temporaries assumed 4 fp32 "
        "copies of the largest tensor (compiled kernel, not measured)",
        source="torchao optim/adam.py _new_buffer + subclass_8bit.py/subclass_4bit.py zeros",
    )


def adafactor_states(tensors: Sequence[TensorGroup]) -> int:
    """Factored fp32 second moment: row + col vectors for >= 2-D tensors, a full fp32 copy for 1-D."""
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


def adafactor_memory(tensors: Sequence[TensorGroup]) -> OptimizerMemory:
    """transformers Adafactor as the Trainer builds it (``scale_parameter=False, relative_step=False``)."""
    return OptimizerMemory(
        # + state["RMS"] = self._rms(p): a 0-d fp32 tensor per parameter (measured in the torch test)
        states=adafactor_states(tensors) + 4 * count(tensors),
        step_temporary=adafactor_peak(tensors),
        detail="Adafactor (beta1=None): factored fp32 row+col second moment, full fp32 for 1-D",
        source="transformers 5.23 optimization.py Adafactor.step; trainer_optimizer.py _get_adafactor",
    )


def _galore_split(tensors: Sequence[TensorGroup], rank: int) -> tuple[list[TensorGroup], int, int, tuple[int, int]]:
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
        # galore_projector.py std: m >= n -> right projection B=(r, n), low-rank grad (m, r); else left.
        projected += r * max(m, n) * t.repeat
        proj_bytes += r * min(m, n) * t.dtype.nbytes * t.repeat
        if m * n > largest[0] * largest[1]:
            largest = (m, n)
    return plain, projected, proj_bytes, largest


def galore_memory(opt: OptimizerSpec, tensors: Sequence[TensorGroup], name: str) -> OptimizerMemory:
    """GaLore (AdamW / 8-bit AdamW / Adafactor base, optionally layer-wise)."""
    base = "adafactor" if "adafactor" in name else "adamw_8bit" if "8bit" in name else "adamw"
    if not any(t.low_rank for t in tensors):
        raise NotModelledError(
            f"{opt.name} needs optim_target_modules that match nn.Linear weights (transformers raises "
            "'No target modules found'); none matched"
        )
    rank = int(opt.args.get("rank", 128))  # trainer_optimizer.py _get_galore_optimizer default rank 128
    plain, projected, proj_bytes, largest = _galore_split(tensors, rank)
    dtype = next(t.dtype for t in tensors if t.low_rank)
    if base == "adafactor":
        states = adafactor_states(plain)
        states += 4 * projected  # factored over the (m, r) projected grad: bounded by full fp32 for r << m
    elif base == "adamw_8bit":
        states = bnb_memory("adamw_8bit", plain).states
        states += 2 * projected + 2 * 4 * (-(projected // -_BNB_BLOCK))
    else:
        states = torch_states(plain, 2) + 2 * projected * dtype.nbytes
    # get_orthogonal_matrix every update_proj_gap steps: fp32 copy + U (m,k) + Vh (k,n) of the largest target,
    # plus project_back's full-rank update in the param dtype.
    m, n = largest
    k = min(m, n)
    svd = 4 * (m * n + m * k + k * n) + m * n * dtype.nbytes
    return OptimizerMemory(
        states=states,
        projections=proj_bytes,
        step_temporary=svd,
        in_backward=name.endswith("layerwise"),
        detail=f"GaLore ({base}) rank {rank}: states in the projected space for optim_target_modules",
        source="galore_torch galore_projector.py (std projection) + transformers trainer_optimizer.py",
    )


def anyprecision_memory(opt: OptimizerSpec, tensors: Sequence[TensorGroup]) -> OptimizerMemory:
    """torchdistx AnyPrecisionAdamW (``adamw_anyprecision``)."""
    args = opt.args
    momentum = Dtype(args.get("momentum_dtype", "float32"))
    variance = Dtype(args.get("variance_dtype", "float32"))
    comp = Dtype(args.get("compensation_buffer_dtype", "bfloat16"))
    numel = sum(t.numel_each * t.repeat for t in tensors)
    states = numel * (momentum.nbytes + variance.nbytes)
    if arg_true(args, "use_kahan_summation"):
        states += numel * comp.nbytes
    return OptimizerMemory(
        states=states,
        step_counters_host=4 * count(tensors),
        step_temporary=2 * _largest(tensors) * variance.nbytes,
        detail=f"AnyPrecisionAdamW: momentum {momentum.value}, variance {variance.value}",
        source="transformers trainer_optimizer.py _get_adamw_anyprecision + torchdistx AnyPrecisionAdamW",
    )


def other_memory(name: str, opt: OptimizerSpec, tensors: Sequence[TensorGroup]) -> OptimizerMemory | None:
    """LOMO/AdaLomo, schedule-free and StableAdamW; None for any other name."""
    if name == "lomo":
        return OptimizerMemory(
            states=0,
            in_backward=True,
            detail="LOMO: no states; the update is fused into backward (no full gradient set)",
            source="LOMO paper (arXiv 2306.09782) + transformers trainer_optimizer.py _get_lomo_optimizer",
        )
    if name == "adalomo":
        return OptimizerMemory(
            states=adafactor_states(tensors),
            in_backward=True,
            detail="AdaLomo: factored fp32 second moment (row+col), update fused into backward",
            source="AdaLomo paper (arXiv 2310.10195): Adafactor-style factored second moment, LOMO fused update",
        )
    if name in ("schedule_free_adamw", "schedule_free_radam"):
        return OptimizerMemory(
            states=torch_states(tensors, 2),
            detail="schedule-free AdamW/RAdam: z + exp_avg_sq in param dtype",
            source="schedulefree adamw_schedulefree.py / radam_schedulefree.py (state z, exp_avg_sq)",
        )
    if name == "schedule_free_sgd":
        return OptimizerMemory(
            states=torch_states(tensors, 1),
            detail="schedule-free SGD: z in param dtype",
            source="schedulefree sgd_schedulefree.py (state z)",
        )
    if name == "stable_adamw":
        kahan = opt.args.get("kahan_sum")
        per_tensor = 0
        for t in tensors:
            # optimi: kahan_sum=None enables Kahan compensation automatically for 16-bit params.
            use = t.dtype.is_half if kahan is None else arg_true(opt.args, "kahan_sum")
            per_tensor += (3 if use else 2) * t.nbytes_each * t.repeat
        return OptimizerMemory(
            states=per_tensor,
            detail="optimi StableAdamW: exp_avg + exp_avg_sq (+ Kahan compensation for 16-bit params)",
            source="torch-optimi stableadamw.py; transformers trainer_optimizer.py _get_stable_adamw",
        )
    return None
