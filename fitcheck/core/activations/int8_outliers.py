"""LLM.int8 on CUDA: the bytes that depend on how many input columns hold an outlier, and their bound; pure.

bitsandbytes 0.50.2, ``has_fp16_weights=False``, ``llm_int8_threshold`` 6.0 (transformers 5.23
``BitsAndBytesConfig`` default), frozen int8 weights (``ctx.needs_input_grad[1]`` False: the fast path).
Per ``Linear8bitLt`` call on CUDA (``nn/modules.py::Linear8bitLt.forward`` -> ``autograd/_functions.py::matmul``
-> ``MatMul8bitLt``; a CPU/XPU input in training runs ``MatMul8bitFp``, which has none of this):

* ``MatMul8bitLt.forward``: ``F.int8_vectorwise_quant(A.to(torch.float16), threshold)``; its CUDA kernel
  (``backends/cuda/ops.py``) marks ``outliers = A.abs() >= threshold`` and ``outlier_cols =
  torch.argwhere(outliers.any(dim=0))``: every column of the 2-D input holding one element ``|x| >= 6``.
  ``int8_mixed_scaled_mm`` (``backends/default/ops.py``; CUDA registers no kernel of its own) then makes
  ``subA = A[:, outlier_cols].contiguous()`` (rows x cols in **A's** dtype: the fp32 norm outputs / MLP product
  after k-bit preparation, the 16-bit attention output under autocast) and the transient ``subB``:
  ``CB[:, outlier_cols].contiguous()`` (int8 ``out x cols``), ``int8_vectorwise_dequant`` = ``A *
  stats.view(-1, 1) * 7.87e-3`` (``_ops.py``: two fp32 ``out x cols`` arrays alive at once), ``.to(A.dtype)``
  (a copy unless A is fp32). ``MatMul8bitLt`` keeps ``ctx.tensors = (CAt, subA, A)`` (``CAt`` None on the fast
  path): an attribute of the node, not ``save_for_backward``, so it lives as long as the graph does (until the
  step's loss is dropped, after backward) and non-reentrant checkpointing's hooks never drop it.
* How many columns: the values decide. A trained checkpoint has a few systematic outlier features (Dettmers
  et al. 2022, arXiv:2208.07339, section 4); a ``from_config`` model with random weights (``benchmarks/
  gpu_truth.py``) has them in almost every down_proj input column (``act(gate) * up``, a product of two
  normals) and in almost none of the norm outputs (``benchmarks/data/int8_cuda_outliers.json``). config.json
  cannot tell; the source bounds it: ``outlier_cols`` is a subset of the input's columns, so ``subA`` is at most
  a second copy of each 8-bit linear's input and ``subB`` at most the whole weight dequantized.

The estimate counts no outlier column (the trained model's few; a lower bound of the terms here);
:func:`int8_outlier_bound` is the other end (every column), reported with the estimate
(``cuda.py`` ``cuda-not-traced``, :func:`int8_outlier_findings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fitcheck.core.activations.int8 import int8_formula_applies
from fitcheck.findings import Finding, Severity
from fitcheck.spec import DeviceType, MixedPrecision, TrainingSpec
from fitcheck.units import format_bytes

SOURCE = ("bitsandbytes 0.50.2 autograd/_functions.py MatMul8bitLt (ctx.tensors = (CAt, subA, A)); "
          "backends/cuda/ops.py int8_vectorwise_quant (outlier_cols); backends/default/ops.py int8_mixed_scaled_mm "
          "(subA, subB)")


@dataclass(frozen=True)
class Int8Linear:
    """One 8-bit linear of the decoder layer as ``MatMul8bitLt`` sees it.

    Attributes:
        name: The module name (``q_proj`` ... ``down_proj``).
        in_features: Columns of its 2-D input ``A`` (the most ``outlier_cols`` can hold).
        out_features: Rows of its int8 weight ``CB``.
        a_bytes: Bytes per element of ``A`` (hence of ``subA``).
    """

    name: str
    in_features: int
    out_features: int
    a_bytes: int


@dataclass(frozen=True)
class Int8Outliers:
    """The outlier-dependent bytes of a run at its shape.

    Attributes:
        kept: Every ``subA`` alive at once: at the start of backward and, retained by the graph, through backward
            (under reentrant checkpointing: the recomputed layer's, during its backward).
        transient: The largest ``subA`` + ``subB`` working set inside one 8-bit linear's forward (or recompute).
        layers: Layers whose nodes hold their ``subA`` at once.
    """

    kept: int
    transient: int
    layers: int

    @property
    def total(self) -> int:
        """Kept plus the largest transient: the most the outliers add to a moment."""
        return self.kept + self.transient


def int8_outliers_apply(spec: TrainingSpec) -> bool:
    """An 8-bit LoRA run of the modelled recipe (:func:`int8_formula_applies`) on CUDA (``MatMul8bitLt``) with an
    outlier threshold (``llm_int8_threshold`` 0: ``int8_scaled_mm`` alone, no outlier column, ``subA = None``)."""
    quant = spec.quant
    return (spec.hardware.device_type is DeviceType.CUDA and int8_formula_applies(spec)
            and quant is not None and quant.int8_threshold > 0)


def int8_linears(spec: TrainingSpec) -> tuple[Int8Linear, ...]:
    """The Llama-style layer's 8-bit linears (less ``llm_int8_skip_modules``) with their input dtype on CUDA.

    After k-bit preparation the norm outputs (q/k/v, gate/up inputs) are fp32, and ``MatMul8bitLt`` returns
    ``A.dtype`` (``int8_scaled_mm(..., dtype=A.dtype)``), so gate/up outputs and their product (down_proj's input)
    are fp32; o_proj reads the attention output, 16-bit under autocast (SDPA's inputs cast by autocast).
    """
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    q, kv = sh.num_heads * sh.head_dim, sh.num_kv_heads * sh.head_dim
    attn = 2 if spec.precision.mixed_precision is not MixedPrecision.NO else 4
    skip = set(spec.quant.skip_modules) if spec.quant is not None else set()
    rows = (
        Int8Linear("q_proj", h, q, 4), Int8Linear("k_proj", h, kv, 4), Int8Linear("v_proj", h, kv, 4),
        Int8Linear("o_proj", q, h, attn), Int8Linear("gate_proj", h, inter, 4), Int8Linear("up_proj", h, inter, 4),
        Int8Linear("down_proj", inter, h, 4),
    )
    return tuple(r for r in rows if r.name not in skip)


def sub_a_bytes(linear: Int8Linear, tokens: int, cols: int) -> int:
    """``subA = A[:, outlier_cols].contiguous()``: tokens x cols in A's dtype."""
    return tokens * cols * linear.a_bytes


def forward_transient(linear: Int8Linear, tokens: int, cols: int) -> int:
    """The largest outlier-dependent set alive inside one ``MatMul8bitLt.forward`` (beyond ``A`` and the output).

    ``int8_mixed_scaled_mm`` (backends/default/ops.py), in order: ``subA``; ``CB[:, cols].contiguous()`` (int8)
    while ``int8_vectorwise_dequant`` (_ops.py) holds ``A * stats`` and the result times 1/127 (two fp32 ``out x
    cols``); ``.to(A.dtype)`` (a copy beside the fp32 one when A is 16-bit); then, with ``subB`` alive,
    ``output.addmm(subA, subB)``: a new ``tokens x out`` output in A's dtype beside the int8 GEMM's. Not counted:
    the CUDA quantizer's int8 ``CA`` (tokens x in, 1 B per input element), alive with or without outliers."""
    if cols <= 0:
        return 0
    sub_b = linear.out_features * cols
    e = linear.a_bytes
    dequant = sub_b * (1 + 4 + 4)  # CB[:, cols] int8, A * stats (fp32), * 1/127 (fp32)
    cast = sub_b * (4 + e) if e != 4 else 0  # the fp32 result and its .to(A.dtype) copy
    addmm = sub_b * e + tokens * linear.out_features * e  # subB and addmm's new output
    return sub_a_bytes(linear, tokens, cols) + max(dequant, cast, addmm)


def _kept_layers(spec: TrainingSpec) -> int:
    """Layers whose ``MatMul8bitLt`` nodes hold their ``subA`` at once: every layer (the graph lives until the step
    ends), but one under reentrant checkpointing (its forward runs under no_grad: no node; each layer's recomputed
    graph lives through that layer's backward only, torch/utils/checkpoint.py ``CheckpointFunction.backward``)."""
    act = spec.activations
    if act.checkpointing and act.use_reentrant:
        return 1
    return spec.model.shape.num_layers


def int8_outlier_bytes(spec: TrainingSpec, columns: Mapping[str, Sequence[int]] | None = None) -> Int8Outliers:
    """The outlier-dependent bytes at the run's shape, for given outlier columns of each 8-bit linear.

    Args:
        spec: A spec for which :func:`int8_outliers_apply`.
        columns: Outlier columns per linear name (``down_proj``, or a dotted path ending in it), one entry per
            layer from layer 0 (a shorter list repeats its last entry); None: every input column (the bound).

    Returns:
        What every layer's ``subA`` keeps and the largest transient of one linear.
    """
    if not int8_outliers_apply(spec):
        return Int8Outliers(0, 0, 0)
    tokens = spec.batch.micro_batch * spec.batch.seq_len
    n = spec.model.shape.num_layers
    layers = _kept_layers(spec)
    kept = 0
    transient = 0
    ckpt = spec.activations.checkpointing
    by_name = {k.rsplit(".", 1)[-1]: list(v) for k, v in (columns or {}).items()}
    for lin in int8_linears(spec):
        given = None if columns is None else by_name.get(lin.name) or [0]
        for layer in range(n):
            cols = lin.in_features if given is None else given[min(layer, len(given) - 1)]
            cols = min(lin.in_features, max(0, cols))
            transient = max(transient, forward_transient(lin, tokens, cols))
            # layer 0's q/k/v record no node without checkpointing (int8.py int8_first_layer_unsaved): no ctx
            unsaved = layer == 0 and not ckpt and lin.name in ("q_proj", "k_proj", "v_proj")
            if layer >= n - layers and not unsaved:  # the top `layers` layers (all, or the recomputed one)
                kept += sub_a_bytes(lin, tokens, cols)
    return Int8Outliers(kept, transient, layers)


def int8_outlier_bound(spec: TrainingSpec) -> Int8Outliers:
    """Every input column an outlier column: the most ``MatMul8bitLt`` can add (``outlier_cols`` is a subset of
    the input's columns)."""
    return int8_outlier_bytes(spec, None)


def int8_outlier_gap(spec: TrainingSpec) -> str:
    """The ``cuda-not-traced`` sentence for an 8-bit CUDA run: what the outliers may add at this shape."""
    bound = int8_outlier_bound(spec)
    return (
        "LLM.int8 layers run MatMul8bitLt on CUDA, modelled from its source (not traced: CPU runs MatMul8bitFp); "
        "it copies the input columns holding an |x| >= llm_int8_threshold value (subA, the input's dtype, kept "
        "until the step ends) and dequantizes the weight's matching columns (subB, transient); how many depends "
        "on the weights and data: the estimate counts none (a trained checkpoint has a few such columns), every "
        f"column would add {format_bytes(bound.kept)} kept over {bound.layers} layer{'s' if bound.layers > 1 else ''} "
        f"plus "
        f"{format_bytes(bound.transient)} inside the largest 8-bit linear (random from_config weights: almost "
        "every down_proj input column)"
    )


def int8_outlier_findings(spec: TrainingSpec, device_used: int, budget: int) -> tuple[Finding, ...]:
    """A WARNING ``int8-outliers-may-not-fit`` when the run fits without outlier columns but not with every one.

    Args:
        spec: The training run.
        device_used: The estimate's device bytes (no outlier column).
        budget: The GPU's bytes.

    Returns:
        The finding, or nothing.
    """
    if not int8_outliers_apply(spec) or device_used > budget:
        return ()
    bound = int8_outlier_bound(spec)
    if device_used + bound.total <= budget:
        return ()
    return (Finding(
        "int8-outliers-may-not-fit",
        Severity.WARNING,
        f"fits with few outlier columns (a trained checkpoint's), but bitsandbytes' MatMul8bitLt keeps a copy of "
        f"every input column holding an |x| >= llm_int8_threshold value: with every column one, up to "
        f"{format_bytes(bound.total)} more ({SOURCE})",
        "measure one step with the real checkpoint, or leave that margin (non-reentrant checkpointing keeps "
        "the copies too; gradient_checkpointing_kwargs={'use_reentrant': True} keeps one layer's at a time)",
    ),)
