"""Bytes each GPU sends per optimizer step for tensor, context and sequence parallelism (pure).

These collectives sit on the critical path of every layer (the next matmul needs their result), so
``fitcheck.core.compute`` adds their time to the step instead of overlapping it. Ring collectives move
``2·(g-1)/g`` (all-reduce) or ``(g-1)/g`` (all-gather, all-to-all) of the tensor per GPU (NCCL ring
algorithm; Megatron-LM, Shoeybi et al. 2019 sec. 3 for the two all-reduces per layer and direction of TP).

- TP (transformers ``RowwiseParallel`` all-reduces the output of ``o_proj`` and ``down_proj``; the
  ``ColwiseParallel`` input gradient is all-reduced in backward): 2 all-reduces of ``b·s·h`` per layer
  forward, 2 backward, 2 more when the layer is recomputed; the LM head's ``colwise_gather_output``
  all-gathers ``b·s·V`` logits.
- CP (torch ``_AllGatherRotater``): the keys/values of the sequence all-gathered once per attention call
  forward and backward (again when recomputed), the key/value gradients rotated in fp32 ``cp - 1`` times;
  with ``alltoall`` the key/value chunks are rotated ``cp - 1`` times instead of gathered.
- SP (DeepSpeed Ulysses): all-to-all of q, k, v and of the output forward, of their gradients backward.
"""

from __future__ import annotations

from fitcheck.core.parallelism.buffers import attention_input_bytes, rank_attention_heads
from fitcheck.core.parallelism.local import active_layout, local_seq_len
from fitcheck.spec import TrainingSpec


def parallel_comm_bytes(spec: TrainingSpec) -> tuple[float, int]:
    """(bytes per GPU per optimizer step on the critical path, size of the model-parallel group).

    Args:
        spec: The run with its layout.

    Returns:
        ``(0.0, 1)`` without tp/cp/sp.
    """
    par = active_layout(spec)
    if par is None or par.non_data_parallel == 1:
        return 0.0, 1
    sh = spec.model.shape
    b, s = spec.batch.micro_batch, local_seq_len(spec, par)
    e = attention_input_bytes(spec)
    layers = sh.num_layers
    act = spec.activations
    recomputed = layers / max(1, act.checkpoint_every_n_layers) if act.checkpointing else 0.0
    fwd_passes = layers + recomputed  # forward runs of a layer per micro-step
    q, kv, d = rank_attention_heads(spec, par)
    total = 0.0
    if par.tp > 1:
        t = par.tp
        all_reduce = 2 * (t - 1) / t * b * s * sh.hidden_size * e
        total += (2 * fwd_passes + 2 * layers + 1) * all_reduce  # + the vocab-parallel embedding's sum
        total += (t - 1) / t * b * s * sh.vocab_size * e  # gathered logits
    if par.cp > 1:
        c = par.cp
        local_kv = 2 * b * s * kv * d
        kv_traffic = (c - 1) * local_kv * e  # all-gather of the sequence's k, v = c - 1 rotations of a chunk
        total += (fwd_passes + layers) * kv_traffic + layers * (c - 1) * local_kv * 4  # + fp32 dkv rotation
    if par.sp > 1:
        p = par.sp
        kv_eff = max(kv, p)
        per_call = (p - 1) / p * b * s * (2 * q + 2 * kv_eff) * d * e  # q, k, v in; output back
        total += (fwd_passes + layers) * per_call
    return total * spec.batch.grad_accum, par.non_data_parallel
