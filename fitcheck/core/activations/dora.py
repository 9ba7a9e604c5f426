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
    bias: bool


@dataclass(frozen=True)
class DoraMode:
    """How the model runs (``fitcheck.core.activations.activation_mode.ActivationMode``).

    Element bytes of the linears' inputs/outputs (e) and of the residual stream (r), 16-bit weights, autocast.
    """

    e: int
    r: int
    half: bool
    amp: bool


def _wrapped(spec: TrainingSpec) -> tuple[_Wrapped, ...]:
    from fitcheck.core.states import plan_lora

    lora = spec.lora
    if lora is None or not lora.use_dora:
        return ()
    biased = {p.module for p in spec.model.params if p.kind is Kind.BIAS and p.per_layer}
    out = []
    for t in plan_lora(spec).targets:
        e = t.entry
        if e.per_layer and e.kind is Kind.LINEAR and not t.via_param_wrapper:
            first, bias = e.module in _FIRST, e.module in biased
            out.append(_Wrapped(e.in_features, e.out_features, t.rank, t.layers, first, bias))
    return tuple(out)


def dora_per_token(spec: TrainingSpec, e: int, amp: bool, half: bool) -> int:
    """Bytes per token per decoder layer DoRA saves besides plain LoRA (the base and LoRA outputs).

    Args:
        spec: The training spec (DoRA when ``spec.lora.use_dora``).
        e: Element bytes of the base linears' outputs (model dtype, 2 under autocast).
        amp: Autocast on.
        half: 16-bit model weights.

    Returns:
        Bytes per token of one layer (0 without DoRA).
    """
    lora = spec.lora
    if lora is None:
        return 0
    lo = 2 if amp else 4  # lora_B output: fp32, or 16-bit under autocast (trace: mm (b·s, o))
    base = e if lora.dropout == 0 else lo  # the recomputed base output takes the fp32 input's dtype
    layers = max(1, spec.model.shape.num_layers)
    # ``base_result - bias`` (peft, biased linears, no dropout): an fp32 bias promotes a 16-bit autocast output
    promoted = 4 if amp and not half and lora.dropout == 0 else base
    return sum(((promoted if w.bias else base) + lo) * w.o * w.layers for w in _wrapped(spec)) // layers


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


def dora_transient(spec: TrainingSpec, half: bool, amp: bool, ckpt: bool = False) -> tuple[int, int]:
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
        # inside a checkpointed layer lora_A saves nothing: eye (or its cast) dies with get_lora_weight
        eye = 0 if ckpt else (2 if amp else 4) * i * i
        t = eye + 2 * i * w.r + 12 * p + wcopy if amp else eye + 4 * i * w.r + 12 * p + wcopy
        if amp:
            # in get_lora_weight: eye, its 16-bit cast (saved unless checkpointed), lora_A/B outputs (trace)
            inner = max(6 * i * i, (4 if ckpt else 6) * i * i + 2 * p) + 2 * i * w.r
            t = max(t, inner)
        elif ckpt:
            t = max(t, 4 * i * i + 4 * i * w.r + 4 * p)  # in get_lora_weight: eye, lora_A/B outputs (trace)
        # less this module's own norm vectors and weight copy, counted by dora_fixed but made after the peak
        lora = spec.lora
        if not ckpt:
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
    held = e * mod.o if drop else 0  # the base output, alive until the sum (a recomputed one is saved instead)
    if amp:
        pending += 2 * mod.i  # lora_A's 16-bit input cast comes after the norm
        held += 4 * mod.i if drop else 0  # the fp32 dropout output, read by lora_A and F.linear later
    if drop or half or amp:
        held += e * mod.i  # the module input (act(gate)*up), not saved by the frozen base
        if e == 2 and (drop or amp):
            held += 4 * mod.i  # peft's fp32 copy of it (the saved tensor is the dropout output or a cast)
    return pending - held


def dora_phases(
    spec: TrainingSpec, dm: DoraMode, norm_bytes: int, kept_layers: int, fwd_logits: int, layer_traced: bool = False
) -> tuple[int, int]:
    """(bytes kept from forward into backward, forward-peak excess over the loss peak) of DoRA.

    Args:
        spec: The training spec (DoRA).
        dm: How the model runs.
        norm_bytes: Bytes per token the final norm saves (counted in the saved total, not run at the DoRA peak).
        kept_layers: Layers not checkpointed.
        fwd_logits: The loss-side forward peak (logits, upcast, log-softmax) the DoRA transient competes with.
        layer_traced: The recomputed layer is the one ``lora_recompute.dora_recompute_applies`` was traced on
            (then the top checkpointed layer's up_proj moment, :func:`_top_up_proj`, applies).

    Returns:
        The fixed saved bytes and the excess of ``get_weight_norm``'s peak over the loss peak (0 when lower).
    """
    lora = spec.lora
    if lora is None:
        return 0, 0
    fixed = dora_fixed(spec, dm.half, dm.amp, kept_layers)
    h = spec.model.shape.hidden_size
    tokens = spec.batch.micro_batch * spec.batch.seq_len
    drop = lora.dropout > 0
    ckpt = spec.activations.checkpointing
    transient, width = dora_transient(spec, dm.half, dm.amp, ckpt)
    if ckpt:
        # inside a checkpointed layer nothing is saved: besides the checkpoint inputs (counted) the residual and
        # MLP input are held, and the module's input, its base output, peft's fp32 copy and dropout output
        # (trace "llama dora ckpt", forward peak)
        held = 2 * dm.r * h + (dm.e + (4 if dm.e == 2 else 0) + (4 if drop else 0)) * width + dm.e * h
    else:
        # get_weight_norm of the last layer's largest module (down_proj) runs with every earlier saved tensor
        # alive, and the embedding output, the layer input, the residual and the MLP input held (trace "llama
        # dora", 2 layers, forward peak); an fp32 norm saves its input itself (layer input, residual counted)
        mlp_in_saved = not drop and not (dm.amp or dm.half)
        held = (1 + (2 if dm.half else 0) + (0 if mlp_in_saved else 1)) * dm.r * h
        held -= dora_module_pending(spec, dm.e, dm.amp, dm.half)
    held -= norm_bytes  # the final norm has not run yet
    top = _top_up_proj(spec, dm) if layer_traced else 0
    peak = max(transient + held * tokens, top - norm_bytes * tokens)
    # + position ids (s,) int64, alive through the decoder forward
    return fixed, max(0, peak + 8 * spec.batch.seq_len - fwd_logits)


def _top_up_proj(spec: TrainingSpec, dm: DoraMode) -> int:
    """Bytes besides the checkpoints at up_proj's DoRA output in the top checkpointed layer's no-grad forward
    (16-bit or fp32 model, LoRA dropout on, no autocast, the Llama-style layer; 0 elsewhere, not traced).

    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (transformers 5.23 ``LlamaMLP``): act(gate) (e·I) is alive
    while peft 0.21.2 ``DoraLinearLayer.forward`` (tuners/lora/dora.py; dropout on, so ``base_result`` is None)
    builds ``lora_weight = B @ A`` (fp32 out x in), casts the base weight to fp32 (16-bit model), runs
    ``F.linear`` of the fp32 dropped input (4·I), ``lora_B`` (4·I), its scaled copy (4·I) and the two
    ``mag_norm_scale`` products (8·I), besides up_proj's base output (e·I); the residual (r·h), the norm output
    (e·h), peft's fp32 input copy (4·h, 16-bit model) and the dropout output (4·h) are alive. With a small
    vocabulary this is the end-of-forward peak (trace Mistral-7B DoRA, checkpointing, 8 x 1024: bf16 3520 MiB =
    (24·I + 12·h)·b·s + 8·I·h, fp32 3744 MiB = (28·I + 12·h)·b·s + 4·I·h above the checkpoints, exactly; the
    logits' 2.5 GiB were the formula's peak: -14.9 % / -18.6 %, benchmarks/envelope_ranges.py
    mistral/dora/ckpt/sdpa).
    """
    lora = spec.lora
    if lora is None or lora.dropout == 0 or dm.amp or not spec.activations.checkpointing:
        return 0
    if "up_proj" not in lora.target_modules and "all-linear" not in lora.target_modules:
        return 0
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    per_token = (2 * dm.e + 20) * inter + dm.r * h + dm.e * h + 4 * h + (4 * h if dm.half else 0)
    weights = 4 * inter * h + (4 * inter * h if dm.half else 0)  # B @ A, and the 16-bit weight's fp32 cast
    return per_token * spec.batch.micro_batch * spec.batch.seq_len + weights


def lora_extras_unpinned(spec: TrainingSpec, layernorm_family: bool) -> str | None:
    """Why the LoRA extras of a (non-quantized) LoRA run are not pinned to a trace, or None when they are.

    Args:
        spec: The training spec.
        layernorm_family: The model is one of ``activations_families.FAMILY_FORMULAS`` (GPT-2, BERT, ...).

    Returns:
        A sentence for the finding, or None.
    """
    from fitcheck.core.states import plan_lora

    lora = spec.lora
    if lora is None:
        return None
    if lora.use_dora and layernorm_family:
        return f"DoRA on {spec.model.shape.family} is not modelled: its weight norms and outputs are not counted"
    fused = any(t.entry.kind is Kind.FUSED_EXPERTS for t in plan_lora(spec).targets)
    if fused and not spec.activations.checkpointing:
        return None  # i12moe: counted (activations/param_wrapper.py; envelope.py says which families are checked)
    if fused:
        # peft ParamWrapper merges W + BA per expert tensor, and the grouped matmul saves the merged weight
        # (trace "mixtral all-linear": one model-dtype copy of every layer's experts, -65 % without it)
        return ("LoRA on fused MoE experts (target_parameters) under checkpointing: the merged expert weights of "
                "the recomputed layers are not modelled")
    return None


@dataclass(frozen=True)
class RecomputeInputs:
    """What ``fitcheck.core.activations.decoder`` derives for DoRA's recompute moments (its other modules).

    Attributes:
        lora_stop: ``lora_recompute.recompute_tokens`` of the run (bytes per token alive at a LoRA layer's
            recompute stop besides its saved tensors), None where ``lora_recompute.dora_recompute_applies`` is
            false.
        unmade: ``backward.grads_unmade``: gradient bytes not made before the top layer's first one.
        layer_grad: ``lora_recompute.layer_grads``: one decoder layer's adapter gradient bytes.
    """

    lora_stop: int | None
    unmade: int
    layer_grad: int


def dora_recompute_excess(spec: TrainingSpec, dm: DoraMode, moments: dict[str, int], chosen: int,
                          rec_in: RecomputeInputs) -> int:
    """DoRA's excess, under checkpointing, of the top layer's recompute over the backward moment already counted.

    In backward, the checkpointed top layer re-runs its forward with gradients enabled, so ``get_weight_norm``
    of its largest module (down_proj) runs as in an uncheckpointed forward: ``lora_A`` saves ``eye(i)`` while the
    LoRA weight lives, and the layer's earlier modules already hold their norm vectors and weight copies
    (trace "llama dora ckpt", backward peak at down_proj's ``add`` of W + s·ΔW). The MLP backward working set
    of the top-layer moment does not exist yet; the gradients in flight into the layer do.

    On the Llama layer with LoRA dropout (:func:`dora_recompute_moments`) the recompute's two moments are
    counted with the layer's locals; elsewhere the weight-norm moment with the residual-stream gradient only.

    Args:
        spec: The training spec (DoRA under checkpointing).
        dm: How the model runs.
        moments: ``fitcheck.core.activations.backward.backward_moments`` of the run.
        chosen: The backward bytes ``activations.saved`` already counts (its worst moment, besides gradients).
        rec_in: The LoRA recompute quantities of the run.

    Returns:
        Bytes to add during backward (0 when the recompute is not the worst moment).
    """
    lora = spec.lora
    if lora is None or "top layer" not in moments:
        return 0
    sh = spec.model.shape
    bs = spec.batch.micro_batch * spec.batch.seq_len
    gated = sh.mlp_activation == "swiglu"
    work = (2 * dm.e * sh.intermediate_size * bs if gated else 0) + dm.r * sh.hidden_size * bs
    one_layer = dora_fixed(spec, dm.half, dm.amp, max(1, sh.num_layers)) // max(1, sh.num_layers)
    transient, _ = dora_transient(spec, dm.half, dm.amp, ckpt=False)
    base = moments["top layer"] - work + one_layer
    rec = dora_recompute_moments(spec, dm, rec_in.lora_stop)
    if rec is None:
        at_recompute = base + dm.r * sh.hidden_size * bs + transient
    else:
        # "top layer" / "bottom layer" count every adapter gradient as made (their ``missing`` is a full
        # fine-tune's): at the top layer's recompute none is, at the bottom layer's those of the L - 1 above are
        # (and their checkpoint inputs are freed): the bottom wins at short sequences (1 x 512 at real width)
        stop, weight_norm = rec
        unmade = rec_in.unmade
        above = (max(1, sh.num_layers) - 1) * rec_in.layer_grad if unmade else 0
        worst = max(moments["top layer"] - unmade, moments.get("bottom layer", 0) - unmade + above)
        at_recompute = worst - work + one_layer + max(stop, weight_norm + transient)
    return max(0, at_recompute - chosen)


def dora_recompute_moments(spec: TrainingSpec, dm: DoraMode, lora_stop: int | None) -> tuple[int, int] | None:
    """The top recomputed layer's two DoRA moments beyond its saved tensors (Llama layer, LoRA dropout on).

    peft 0.21.2 ``DoraLinearVariant.forward`` (tuners/lora/variants.py) with dropout runs
    ``DoraLinearLayer.forward`` (tuners/lora/dora.py) on the dropped fp32 input: ``lora_weight =
    lora_B(lora_A(eye(i))).T`` (``lora_A`` saves ``eye`` in a recompute, which runs with gradients on),
    ``get_weight_norm`` (W + s·ΔW and its norm), ``lora_result = lora_B(lora_A(x))``, ``base_result =
    F.linear(x, W)``, then ``(m/‖·‖ - 1) * base_result``: the last tensor the layer saves is packed there and the
    recompute stops (torch 2.13 ``utils/checkpoint.py`` early stop). Fake-tensor trace of Llama-3.1-8B DoRA bf16
    at 8 x 4096, top layer's recompute, every live storage listed: besides the layer's saved tensors and
    norm vectors / weight copies, 43·h bytes per token and down_proj's ``eye`` (4·I²), ``lora_A(eye)`` and its
    LoRA weight (4·h·I) are alive:

    - LoRA's recompute-stop locals and gradients in flight (``lora_recompute.recompute_tokens``: 35·h);
    - the gradients in flight differ from LoRA's (:func:`_dora_in_flight`: +4·h here);
    - the ``(m/‖·‖ - 1) * base_result`` product at the stop (fp32: the magnitude is an fp32 parameter, and a
      product with it promotes a 16-bit operand, autocast or not: 4·h).

    The weight-norm moment (``get_weight_norm``'s ``add``) comes before down_proj's ``lora_A`` / ``lora_B`` /
    ``F.linear`` outputs and the product exist; its weight transient is :func:`dora_transient`'s.

    Args:
        spec: The training spec.
        dm: How the model runs.
        lora_stop: ``lora_recompute.recompute_tokens`` of the run; None where the layer was not traced so.

    Returns:
        (bytes at the stop, bytes at the weight norm less its weight transient) beyond the layer's saved
        tensors, residual-stream gradient included; None where the layer or recipe was not traced so.
    """
    lora = spec.lora
    if lora is None or lora.dropout == 0 or lora_stop is None:
        return None
    sh = spec.model.shape
    down = next((w for w in _wrapped(spec) if w.i == sh.intermediate_size and w.o == sh.hidden_size), None)
    if down is None:
        return None
    bs = spec.batch.micro_batch * spec.batch.seq_len
    lo = 2 if dm.amp else 4
    tokens = lora_stop + _dora_in_flight(dm, down.o) + 4 * down.o
    # down_proj's lora_A / lora_B / recomputed base outputs (counted as saved) and the product: not made yet
    pending = lo * (down.r + 2 * down.o) + 4 * down.o
    pending += 2 * down.i if dm.amp else 0  # autocast: lora_A's 16-bit input cast (saved) comes after the norm
    eye = (2 if dm.amp else 4) * down.i * down.i
    # autocast: ``weight.to(x.dtype)``, the fp32 copy of a 16-bit W, stays a local (F.linear saves its 16-bit
    # cast); ``F.linear``'s 16-bit cast of x (2·i) is alive while it runs, before the product exists (trace
    # Llama-3.1-8B DoRA bf16 + autocast 8 x 4096: the peak at down_proj's base matmul)
    local_w = 4 * down.o * down.i if dm.amp and dm.half else 0
    linear = 2 * down.i - 4 * down.o if dm.amp else 0
    # an fp32 model under autocast: the base down_proj's 16-bit weight cast, saved by its matmul, is alive from
    # ``base_layer(x)`` on (the "top layer" moment counts it freed, ``backward.backward_moments`` cast_down)
    cast_down = 2 * down.o * down.i if dm.amp and not dm.half else 0
    stop = (tokens + max(0, linear)) * bs + eye + 4 * down.i * down.r + 4 * down.o * down.i + local_w
    return stop + cast_down, (tokens - pending) * bs + cast_down


def _dora_in_flight(dm: DoraMode, o: int) -> int:
    """Bytes per token of gradients in flight at the recompute's stop, beyond LoRA's (``lora_recompute``).

    ``result + result_dora`` adds the fp32 DoRA term to a 16-bit base output (a 16-bit model, or autocast): the
    layer output's gradient is cast to fp32 (``.to(torch_result_dtype)``'s backward, 4·o) and kept for the
    ``(m/‖·‖ - 1) * base_result`` branch, the base output gets its 16-bit cast (e·o), and ``* scaling``'s
    backward makes the fp32 gradient of ``mag_norm_scale * lora_result`` (4·o). LoRA's own counts the cast
    (not under autocast: its 16-bit LoRA branch adds without promotion) and ``* scaling``'s gradient (2·o under
    autocast). An fp32 model makes no cast.
    """
    dora = (4 + dm.e) * o if dm.e == 2 else 0
    lora = (dm.e * o if dm.e == 2 and not dm.amp else 0) + (2 if dm.amp else 4) * o
    return dora + 4 * o - lora
