"""Trace a step on the CPU as CUDA runs it: the kernels and autocast lists whose CUDA behaviour keeps other tensors.

A trace describes a CUDA run unless the spec says ``device_type cpu`` (``trace_arguments.trace_kwargs``:
``cuda_kernels``). Three places where torch's CPU and CUDA paths keep different tensors for backward, and the autocast
state a library reads through the CUDA-only call (item 5), are emulated while such a step is traced (``cuda_kernels``),
and the cuBLAS workspaces a CUDA step allocates are recorded for the allocator replay
(``tracer.trace_step(cublas_workspaces=...)``); a ``device_type cpu`` trace and a real CPU step
(``benchmarks/cpu_truth.py``) keep CPU behaviour.

1. Dropout (``tracer_patches.cuda_dropout``): CUDA's ``native_dropout`` keeps a bool mask, the CPU kernel its noise.
2. SDPA with dropout (``cuda_sdpa``). torch 2.13 ``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp``
   ``use_flash_attention_cpp`` rejects ``dropout_p > 0`` (``check_for_dropout``), so on a CPU the attention of a
   model with attention dropout (GPT-2, BERT: ``attn_pdrop`` 0.1) runs ``_scaled_dot_product_attention_math``,
   which keeps the fp32 s x s softmax, its dropout noise and the dropped probabilities per layer. On CUDA
   (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: flash for fp16/bf16, memory-efficient for fp32, both
   accept dropout) the kernel draws the mask with Philox inside and saves only q, k, v, the output, an fp32
   logsumexp (b, heads, s; memory-efficient pads s to a multiple of 32) and the seed/offset
   (``tools/autograd/derivatives.yaml`` ``_scaled_dot_product_flash_attention`` /
   ``_scaled_dot_product_efficient_attention``: their backward takes exactly those). The CPU flash kernel of the
   same call without dropout saves the same tensors (q, k, v, output, fp32 logsumexp), so the trace runs SDPA with
   ``dropout_p=0``: dropout there changes values, not what is kept. Measured on an H200
   (``benchmarks/data/gpu_truth_nvidia_h200.json``, GPT-2 fp32 full, 8 x 1024): the CPU-kernel trace answered
   28289 MiB against 14470 MiB measured (+95.5 %).
3. CUDA autocast's fp32 lists (``cuda_autocast_lists``). torch 2.13 ``torch/include/ATen/autocast_mode.h``
   ``AT_FORALL_FP32`` (``layer_norm``, ``native_layer_norm``, ``rms_norm``, ``group_norm``, ``pow``, ``exp``,
   ``log``, ``rsqrt``, ``softplus``, ...), ``AT_FORALL_FP32_SET_OPT_DTYPE`` (``softmax``, ``log_softmax``,
   ``sum``, ``cumsum``, ...) and ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`` (``norm``) are registered for the
   ``AutocastCUDA`` key only (``aten/src/ATen/autocast_mode.cpp``: ``KERNEL_CUDA(..., fp32)``); the ``AutocastCPU``
   registrations there have no such entries, so under CPU autocast a bf16 ``layer_norm`` or ``x.pow(3)``
   (``gelu_new``) stays bf16 while CUDA autocast runs it in fp32 and keeps fp32 tensors. The emulation registers, for
   the ``AutocastCPU`` key and only for the ops that key has no kernel for, the CUDA wrapper's policy
   (``autocast_mode.h`` ``WrapFunction_``): cast every floating, non-double tensor argument to fp32 (``fp32``), set
   an unset ``dtype`` argument to fp32 when the first argument is eligible (``fp32_set_opt_dtype``), or redispatch
   ``norm`` with an fp32 dtype (``fp32_append_dtype``). Being an autocast kernel it sits above autograd (the casts
   are recorded, the op saves the fp32 tensors, as on CUDA) and is off wherever autocast is disabled
   (``torch.autocast("cpu", enabled=False)`` in the rotary embeddings). Measured on an H200 (Phi-2 LoRA default
   targets, bf16 autocast, 4 x 2048): the CPU-list trace answered 52018 MiB against 68659 MiB measured (-24.2 %).
   The ``promote`` list (``addcdiv``, ``index_put``, ...) and the lower-precision ops CUDA lists and the CPU does
   not (``einsum``, ``addmv``, ``mv``, ``addr``, ``chain_matmul``, ``linalg_multi_dot``) are not emulated.

4. cuBLAS workspaces (``CublasWorkspaces``). torch's ``aten/src/ATen/cuda/CublasHandlePool.cpp``
   ``getCurrentCUDABlasHandle`` (``getCurrentCUDABlasLtHandle`` is the same handle on CUDA) allocates a workspace
   through the caching allocator (``getNewWorkspace``: 32 MiB on sm90) the first time a thread's handle runs on a
   stream, and keeps it for the process; the cuBLASLt workspace likewise (``core/overheads.py``). Handles are per
   thread: the forward runs on the Python thread, the backward on autograd's CUDA device thread
   (``torch/csrc/autograd/engine.cpp``), so a step makes two, at the first matmul of the forward and the first of
   the backward (the LM head's, after its output is allocated). A CPU step allocates nothing there; the trace
   records both (``LiveTensorRecorder.hold``) for the allocator replay only: the estimate counts them as
   ``overhead.cublas_workspace``. Where they land matters when nothing smaller is free: the backward's comes
   after the loss's backward has freed its fp32 logits-sized blocks, and best fit (``get_free_block``) carves
   it from one of them when the step has no free block between 32 MiB and the logits' size, so that block is
   split for good and the next step's logits need one more segment. Measured on an H200
   (``benchmarks/data/gpu_truth_nvidia_h200.json``, Qwen2.5-0.5B full bf16, 8 x 1024: hidden 896, so the
   largest free activation block is an fp32 8192 x 896 of 28 MiB): the replay without the workspaces answered
   28508 MiB reserved against 33262 measured (-14.1 %), one 4748 MiB fp32 logits segment short.

5. Autocast as peft asks for it (``cuda_autocast_state``). peft 0.21.2 ``tuners/lora/bnb.py`` ``Linear8bitLt.forward``
   and ``Linear4bit.forward`` (and its other quantized wrappers: ``hqq``, ``awq``, ``eetq``, ``aqlm``, ``gptq``)
   choose their LoRA branch with ``requires_conversion = not torch.is_autocast_enabled()``: without autocast they
   cast the branch's input to the adapter weights' dtype (fp32 for peft's own adapters) and its output back. The
   argument-less call is the deprecated CUDA one: torch 2.13 ``torch/csrc/autograd/init.cpp``
   ``is_autocast_enabled`` parses ``is_autocast_enabled()`` with ``device_type = at::kCUDA`` ("Set at::kCUDA as
   default value to prevent BC-breaking changes"; ``torch/_C/__init__.pyi`` lists both overloads). A GPU step under
   ``torch.autocast("cuda")`` answers True there and runs the branch on the 16-bit input; the traced step runs
   ``torch.autocast("cpu")``, which that call does not see, so the trace ran the fp32 branch and its fp32 input
   gradients instead. While a CUDA step is traced the argument-less call answers the CPU autocast state (the one the
   traced step runs under, thread-local like CUDA's, restored for a checkpoint's recomputation by
   ``torch.utils.checkpoint`` as CUDA's is); a call naming a device is answered as before. Measured before the fix
   (s13, Qwen2.5-0.5B width, 2 layers, all-linear QLoRA without k-bit preparation, 4 x 1024, fp32 adapters, bf16
   autocast): backward peak 836.3 MB traced with the fp32 branch, 676.9 MB with the call answered (TRL's bf16
   adapters, which never cast: 674.7 MB).

The device ran torch 2.11; the lists above are read from the installed torch 2.13 (``tests/test_cuda_emulation.py``
checks that every emulated op has an ``AutocastCUDA`` kernel and no ``AutocastCPU`` one in the installed build).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# torch 2.13 torch/include/ATen/autocast_mode.h AT_FORALL_FP32 (aten overload names; "" is the default overload)
CUDA_FP32_OPS: tuple[str, ...] = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d",
    "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
# the same header's AT_FORALL_FP32_SET_OPT_DTYPE
CUDA_FP32_SET_OPT_DTYPE_OPS: tuple[str, ...] = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
# the same header's AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE (fp32_append_dtype): registered op -> redispatch
CUDA_FP32_APPEND_DTYPE_OPS: dict[str, str] = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}


@contextlib.contextmanager
def cuda_kernels() -> Iterator[None]:
    """Trace as CUDA runs the step: dropout's bool mask, SDPA's in-kernel dropout, CUDA autocast's fp32 lists, the
    autocast state the argument-less ``torch.is_autocast_enabled()`` reports."""
    from fitcheck.torch_adapters.tracer_patches import cuda_dropout

    with cuda_dropout(), cuda_sdpa(), cuda_autocast_lists(), cuda_autocast_state():
        yield


@contextlib.contextmanager
def cuda_autocast_state() -> Iterator[None]:
    """Answer the argument-less ``torch.is_autocast_enabled()`` (CUDA's, ``init.cpp``) with the traced step's CPU
    autocast state (item 5); a call naming a device type is answered as before."""
    import torch

    original = torch.is_autocast_enabled

    def is_autocast_enabled(*args: Any, **kwargs: Any) -> bool:
        if not args and not kwargs:
            return bool(original("cpu"))
        return bool(original(*args, **kwargs))

    torch.is_autocast_enabled = is_autocast_enabled
    try:
        yield
    finally:
        torch.is_autocast_enabled = original


# aten ops whose CUDA kernels call cuBLAS / cuBLASLt (aten/src/ATen/native/cuda/Blas.cpp: mm, addmm, bmm,
# baddbmm, addbmm, addmv, mv, dot, vdot, _addmm_activation, _int_mm, _scaled_mm); matmul and linear reach them
BLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_addmm_activation",
                      "_int_mm", "_scaled_mm"})


class CublasWorkspaces:
    """The recorder's op hook that holds each thread's cuBLAS workspaces at its first BLAS op (item 4).

    Args:
        sizes: Bytes a thread allocates at its first cuBLAS call, in order (``core.cublas_thread_workspaces``).
    """

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.sizes = sizes
        self.threads: set[str] = set()

    def __call__(self, recorder: Any, func: Any) -> None:
        """After ``func`` ran: hold the workspaces if it is the first BLAS op of its thread."""
        import torch

        if func.overloadpacket.__name__ not in BLAS_OPS:
            return
        thread = "autograd" if torch._C._current_autograd_node() is not None else "main"
        if thread not in self.threads:
            self.threads.add(thread)
            for n in self.sizes:
                recorder.hold(n)


@contextlib.contextmanager
def cuda_sdpa() -> Iterator[None]:
    """Run ``F.scaled_dot_product_attention`` with ``dropout_p=0`` (what CUDA's fused kernels keep; item 2)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def _sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
              is_causal: bool = False, *args: Any, **kwargs: Any) -> Any:
        # both fused kernels need equal query and key/value head counts unless enable_gqa (sdp_utils.cpp
        # check_batch_size_and_num_heads_dense): otherwise CUDA runs the math path, with its dropout, too
        fused = query.dim() < 3 or query.size(-3) == key.size(-3) or bool(kwargs.get("enable_gqa", False))
        return original(query, key, value, attn_mask, 0.0 if fused else dropout_p, is_causal, *args, **kwargs)

    F.scaled_dot_product_attention = _sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _overload(name: str) -> Any:
    """``torch.ops.aten`` overload of ``op.overload`` (the default overload for a bare name)."""
    import torch

    op, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, op), overload or "default")


def _eligible(t: Any) -> bool:
    """``autocast_mode.h`` ``is_eligible`` for the emulated device: a floating, non-double tensor."""
    import torch

    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not torch.float64


def _to_fp32(arg: Any) -> Any:
    """``cached_cast(kFloat, arg)``: eligible tensors (also inside lists) to fp32; fp32 casts are never cached."""
    import torch

    if _eligible(arg) and arg.dtype is not torch.float32:
        return arg.to(torch.float32)
    if isinstance(arg, (list, tuple)):
        return type(arg)(_to_fp32(a) for a in arg)
    return arg


def _fp32_kernel(op: Any) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with _below_autocast():
            return op(*(_to_fp32(a) for a in args), **{k: _to_fp32(v) for k, v in kwargs.items()})

    return kernel


def _set_opt_dtype_kernel(op: Any) -> Any:
    import torch

    names = [a.name for a in op._schema.arguments]
    kwarg_only = {a.name for a in op._schema.arguments if a.kwarg_only}
    at = names.index("dtype")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with _below_autocast():
            if not (args and _eligible(args[0])):
                return op(*args, **kwargs)
            if "dtype" in kwarg_only or len(args) <= at:
                if kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            elif args[at] is None:
                args = (*args[:at], torch.float32, *args[at + 1:])
            return op(*args, **kwargs)

    return kernel


def _append_dtype_kernel(redispatch: Any) -> Any:
    import torch

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with _below_autocast():
            to_type = torch.float32 if _eligible(args[0]) else args[0].dtype  # type_from_firstarg
            return redispatch(*args, **kwargs, dtype=to_type)

    return kernel


def _below_autocast() -> Any:
    """Exclude the CPU autocast key while the wrapped op runs (``ExcludeDispatchKeyGuard no_autocast``)."""
    import torch

    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


def emulated_ops() -> tuple[str, ...]:
    """The listed ops the installed torch has no ``AutocastCPU`` kernel for: the ones ``cuda_autocast_lists``
    registers (the CPU's own fp32 entries, the losses and ``prod``, already run in fp32)."""
    import torch

    listed = (*CUDA_FP32_OPS, *CUDA_FP32_SET_OPT_DTYPE_OPS, *CUDA_FP32_APPEND_DTYPE_OPS)
    return tuple(n for n in listed if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{n}", "AutocastCPU"))


@contextlib.contextmanager
def cuda_autocast_lists() -> Iterator[None]:
    """Give CPU autocast CUDA autocast's fp32 policies for the ops it does not list itself (item 3)."""
    import torch

    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    try:
        for name in emulated_ops():
            if name in CUDA_FP32_APPEND_DTYPE_OPS:
                kernel = _append_dtype_kernel(_overload(CUDA_FP32_APPEND_DTYPE_OPS[name]))
            elif name in CUDA_FP32_SET_OPT_DTYPE_OPS:
                kernel = _set_opt_dtype_kernel(_overload(name))
            else:
                kernel = _fp32_kernel(_overload(name))
            lib.impl(name, kernel, "AutocastCPU")  # type: ignore[no-untyped-call]
        yield
    finally:
        lib._destroy()  # type: ignore[no-untyped-call]
