"""DoRA's extra activation memory for the Llama-like decoder families (pure: no torch).

Read off fake-tensor traces of peft 0.21.2 on the transformers 5.23 models (``fitcheck.torch_adapters.tracer``,
per-op listings of the tensors alive, 2 layers minus 1 layer; pinned by ``tests/test_activations_lora_extras.py``).
peft ``DoraLinearVariant.forward`` / ``DoraLinearLayer.forward`` (tuners/lora/variants.py, dora.py), per wrapped
linear of ``o`` outputs, ``i`` inputs, ``P = o·i`` weights, rank ``r``:

* ``result_dora = (m/‖W + s·BA‖ - 1) * base_result + m/‖W + s·BA‖ * lora_B(lora_A(x)) * s``: the trainable
  magnitude ``m`` makes both products save their other operand: the base output (model dtype; with
  ``lora_dropout`` the base matmul is recomputed on the dropped fp32 input, so fp32, or 16-bit under autocast)
  and the LoRA output (fp32, 16-bit under autocast), per token; plus the fp32 norm, ``m/norm`` and
  ``m/norm - 1`` vectors (3 x 4o bytes, not per token).
* with dropout, ``F.linear(dropout(x), W.to(x.dtype))``: x is peft's fp32 input, so a 16-bit model keeps an fp32
  copy of every wrapped weight for backward (4P), autocast its 16-bit cast (2P); an fp32 model keeps W itself.
* ``get_weight_norm`` builds ``W + s·(lora_B(lora_A(eye(i)))).T`` in fp32 on every forward: a transient
  ``eye(i)`` (4i²), ``lora_A(eye)`` (4ir), the LoRA weight (4P), the scaled copy and the sum (4P each), and the
  fp32 copy of a 16-bit W (4P). The largest module (down_proj: i = intermediate size) sets the forward peak.
* layer 0: q/k/v read a tensor that needs no gradient: their ``m/norm - 1`` and weight copies are not saved.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.spec import Kind, TrainingSpec

_FIRST = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj"})  # modules reading the layer's (normed) input


@dataclass(frozen=True)
class _Wrapped:
    """One DoRA-wrapped linear: features, rank, instances and whether it reads the layer input."""

    i: int
    o: int
    r: int
    layers: int
    first: bool


def _wrapped(spec: TrainingSpec) -> tuple[_Wrapped, ...]:
    from fitcheck.core.lora import plan_lora

    lora = spec.lora
    if lora is None or not lora.use_dora:
        return ()
    out = []
    for t in plan_lora(spec).targets:
        e = t.entry
        if e.per_layer and e.kind is Kind.LINEAR and not t.via_param_wrapper:
            out.append(_Wrapped(e.in_features, e.out_features, t.rank, t.layers, e.module in _FIRST))
    return tuple(out)


def dora_per_token(spec: TrainingSpec, e: int, amp: bool) -> int:
    """Bytes per token per decoder layer DoRA saves besides plain LoRA (the base and LoRA outputs).

    Args:
        spec: The training spec (DoRA when ``spec.lora.use_dora``).
        e: Element bytes of the base linears' outputs (model dtype, 2 under autocast).
        amp: Autocast on.

    Returns:
        Bytes per token of one layer (0 without DoRA).
    """
    lora = spec.lora
    if lora is None:
        return 0
    lo = 2 if amp else 4  # lora_B output: fp32, or 16-bit under autocast (trace: mm (b·s, o))
    base = e if lora.dropout == 0 else lo  # the recomputed base output takes the fp32 input's dtype
    layers = max(1, spec.model.shape.num_layers)
    return sum((base + lo) * w.o * w.layers for w in _wrapped(spec)) // layers


def _weight_copy(half: bool, amp: bool, drop: bool) -> int:
    """Bytes per weight of the copy ``F.linear(dropout(x), W.to(fp32))`` saves (dropout only)."""
    if not drop:
        return 0
    if amp:
        return 2  # autocast's 16-bit cast of a frozen weight: not cached, saved by the matmul
    return 4 if half else 0  # fp32 copy of a 16-bit weight; an fp32 W is saved as itself


def dora_fixed(spec: TrainingSpec, half: bool, amp: bool, kept_layers: int) -> int:
    """Bytes DoRA saves that do not scale with tokens (norm vectors, weight copies), over the kept layers.

    Args:
        spec: The training spec.
        half: 16-bit model weights.
        amp: Autocast on.
        kept_layers: Layers whose saved tensors stay (not checkpointed).

    Returns:
        Bytes at the end of forward (0 without DoRA).
    """
    lora = spec.lora
    if lora is None or kept_layers <= 0:
        return 0
    wcopy = _weight_copy(half, amp, lora.dropout > 0)
    layers = max(1, spec.model.shape.num_layers)
    total = 0
    for w in _wrapped(spec):
        each = 12 * w.o + wcopy * w.o * w.i  # norm, m/norm, m/norm - 1 (fp32) + the weight copy
        total += each * w.layers * kept_layers // layers
        if w.first and kept_layers == layers and not spec.activations.checkpointing:
            total -= 4 * w.o + wcopy * w.o * w.i  # layer 0: input needs no gradient (trace, 1 layer)
    return total


def dora_transient(spec: TrainingSpec, half: bool, amp: bool) -> tuple[int, int]:
    """The ``get_weight_norm`` peak of the largest wrapped linear, and that module's input width.

    Args:
        spec: The training spec.
        half: 16-bit model weights (``W.to(fp32)`` makes a copy).
        amp: Autocast on: ``lora_A(eye)`` runs on a saved 16-bit cast of ``eye`` and the fp32 ``eye`` dies.

    Returns:
        (transient bytes, input features of that module); (0, 0) without DoRA.
    """
    best, width = 0, 0
    for w in _wrapped(spec):
        p, i = w.o * w.i, w.i
        # eye(i), lora_A(eye), the LoRA weight (fp32; autocast: .to(fp32) of its 16-bit output), s·ΔW,
        # W + s·ΔW, + the fp32 copy of a 16-bit W (trace: eye, mm, _to_copy, mul, add)
        wcopy = 4 * p if half else 0
        t = 2 * i * i + 2 * i * w.r + 12 * p + wcopy if amp else 4 * i * i + 4 * i * w.r + 12 * p + wcopy
        if amp:
            t = max(t, 6 * i * i)  # eye and its 16-bit cast, both alive inside lora_A
        # less this module's own norm vectors and weight copy, counted by dora_fixed but made after the peak
        lora = spec.lora
        t -= 12 * w.o + _weight_copy(half, amp, lora is not None and lora.dropout > 0) * p
        if t > best:
            best, width = t, i
    return best, width


def dora_module_pending(spec: TrainingSpec, e: int, amp: bool, half: bool) -> int:
    """Bytes per token the largest wrapped module has not saved yet at its ``get_weight_norm`` peak, less what
    its forward holds meanwhile (its input and peft's fp32 copy of it), for the down_proj-like last module.

    Args:
        spec: The training spec.
        e: Element bytes of the module's 16-bit/32-bit input and outputs.
        amp: Autocast on.
        half: 16-bit model weights.

    Returns:
        Bytes per token (positive: counted in the saved total but not yet alive).
    """
    lora = spec.lora
    if lora is None:
        return 0
    wrapped = _wrapped(spec)
    _, width = dora_transient(spec, half, amp)
    mod = next((w for w in wrapped if w.i == width), None)
    if mod is None:
        return 0
    drop = lora.dropout > 0
    lo = 2 if amp else 4
    pending = lo * (mod.r + mod.o) + (lo * mod.o if drop else 0)  # lora_A, lora_B (+ recomputed base) outputs
    if amp and not drop:
        pending += 2 * mod.i  # lora_A's 16-bit input cast comes after the norm
    held = 0
    if not drop and not half and not amp:
        held = 0  # fp32: the input is what lora_A saves
    else:
        held = e * mod.i  # the module input (act(gate)*up), not saved by the frozen base
        if e == 2 and (drop or amp):
            held += 4 * mod.i  # peft's fp32 copy of it (the saved tensor is the dropout output or a cast)
    return pending - held
