"""TRL 1.16's SFT step in the tracer: what ``SFTTrainer.__init__`` does to the model, and its ``compute_loss``.

The whole-run allocator replay (``allocator_whole_run.replay_whole_run``) replays a traced step's own allocations and
frees. For ``SFTTrainer`` that step is not the plain Trainer's: the trainer patches the model with TRL's fused LM
head and its loss never builds the ``[rows, seq, vocab]`` logits. :func:`prepare_sft` applies to the model the
tracer built (``tracer_build.build_model``: peft's ``get_peft_model``, the k-bit preparation, activation
checkpointing) what ``trl/trainer/sft_trainer.py`` ``SFTTrainer.__init__`` then does before step 1:

- PEFT with ``gradient_checkpointing``: ``model.enable_input_require_grads()`` (whatever ``use_reentrant``);
- a quantized base: every trainable parameter but DoRA's ``lora_magnitude_vector`` cast to bf16
  (``param.data = param.data.to(torch.bfloat16)``: peft's fp32 adapters become bf16);
- ``add_fused_lm_head(model.get_base_model() if peft else model, outputs=("log_probs", "entropy", "is_top1"))``
  (the outputs are the trainer's row: ``core.trainers.trainer_row(kind).fused_head``).

:meth:`SftStep.loss` is ``SFTTrainer.compute_loss``'s default path (``loss_type="nll"``, no ``compute_loss_func``,
no label smoothing): ``model(**inputs, fused_lm_head=True)``, ``-log_probs`` summed over the labelled tokens.
Its metrics (``entropy.detach().sum()``, ``is_top1.sum()``, ``label_mask.sum()`` and their ``.item()``) are
scalars and are left out (one 512-byte block each on CUDA).

On CUDA the kernel's tile folds are Triton (``trl/kernels/chunked_logprob.py`` ``_use_triton``): they fold each
tile in registers, and ``_addmm_fp32`` adds a 16-bit tile into its fp32 accumulator in place
(``torch.addmm(..., out_dtype=torch.float32, out=acc)``). :func:`triton_folds` runs ``ChunkedLogProbFunction`` that
way on fake CPU tensors: the folds allocate nothing, the rest of the function (its fp32 statistics, ``mm_buf``,
the fp32 gradient accumulators) runs as written. Not emulated: the compact gather of the labelled positions
(``hidden_states[mask]``, data-dependent in fake mode): every position is scored as on CPU, which is the same N x h
copy where every position has a label (SFT without ``completion_only_loss``, ``core.trainers.steps._scored``);
the index tensors of that gather and the ``masked_scatter`` outputs (N x 4 bytes each) are not traced.

The kernel's forward and backward loop over token tiles of ``TOKEN_CHUNK_SIZE`` (4096) rows, each over the
vocabulary's ``chunk_size`` (32768) columns: at 1139 x 512 tokens and Qwen2.5's 151936 words, 143 x 5 tiles a pass,
traced op by op (57 s of a 1-layer trace on this 2-core machine, 50 s of it in the two loops). Every full token tile
runs the same ops on the same shapes; on fake tensors :func:`repeated_tiles_skipped` runs the first two or three
and the last (``kept_token_starts``), skipping an even number of full tiles in between. On CUDA (the Triton folds)
a tile allocates nothing: the events are those of the whole loop. Where a tile allocates (the CPU folds, a 16-bit
cast of fp32 hidden states or weights under autocast: ``hidden_chunk`` and ``w_chunk`` rebound, so each tile
allocates its copy while the previous one is still live), each skipped tile's events are a kept tile's, and the
allocator's blocks alternate between the two copies with period two, which the even skip keeps; checked equal,
replayed through the caching allocator, to the whole loop's trace (``tests/test_trl_tiles.py``,
``benchmarks/sft_tiles.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SFT_SOURCE = "trl 1.16.0 trl/trainer/sft_trainer.py SFTTrainer.__init__ / compute_loss"
KEPT_LEADING_TILES = 2  # full token tiles kept before the skipped ones (one more where the skip count is odd)


@dataclass
class SftStep:
    """The SFT policy step of a built model.

    Attributes:
        model: The model the trainer runs (the PeftModel under PEFT).
        backbone: The module whose output is the last hidden state (``base_model`` of the causal LM).
    """

    model: Any
    backbone: Any

    def loss(self, ids: Any, labels: Any) -> Any:
        """``SFTTrainer.compute_loss`` (nll): the fused head's per-token log-probs, summed over the labelled
        tokens and divided by their count."""
        import torch

        outputs = self.model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True)
        per_token_loss = -outputs.log_probs
        return per_token_loss.sum() / torch.as_tensor(outputs.label_mask.sum()).clamp(min=1)

    def region_hooks(self, opened: Callable[[str], None], suffix: str) -> list[Any]:
        """Hooks that open ``forward_head`` when the backbone returns and ``backward`` when the gradient of its
        last hidden state exists (what the plain step's LM-head hooks mark: ``tracer._region_opener`` /
        ``_grad_marker``; the fused head never calls the LM head module)."""

        def hook(_module: Any, _inputs: Any, out: Any) -> None:
            opened("forward_head" + suffix)
            hidden = getattr(out, "last_hidden_state", None)
            if hidden is not None and hidden.requires_grad:
                hidden.register_hook(lambda _grad: opened("backward" + suffix))

        return [self.backbone.register_forward_hook(hook)]


def prepare_sft(model: Any, outputs: tuple[str, ...], *, quantized: bool, checkpointing: bool) -> SftStep:
    """Apply what ``SFTTrainer.__init__`` does to the built model before step 1 (module docstring).

    Args:
        model: ``tracer_build.build_model``'s model (PEFT-wrapped where the run trains adapters).
        outputs: The fused head's outputs (``core.trainers.trainer_row(kind).fused_head``).
        quantized: The base is bitsandbytes-quantized.
        checkpointing: ``gradient_checkpointing``.

    Returns:
        The step.
    """
    from peft import PeftModel
    from trl.trainer.utils import add_fused_lm_head

    peft = isinstance(model, PeftModel)
    if peft and checkpointing:
        model.enable_input_require_grads()
    if quantized:
        trainable_to_bf16(model)
    base = model.get_base_model() if peft else model
    add_fused_lm_head(base, outputs=outputs)
    return SftStep(model, getattr(base, base.base_model_prefix))


def trainable_to_bf16(model: Any) -> None:
    """``SFTTrainer.__init__`` on a quantized base: every trainable parameter but DoRA's ``lora_magnitude_vector``
    cast to bf16 (``param.data = param.data.to(torch.bfloat16)``; the optimizer, created later, keeps bf16 states:
    ``tracer_optimizer.trace_optimizer(trl_head=)``)."""
    import torch

    for name, param in model.named_parameters():
        if param.requires_grad and "lora_magnitude_vector" not in name:
            param.data = param.data.to(torch.bfloat16)


class _Launch:
    """``kernel[grid](...)``: a Triton launch, which allocates nothing (the tile is folded in registers)."""

    def __getitem__(self, _grid: Any) -> Callable[..., None]:
        return lambda *_args, **_kwargs: None


@contextlib.contextmanager
def triton_folds() -> Iterator[None]:
    """``ChunkedLogProbFunction`` as it runs on CUDA (module docstring), on fake CPU tensors."""
    import types

    import torch
    import trl.trainer.utils  # noqa: F401  # binds its own ``_use_triton`` first: every position stays scored
    from trl.kernels import chunked_logprob as ck

    names = ("_use_triton", "_forward_kernel", "_backward_kernel", "_addmm_fp32", "triton")
    saved = {n: getattr(ck, n, None) for n in names}
    cpu_addmm = ck._addmm_fp32

    def addmm(acc: Any, a: Any, b: Any) -> None:
        if getattr(ck, "_MM_OUT_DTYPE", False) and a.dtype in (torch.float16, torch.bfloat16):
            return  # torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc): in place
        cpu_addmm(acc, a, b)

    launch = _Launch()
    emulated = (lambda _device: True, launch, launch, addmm, types.SimpleNamespace(cdiv=lambda a, b: -(-a // b)))
    for n, v in zip(names, emulated, strict=True):
        setattr(ck, n, v)
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                delattr(ck, n)
            else:
                setattr(ck, n, v)


def kept_token_starts(tokens: int, tile: int) -> list[int]:
    """The token tiles' starts :func:`repeated_tiles_skipped` runs: ``range(0, tokens, tile)`` without an even number
    of full tiles after the first :data:`KEPT_LEADING_TILES` (or one more), the last tile (full or partial) kept.

    Args:
        tokens: Rows scored (``N``).
        tile: ``TOKEN_CHUNK_SIZE``.

    Returns:
        The starts kept, ascending.
    """
    starts = list(range(0, tokens, tile))
    lead = KEPT_LEADING_TILES + (len(starts) - 1 - KEPT_LEADING_TILES) % 2
    if len(starts) <= lead + 1:
        return starts
    return starts[:lead] + starts[-1:]


@contextlib.contextmanager
def repeated_tiles_skipped() -> Iterator[None]:
    """``ChunkedLogProbFunction``'s token-tile loops (forward and backward: ``range(0, N, TOKEN_CHUNK_SIZE)``) over
    :func:`kept_token_starts` only (module docstring); its vocabulary loops as written. For fake tensors only."""
    import builtins

    from trl.kernels import chunked_logprob as ck

    def tile_range(*args: int) -> Any:
        if len(args) == 3 and args[0] == 0 and args[2] == ck.TOKEN_CHUNK_SIZE:
            return kept_token_starts(args[1], args[2])
        return builtins.range(*args)

    had = "range" in vars(ck)
    saved = vars(ck).get("range")
    ck.range = tile_range  # type: ignore[attr-defined]  # the module's global, read before builtins
    try:
        yield
    finally:
        if had:
            ck.range = saved  # type: ignore[attr-defined]
        else:
            del ck.range  # type: ignore[attr-defined]
