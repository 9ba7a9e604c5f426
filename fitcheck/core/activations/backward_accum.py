"""What a gradient-accumulation micro-step's backward holds beyond the first micro-step's moments (pure, no torch).

From the second micro-step on every ``.grad`` already exists: a gradient the step makes is a temporary beside it
until ``AccumulateGrad`` adds it in place and frees it (torch 2.13 ``torch/csrc/autograd/functions/
accumulate_grad.h``); without accumulation that gradient *is* the ``.grad``, counted by the model states. Read by
:func:`.backward.backward_moments` (the moments it adds: ``head gradient cast`` for a full fine-tune of fp32
weights under autocast, ``<layer> down_proj weight gradient``; the tied embedding's sum and a partially trained
head's gradient are terms of its own moments). Found by ``benchmarks/pinned_probes.py --accum`` (session 20), each
moment matched event by event to the accumulating trace, which equals the real CPU step byte for byte.
"""

from __future__ import annotations

from fitcheck.core.activations.backward_grads import down_proj_numel
from fitcheck.spec import TrainingSpec


def accumulated_head_cast(kept: int, casts: int, head16: int, head32: int, input_grad: int) -> int:
    """A full fine-tune of fp32 weights under autocast: ``ToCopyBackward0`` casts the head's 16-bit weight gradient
    (``head16`` bytes) to fp32 (``head32``) into a temporary, after the head's node released the logits gradient;
    its fp32 input gradient (``input_grad``) is alive (``freeze.autocast_head_numel``'s mechanism). Probe
    DeepSeek-R1-Distill-Qwen-7B full eager autocast ckpt 2 x 640, accumulation 2: -18.2 % without it."""
    return kept + casts + head16 + head32 + input_grad


def accumulated_down_proj(spec: TrainingSpec, live: int, cast_down: int, e: int, r: int, autocast: bool,
                          new_down: int) -> int:
    """A layer's MLP backward at down_proj's new weight gradient (``new_down`` bytes, the parameter's dtype).

    ``MmBackward0`` makes down_proj's input gradient (e·I per token), then its weight gradient, before the gated
    product's gradients. Under autocast that gradient is 16-bit, beside the weight's 16-bit cast; once the node
    returned and released its saved input (e·I) and the cast (torch ``engine.cpp`` ``evaluate_function``),
    ``ToCopyBackward0`` casts it to fp32. Probe Mistral-7B-v0.3 full eager bf16 ckpt 3 x 576, accumulation 8:
    -5.7 % without it; traces of Mistral-7B ckpt bf16 / fp32 / autocast, eager and SDPA: the phase's peak.

    Args:
        spec: The run.
        live: What the layer's MLP moment holds before its working set (``backward_moments``' ``live``).
        cast_down: The down_proj weight's 16-bit cast that ``live`` leaves out (0 without autocast).
        e: Element bytes of activations.
        r: Element bytes of the residual stream.
        autocast: Whether fp32 weights are cast to 16 bits.
        new_down: down_proj's new weight gradient (bytes in the parameter's dtype).
    """
    bs = spec.batch.micro_batch * spec.batch.seq_len
    residual = r * spec.model.shape.hidden_size * bs
    mm = live + cast_down + e * spec.model.shape.intermediate_size * bs + residual
    if not autocast:
        return mm + new_down
    new16 = 2 * down_proj_numel(spec)
    return max(mm + new16, live + residual + new16 + new_down)
