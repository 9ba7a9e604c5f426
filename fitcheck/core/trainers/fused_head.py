"""TRL 1.16's fused LM head (``trl/kernels/chunked_logprob.py``, ``trl/trainer/utils.py add_fused_lm_head``): bytes.

SFT, DPO and GRPO in TRL 1.16 never build the ``[rows, seq, vocab]`` logits. ``add_fused_lm_head`` patches the
model's forward; ``model(..., fused_lm_head=True)`` runs the backbone, then ``ChunkedLogProbFunction`` projects
``hidden @ lm_head.T`` in tiles of ``TOKEN_CHUNK_SIZE = 4096`` tokens x ``chunk_size = 32768`` vocabulary
columns (``_CHUNKED_LOGPROB_CHUNK_SIZE``, utils.py) into ONE preallocated buffer ``mm_buf`` of
``min(N, 4096) x 32768`` elements in the compute dtype (autocast dtype, else the hidden dtype) -- its size follows
the chunk width, not the vocabulary: a 2000-token vocabulary still gets a 32768-wide buffer.

Two paths, each on its own device (``_use_triton``: Triton on CUDA/XPU):

- CUDA (Triton): only positions with a label are scored (``hidden_states[mask]``: a gathered copy of N x h); the
  Triton kernels fold each tile in registers, so a tile costs nothing beyond ``mm_buf``. The backward keeps fp32
  accumulators for the hidden gradient (N x h) and the head weight gradient (V x h), and ``torch.addmm(...,
  out_dtype=float32)`` adds the tile in place.
- CPU (torch fallback ``_forward_tile`` / ``_backward_tile``): EVERY position is scored (``reshape(-1, h)`` of
  ``last_hidden_state[:, :-1]``: a copy), and each tile is folded with whole-tile torch ops: fp32 temporaries
  of n x w elements (n tokens, w vocabulary columns of the tile) whose worst moment is counted op by op below,
  and ``_addmm_fp32`` upcasts the tile (and a 16-bit weight chunk) before ``addmm_``.

The op-by-op counts are pinned against the real ``ChunkedLogProbFunction`` on CPU (tests/test_trl_fused_head.py).
"""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_CHUNK_SIZE = 4096  # trl/kernels/chunked_logprob.py (TRL 1.16)
VOCAB_CHUNK_SIZE = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE (TRL 1.16)
_FWD_VECTORS = 7  # running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit (fp32 [N])


@dataclass(frozen=True)
class FusedHeadInputs:
    """Shapes and dtypes of one fused-head call.

    Attributes:
        rows: Sequences in the call.
        seq: Tokens per sequence (the head scores ``seq - 1`` positions per row on CPU).
        scored: Positions with a label (CUDA scores only these; None = every position).
        hidden: Hidden size.
        vocab: Vocabulary size.
        compute_bytes: Element bytes of the compute dtype (autocast dtype, else the hidden states' dtype).
        hidden_bytes: Element bytes of the backbone output.
        weight_bytes: Element bytes of the LM head weight.
        cuda: Triton path (CUDA) instead of the CPU torch fallback.
        outputs: Optional outputs the trainer asks for (``entropy``, ``is_top1``, ``mean_logits``, ...).
        weight_grad: The LM head weight is trained (full fine-tune).
        grad: A backward follows (False under ``torch.no_grad``: reference / old-policy log-probs).
    """

    rows: int
    seq: int
    scored: int | None
    hidden: int
    vocab: int
    compute_bytes: int
    hidden_bytes: int
    weight_bytes: int
    cuda: bool
    outputs: tuple[str, ...] = ()
    weight_grad: bool = True
    grad: bool = True

    @property
    def n(self) -> int:
        """Positions the kernel projects."""
        every = self.rows * max(0, self.seq - 1)
        if self.cuda and self.scored is not None:
            return min(self.scored, every)
        return every


def _tiles(x: FusedHeadInputs) -> tuple[int, int]:
    """(tokens, vocabulary columns) of the largest tile."""
    return min(x.n, TOKEN_CHUNK_SIZE), min(x.vocab, VOCAB_CHUNK_SIZE)


def mm_buffer(x: FusedHeadInputs) -> int:
    """Bytes of ``mm_buf``: ``min(N, 4096) x 32768`` in the compute dtype, whatever the vocabulary."""
    return min(x.n, TOKEN_CHUNK_SIZE) * VOCAB_CHUNK_SIZE * x.compute_bytes


def forward_inputs(x: FusedHeadInputs) -> int:
    """The kernel's inputs built by ``_fused_forward``: the hidden copy (saved for backward) and int64 targets."""
    n = x.n
    return n * x.hidden * x.hidden_bytes + 8 * n


def forward_outputs(x: FusedHeadInputs) -> int:
    """Per-position outputs alive after the call: log-probs, requested fp32/bool outputs, saved ``log_z``."""
    every = x.rows * max(0, x.seq - 1)
    fp32 = 1 + sum(1 for o in x.outputs if o in ("entropy", "log_sum_sq_probs", "mean_logits"))
    bools = 1 + (1 if "is_top1" in x.outputs else 0)  # label mask + is_top1
    saved_log_z = 4 * x.n if x.grad else 0
    return every * (4 * fp32 + bools) + saved_log_z


def forward_peak(x: FusedHeadInputs) -> int:
    """Bytes alive at the worst moment of the fused forward, beyond the backbone (inputs included)."""
    n, (tn, w) = x.n, _tiles(x)
    nw = tn * w
    base = forward_inputs(x) + mm_buffer(x) + 4 * _FWD_VECTORS * n
    if x.compute_bytes != x.hidden_bytes:
        base += tn * x.hidden * x.compute_bytes  # hidden_chunk.to(compute dtype)
    if x.cuda:
        return base
    # _forward_tile: z = transform(tile.float()) -> tile.float() + z*scale + (z*scale)*inv_t, or later
    # z + (z - max) + exp(...) and z + e + e*z: 12 B per tile element either way; is_top1: z + 2 bool masks +
    # masked_fill (10 B). The fp32 model's tile.float() is the tile itself: the transform is 8 B, the rest 12 B.
    # is_top1's bool mask ``before_target`` is a local of _forward_tile: alive until it returns (+1 B).
    return base + (13 if "is_top1" in x.outputs else 12) * nw


def backward_peak(x: FusedHeadInputs) -> tuple[int, int]:
    """(worst bytes during the fused backward beyond the backbone, bytes it leaves: the hidden gradient).

    The forward's saved hidden copy, targets and ``log_z`` are alive; the weight gradient it returns is the LM
    head's ``.grad`` (counted by ``gradients``), so it is not part of what this returns after the call.
    """
    n, (tn, w) = x.n, _tiles(x)
    nw = tn * w
    h, v = x.hidden, x.vocab
    saved = forward_inputs(x) + 4 * n * (2 if "entropy" in x.outputs else 1)
    acc = 4 * n * h + (4 * v * h if x.weight_grad else 0)  # fp32 grad_hidden, grad_weight
    live = saved + acc + mm_buffer(x) + 4 * n  # + the incoming log-prob gradient
    if x.compute_bytes != x.hidden_bytes:
        live += tn * h * x.compute_bytes
    if x.compute_bytes != x.weight_bytes:
        live += w * h * x.compute_bytes  # w_chunk = weight[start:end].to(compute dtype), alive through the tile
    if x.cuda:
        tile = 0
    else:
        # _backward_tile: y, z, log_p, p, grad (5 fp32 tiles) + is_target (bool) + is_target.float() - p and its
        # product with the log-prob gradient (8 B): 29 B per tile element
        tile = 29 * nw
        # _addmm_fp32 on CPU: a.float() of the tile (+ b.float() of a 16-bit weight chunk) -- below the fold
        upcast = (4 * nw if x.compute_bytes != 4 else 0) + (4 * w * h if x.compute_bytes != 4 else 0)
        tile = max(tile, upcast)
    # at return: grad_hidden.to(hidden dtype) and grad_weight.to(weight dtype) next to their fp32 accumulators
    out = n * h * x.hidden_bytes + (v * h * x.weight_bytes if x.weight_grad else 0)
    return live + max(tile, out), n * h * x.hidden_bytes
