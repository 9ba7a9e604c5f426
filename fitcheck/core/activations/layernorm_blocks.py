"""Saved-activation bytes of the LayerNorm blocks: GPT-2, BERT, Phi (phi-2), Falcon, BLOOM (pure: no torch).

Which block a model runs is its ``ModelShape.traits.recipe`` (:mod:`fitcheck.families`).

Read off fake-tensor traces of the transformers 5.23 models (``fitcheck.torch_adapters.tracer``: per-op
listings of the tensors alive at the end of forward, 2 layers minus 1 layer) and pinned by
``tests/test_activations_families.py``. Notation as in ``fitcheck.core.activations.decoder``: e element bytes of the
model dtype, h hidden, q = heads·head_dim, kv = kv_heads·head_dim, I intermediate, a heads, per token per layer.

What differs between the CPU trace and a CUDA step is modelled from the kernels' documented behaviour:

- Dropout: on CPU ``at::dropout`` keeps its noise tensor in the input dtype (aten/src/ATen/native/Dropout.cpp
  ``_dropout_impl``: ``at::empty_like(input).bernoulli_``), on CUDA it calls ``native_dropout`` whose mask is
  bool (``is_fused_kernel_acceptable`` is true for CUDA tensors): e vs 1 byte per element.
- LayerNorm mean/rstd: the CPU kernel keeps them in the input dtype when input and weight share it
  (aten/src/ATen/native/layer_norm.cpp ``param_scalar_type``), the CUDA kernel in fp32 (``acc_type``).
- SDPA: CPU runs the fused flash kernel only without dropout, mask or a head-count mismatch, and otherwise the
  math path, which upcasts q/k/v to fp32 and keeps the fp32 s² scores, dropout mask and dropped probabilities
  (the GPT-2 / BERT configs have attention dropout 0.1). On CUDA flash (16-bit) and memory-efficient kernels
  (fp32, masks) both support dropout (torch/nn/functional.py ``scaled_dot_product_attention`` notes; aten
  ``sdp_utils.cpp`` ``check_for_dropout`` only rejects it on the CPU flash path): they keep q, k, v, the output
  and an fp32 logsumexp (b, a, s) and regenerate the dropout mask from the Philox seed, so no s² tensor is
  stored. Both fused kernels require equal query and key/value head counts unless ``enable_gqa``
  (``check_batch_size_and_num_heads_dense``): Falcon's multi-query attention runs the math path there too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from fitcheck.core.activations.activation_mode import (
    ActivationMode,
    activation_mode,
    adapter_input_bytes,
)
from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.promoted import other_half_autocast
from fitcheck.core.activations.versions import legacy_softmax_keeps_input
from fitcheck.core.kernels import liger_applies, offload_applies
from fitcheck.spec import AttnImpl, DeviceType, Dropout, LayerRecipe, LoraSpec, MixedPrecision, TrainingSpec

R = LayerRecipe
# Linear module names (peft target names) of each block
_LINEARS: Mapping[LayerRecipe, tuple[str, ...]] = {
    R.GPT2_BLOCK: ("c_attn", "c_proj", "c_fc"),
    R.BERT_BLOCK: ("query", "key", "value", "dense"),
    R.PHI_PARALLEL: ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"),
    R.FALCON_PARALLEL: ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    R.BLOOM_ALIBI: ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
}
# The linears reading the layer input (through its LayerNorm)
FIRST_READERS: Mapping[LayerRecipe, tuple[str, ...]] = {
    R.GPT2_BLOCK: ("c_attn",), R.BERT_BLOCK: ("query", "key", "value"),
    R.PHI_PARALLEL: ("q_proj", "k_proj", "v_proj", "fc1"),
    R.FALCON_PARALLEL: ("query_key_value", "dense_h_to_4h"), R.BLOOM_ALIBI: ("query_key_value",),
}


@dataclass(frozen=True)
class BlockCtx:
    """What decides the saved bytes of one layer."""

    e: int  # element bytes of the model dtype
    dm: int  # dropout-mask element bytes of a tensor in the model dtype: CPU e, CUDA 1 (bool)
    dm32: int  # dropout-mask element bytes of an fp32 tensor (SDPA math path, LoRA dropout): CPU 4, CUDA 1
    ln: int  # LayerNorm mean + rstd bytes per token: CPU 16-bit 2 + 2, otherwise fp32 4 + 4
    cuda: bool
    full: bool  # every weight trained: linears keep their inputs
    eager: bool
    targets: frozenset[str]
    lora_dropout: float
    drop: Dropout
    mode: ActivationMode  # what the adapters save (activation_mode.adapter_input_bytes)
    lora: LoraSpec | None
    mm: int = 0  # element bytes of a matmul output: the model dtype's, 2 for a LoRA run under autocast
    res: int = 0  # element bytes of the residual stream past layer 0 (fp32 where autocast's dtype is not the model's)



def block_ctx(spec: TrainingSpec) -> BlockCtx:
    traits = spec.model.shape.traits
    e = 2 if spec.precision.load_dtype.is_half else 4
    cuda = spec.hardware.device_type is DeviceType.CUDA
    lora = spec.lora
    targets = wrapped_linears(lora, _LINEARS[traits.recipe])
    eager = spec.activations.attn_implementation is AttnImpl.EAGER or traits.eager_only
    mode = _adapter_mode(spec, e)
    full = spec.lora is None and spec.quant is None
    # k-bit / DoRA keep the count without autocast casts (_adapter_mode); so do checkpointed runs whose top-layer
    # moments are not modelled (layernorm_recompute.py): with the 16-bit counts GPT-2 SFT LoRA on c_attn only
    # (peft's default target), 8 x 1024, went from -13.2 % to -19.1 % under the trace, the old count's surplus
    # having stood in for its unmodelled recompute working set
    amp_lora = mode.amp and not full and (not spec.activations.checkpointing or layernorm_recompute_applies(spec))
    # a 16-bit model under the other 16-bit autocast dtype (Phi-2's fp16 weights, bf16 autocast): the layer's
    # 16-bit outputs added to the fp16 residual promote it to fp32 (torch type promotion of bf16 + fp16)
    # (traced for Phi; GPT-2 by the same adds; BERT / Falcon / BLOOM not traced so: unchanged)
    # (a dtype rule: whatever the attention kernel or the checkpointed moments modelled, so eager keeps what SDPA
    # keeps, tests/test_activations_catalog.py; activation_mode.other_half_autocast)
    mixed_half = (mode.amp and not full and e == 2 and traits.recipe in (R.GPT2_BLOCK, R.PHI_PARALLEL)
                  and _other_half(spec))
    return BlockCtx(
        e=e,
        dm=1 if cuda else e,
        dm32=1 if cuda else 4,
        ln=8 if cuda or e == 4 else 4,
        cuda=cuda,
        full=full,
        eager=eager,
        targets=targets,
        lora_dropout=lora.dropout if lora is not None else 0.0,
        drop=traits.dropout,
        mode=mode,
        lora=lora,
        mm=2 if amp_lora else e,
        res=4 if mixed_half else e,
    )


# The MLP's out linear (peft target name) of the blocks whose checkpointed LoRA moments are modelled
_OUT: Mapping[LayerRecipe, str] = {R.GPT2_BLOCK: "c_proj", R.PHI_PARALLEL: "fc2"}


def _other_half(spec: TrainingSpec) -> bool:
    """16-bit weights under the other 16-bit autocast dtype (:func:`other_half_autocast` on the spec's names)."""
    return other_half_autocast(spec.precision.load_dtype.value, spec.precision.mixed_precision.value)


def layernorm_recompute_applies(spec: TrainingSpec) -> bool:
    """Plain LoRA with the MLP's out linear wrapped, every layer checkpointed, SDPA on CUDA under autocast, an fp32
    residual stream (fp32 weights, or 16-bit weights under the other 16-bit autocast dtype): the GPT-2 / Phi runs
    whose top-layer moments ``layernorm_recompute.py`` models (traced there)."""
    sh, lora = spec.model.shape, spec.lora
    recipe = sh.traits.recipe
    act = spec.activations
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    fp32_residual = not spec.precision.load_dtype.is_half or _other_half(spec)
    return (
        recipe in _OUT and lora is not None and spec.quant is None and not lora.use_dora
        and spec.freeze is None and not lora.modules_to_save
        and act.checkpointing and act.checkpoint_every_n_layers == 1
        and act.attn_implementation is not AttnImpl.EAGER and not sh.traits.eager_only
        and spec.hardware.device_type is DeviceType.CUDA and amp and fp32_residual
        and _OUT[recipe] in wrapped_linears(lora, _LINEARS[recipe])
        and liger_applies(spec) is None and not offload_applies(spec)
    )


def _gelu_new_saved(c: BlockCtx, inter: int) -> int:
    """Bytes per token transformers' ``NewGELUActivation`` (activations.py: ``0.5 * input * (1.0 +
    torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))``) saves for backward:
    pow's input, tanh's output, ``0.5 * input`` and ``1 + tanh`` (mul keeps both operands).

    Without autocast, or under CPU autocast, all four are the matmul output's dtype. Under CUDA autocast ``pow`` is
    on the fp32 list (torch 2.13 ``autocast_mode.h`` ``AT_FORALL_FP32``; ``torch_adapters/cuda_emulation.py``), so
    pow saves its fp32 cast of the 16-bit input, and tanh and ``1 + tanh`` follow it in fp32 while ``0.5 * input``
    stays 16-bit: 14·I (fake-tensor trace of GPT-2 LoRA all-linear, fp32 weights, bf16 autocast, 8 x 1024, and of
    Phi-2 LoRA, fp16 weights, bf16 autocast, 4 x 1024: ``_to_copy``, ``tanh``, ``add`` fp32 and ``mul`` bf16 of
    (b, s, I) at ``activations.py:66``; the output is fp32 too, read by the next linear).
    """
    if c.cuda and c.mm == 2 and c.mode.amp and not c.full:
        return (4 + 4 + 4 + 2) * inter
    return 4 * c.mm * inter


def _adapter_mode(spec: TrainingSpec, e: int) -> ActivationMode:
    """How the adapters store their inputs: :func:`activation_mode` (under autocast ``lora_A`` keeps autocast's
    16-bit cast: fake-tensor traces of GPT-2 / Phi / Falcon LoRA, bf16 + autocast, equal at BACKWARD_START). A
    k-bit base or DoRA on these blocks is not traced (``traits.kbit_pinned``, the DoRA recipe: the Llama-style layer
    only): their count stays the one without autocast casts (with them, tiny GPT-2 / Phi at BACKWARD_START vs the
    trace: QLoRA -15 % -> -25 %, DoRA -10.5 % -> -18.7 %, -8.9 % -> -21.5 %)."""
    mode = activation_mode(spec)
    if spec.quant is None and not (spec.lora is not None and spec.lora.use_dora):
        return mode
    return replace(mode, amp=False, autocast=False, half_model=e == 2)  # dm: activation_mode's, kept


def linear_reads(c: BlockCtx, width: int, consumers: tuple[str, ...]) -> int:
    """Bytes per token kept for the linears ``consumers`` reading one tensor of ``width`` features.

    Full fine-tune: the tensor itself (weight gradient). LoRA (peft ``lora.Linear.forward``): per adapter what
    the Llama-style layer's adapters save (:func:`adapter_input_bytes`: the fp32 cast of a 16-bit input, or with
    ``lora_dropout`` the dropout mask and its fp32 output; under autocast the 16-bit cast ``lora_A`` reads instead
    of the fp32 tensor; the ``lora_A`` output that ``lora_B`` keeps).
    """
    if c.full:
        return c.e * width
    hit = [n for n in consumers if n in c.targets]
    if not hit or c.lora is None:
        return 0
    total = len(hit) * adapter_input_bytes(c.mode, c.lora, width)
    if c.lora_dropout == 0 and c.e == 4 and not c.mode.amp:
        total += 4 * width  # fp32 model: lora_A keeps the input tensor itself (shared by the adapters)
    return total


def _keeps(c: BlockCtx, consumers: tuple[str, ...]) -> bool:
    """Whether a tensor is kept by one of the linears reading it (full fine-tune, or a LoRA on one of them)."""
    return c.full or any(n in c.targets for n in consumers)


def _math_attention(c: BlockCtx, q: int, kv: int, a: int, v_fp32: int, p: float) -> tuple[int, int]:
    """SDPA math path (aten ``_scaled_dot_product_attention_math``): q, k scaled in fp32, v in fp32, s² terms.

    ``v_fp32`` is the storage holding v in an fp32 model (v may be a view of a fused qkv output); 16-bit models
    keep an fp32 copy of v (kv). s² per position: fp32 softmax, and with dropout its mask and output.
    """
    per_token = 4 * q + 4 * kv + (4 * kv if c.e == 2 else v_fp32)
    s2 = 4 * a + ((c.dm32 + 4) * a if p > 0 else 0)
    return per_token, s2


def fused_math(c: BlockCtx, p: float, heads_match: bool, mask: bool) -> bool:
    """True when SDPA runs the math path (see the module docstring), False for a fused kernel."""
    if not heads_match:
        return True
    if c.cuda:
        return False
    return p > 0 or mask


def _gpt2(spec: TrainingSpec, c: BlockCtx) -> tuple[int, int]:
    sh = spec.model.shape
    h, a, inter = sh.hidden_size, sh.num_heads, sh.intermediate_size
    pa, pr = c.drop.attention, c.drop.hidden
    e = c.e
    total = 2 * c.ln + 2 * e * h  # ln_1 / ln_2 statistics; the two residual sums (LayerNorm inputs)
    total += linear_reads(c, h, ("c_attn",)) + linear_reads(c, h, ("c_fc",))  # ln_1 / ln_2 outputs
    total += 2 * c.dm * h if pr > 0 else 0  # resid_dropout masks after attention and MLP
    if c.eager:
        total += 3 * e * h  # fused c_attn output: q, k, v are views of it (matmuls keep them)
        s2 = e * a + ((c.dm + e) * a if pa > 0 else 0)  # softmax (model dtype), dropout mask and output
        total += linear_reads(c, h, ("c_proj",)) if _keeps(c, ("c_proj",)) else 0  # merged heads (clone)
    elif fused_math(c, pa, True, False):
        # fp32: v is a transposed view of the fused c_attn output; with b = 1 bmm reads the views (the whole
        # output stays alive), with b > 1 it makes contiguous copies of q, k^T and v instead (trace)
        v_fp32 = 3 * 4 * h if spec.batch.micro_batch == 1 else 4 * h
        math, s2 = _math_attention(c, h, h, a, v_fp32, pa)
        total += math + (linear_reads(c, h, ("c_proj",)) if _keeps(c, ("c_proj",)) else 0)
    else:
        # fused kernel: q, k, v views of c_attn output, output (laid out (b, s, a, d): c_proj reads it), logsumexp
        # (16-bit under autocast: c.mm)
        total += 3 * c.mm * h + c.mm * h + 4 * a
        total += _lora_only(c, h, ("c_proj",))
        s2 = 0
    # MLP: c_fc output, gelu_new's 0.5·x, tanh, 1 + tanh (activations.NewGELUActivation); the product feeds c_proj
    total += _gelu_new_saved(c, inter) + (linear_reads(c, inter, ("c_proj",)) if _keeps(c, ("c_proj",)) else 0)
    return total, s2


def _lora_only(c: BlockCtx, width: int, consumers: tuple[str, ...]) -> int:
    """Extra bytes a LoRA adapter keeps for a tensor already saved by another op (fp32 casts, lora_A output)."""
    if c.full or c.lora is None:
        return 0
    return sum(1 for n in consumers if n in c.targets) * adapter_input_bytes(c.mode, c.lora, width)


def _bert(spec: TrainingSpec, c: BlockCtx) -> tuple[int, int]:
    sh = spec.model.shape
    h, a, inter = sh.hidden_size, sh.num_heads, sh.intermediate_size
    q = sh.num_heads * sh.head_dim
    pa, ph = c.drop.attention, c.drop.hidden
    e = c.e
    # post-LN: the residual sums (LayerNorm inputs) and statistics; the attention-LN output feeds the
    # intermediate dense, the output-LN output the next layer's query/key/value
    total = 2 * e * h + 2 * c.ln
    total += linear_reads(c, h, ("dense",)) + linear_reads(c, h, ("query", "key", "value"))
    total += 2 * c.dm * h if ph > 0 else 0  # hidden dropout masks (attention output, layer output)
    if c.eager:
        total += 3 * e * h  # query, key, value outputs
        s2 = e * a + ((c.dm + e) * a if pa > 0 else 0)
        total += linear_reads(c, q, ("dense",)) if _keeps(c, ("dense",)) else 0
    elif fused_math(c, pa, True, False):
        math, s2 = _math_attention(c, q, q, a, 4 * q, pa)
        total += math + (linear_reads(c, q, ("dense",)) if _keeps(c, ("dense",)) else 0)
    else:
        total += 3 * e * h + e * q + 4 * a + _lora_only(c, q, ("dense",))
        s2 = 0
    # intermediate dense output (kept by the erf GELU), GELU output (the output dense input)
    total += e * inter + (linear_reads(c, inter, ("dense",)) if _keeps(c, ("dense",)) else 0)
    return total, s2


def _phi(spec: TrainingSpec, c: BlockCtx) -> tuple[int, int]:
    sh = spec.model.shape
    h, a, inter = sh.hidden_size, sh.num_heads, sh.intermediate_size
    q, kv = sh.num_heads * sh.head_dim, sh.num_kv_heads * sh.head_dim
    pa, pr = c.drop.attention, c.drop.hidden
    e = c.e
    total = c.ln + linear_reads(c, h, ("q_proj", "k_proj", "v_proj", "fc1"))  # one LayerNorm: parallel attn + MLP
    total += 2 * c.dm * h if pr > 0 else 0  # resid_dropout on the attention and MLP outputs
    total += c.res * h  # the layer output (residual sum)
    if c.eager:
        total += e * (q + 2 * kv)  # rotary q, k (partial rotary: cat of rotated and pass-through) and v
        s2 = 4 * a + (e * a if e == 2 else 0)  # fp32 softmax and its cast to the model dtype
        s2 += (c.dm + e) * a if pa > 0 else 0
        total += linear_reads(c, q, ("dense",)) if _keeps(c, ("dense",)) else 0
    elif fused_math(c, pa, sh.num_kv_heads == sh.num_heads, False):
        math, s2 = _math_attention(c, q, kv, a, 4 * kv, pa)
        total += math + (linear_reads(c, q, ("dense",)) if _keeps(c, ("dense",)) else 0)
    else:
        total += c.mm * (q + 2 * kv) + c.mm * q + 4 * a  # rotary q, k, v, output, logsumexp (16-bit: autocast's casts)
        s2 = 0
        # q is a cat (contiguous (b, a, s, d)): CPU flash and CUDA flash lay the output out like q, and
        # transformers' transpose(1, 2).contiguous() copies it; the memory-efficient kernel (fp32 on CUDA)
        # writes (b, s, a, d), so the dense layer reads the output itself
        if c.cuda and e == 4:
            total += _lora_only(c, q, ("dense",))
        else:
            total += linear_reads(c, q, ("dense",)) if _keeps(c, ("dense",)) else 0
    # MLP: fc1 output, gelu_new's 0.5·x, tanh, 1 + tanh; the product feeds fc2
    total += _gelu_new_saved(c, inter) + (linear_reads(c, inter, ("fc2",)) if _keeps(c, ("fc2",)) else 0)
    return total, s2


def _falcon(spec: TrainingSpec, c: BlockCtx) -> tuple[int, int]:
    sh = spec.model.shape
    h, a, inter = sh.hidden_size, sh.num_heads, sh.intermediate_size
    q, kv = sh.num_heads * sh.head_dim, sh.num_kv_heads * sh.head_dim
    e = c.e
    total = c.ln + linear_reads(c, h, ("query_key_value", "dense_h_to_4h"))  # one LayerNorm (parallel attention)
    total += e * h  # layer output (residual sum)
    total += c.dm * h if c.drop.hidden > 0 else 0  # dropout_add at the end of the layer
    if c.eager:
        total += e * (q + 2 * kv)  # rotary q, k and v (copies made by _split_heads)
        s2 = e * a  # softmax in the model dtype; no attention dropout on the rotary path (modeling_falcon.py)
    else:
        # the causal mask is always materialised (allow_is_causal_skip=False): CPU takes the math path, and on
        # CUDA the fused kernels refuse multi-query heads; SDPA is called with dropout_p=0.0 on the rotary path
        if fused_math(c, 0.0, sh.num_kv_heads == sh.num_heads, True):
            # b > 1: bmm cannot broadcast the single k/v head over a batched view and keeps contiguous
            # copies of k and v expanded to every head (trace)
            kv_kept = q if spec.batch.micro_batch > 1 else kv
            total, s2 = _add(total, _math_attention(c, q, kv_kept, a, 4 * kv_kept, 0.0))
        else:
            total += e * (q + 2 * kv) + e * q + 4 * a  # memory-efficient kernel: q, k, v, output, logsumexp
            s2 = 0
    if c.eager or s2:
        total += linear_reads(c, q, ("dense",)) if _keeps(c, ("dense",)) else 0  # merged heads (reshape copy)
    else:
        total += _lora_only(c, q, ("dense",))  # memory-efficient output is laid out (b, s, a, d): no copy
    # MLP: dense_h_to_4h output (kept by the erf GELU), GELU output (dense_4h_to_h input)
    total += e * inter + (linear_reads(c, inter, ("dense_4h_to_h",)) if _keeps(c, ("dense_4h_to_h",)) else 0)
    return total, s2


def _add(total: int, pair: tuple[int, int]) -> tuple[int, int]:
    return total + pair[0], pair[1]


def _bloom(spec: TrainingSpec, c: BlockCtx) -> tuple[int, int]:
    sh = spec.model.shape
    h, a, inter = sh.hidden_size, sh.num_heads, sh.intermediate_size
    q = sh.num_heads * sh.head_dim
    pa, ph = c.drop.attention, c.drop.hidden
    e = c.e
    total = 2 * c.ln + 2 * e * h  # input / post-attention LayerNorm statistics; residual sums (their inputs)
    total += linear_reads(c, h, ("query_key_value",)) + linear_reads(c, h, ("dense_h_to_4h",))  # LayerNorm outputs
    total += 2 * c.dm * h if ph > 0 else 0  # dropout_add masks
    # eager only (ALiBi): fused qkv output (baddbmm keeps q, k; bmm keeps v), fp32 softmax and its cast
    total += 3 * e * h
    s2 = 4 * a + (e * a if e == 2 else 0) + ((c.dm + e) * a if pa > 0 else 0)
    total += linear_reads(c, q, ("dense",)) if _keeps(c, ("dense",)) else 0  # merged heads
    # MLP: dense_h_to_4h output (kept by bloom's GeLUFunction), GELU output (dense_4h_to_h input)
    total += e * inter + (linear_reads(c, inter, ("dense_4h_to_h",)) if _keeps(c, ("dense_4h_to_h",)) else 0)
    return total, s2


_LAYERS = {R.GPT2_BLOCK: _gpt2, R.BERT_BLOCK: _bert, R.PHI_PARALLEL: _phi, R.FALCON_PARALLEL: _falcon,
           R.BLOOM_ALIBI: _bloom}
# Element bytes of the tensor eager attention's softmax reads (its output's dtype): the model dtype, or fp32 where
# the block calls softmax(..., dtype=torch.float32) (phi, BLOOM: the input is converted first)
_SOFTMAX_INPUT: Mapping[LayerRecipe, int | None] = {R.GPT2_BLOCK: None, R.BERT_BLOCK: None, R.PHI_PARALLEL: 4,
                                                   R.FALCON_PARALLEL: None, R.BLOOM_ALIBI: 4}


def layernorm_block_saved(spec: TrainingSpec) -> tuple[int, int]:
    """(bytes per token, bytes per token per key position) one layer of a LayerNorm family keeps for backward.

    Args:
        spec: A spec whose ``traits.recipe`` is a LayerNorm block.

    Returns:
        Per-token bytes and the coefficient of the s² term (eager or math-path attention).
    """
    c = block_ctx(spec)
    recipe = spec.model.shape.traits.recipe
    per_token, s2 = _LAYERS[recipe](spec, c)
    if legacy_softmax_input_added(spec):  # torch < 1.11 keeps the softmax input (versions.py)
        s2 += (_SOFTMAX_INPUT[recipe] or c.e) * spec.model.shape.num_heads
    return per_token, s2


def legacy_softmax_input_added(spec: TrainingSpec) -> bool:
    """Whether the formulas add the softmax input a torch < 1.11 stack keeps (``versions.py``): an eager LayerNorm
    block. A trace runs the installed torch and cannot show it (``torch_adapters.run_scope.untraced_parts``)."""
    return runs_layernorm_block(spec) and block_ctx(spec).eager and legacy_softmax_keeps_input(spec)


def runs_layernorm_block(spec: TrainingSpec) -> bool:
    """Whether the spec's model runs one of the LayerNorm blocks here."""
    return spec.model.shape.traits.recipe.layernorm_block
