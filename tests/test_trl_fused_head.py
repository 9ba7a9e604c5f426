"""TRL 1.16's fused LM head: fitcheck's byte counts vs the REAL ``ChunkedLogProbFunction`` on CPU.

The kernel (``trl/kernels/chunked_logprob.py``) is run forward and backward on small random tensors under the
live-tensor recorder; its peaks above the inputs must equal ``fitcheck.core.trainers.fused_head`` within 0.1%.
"""

from __future__ import annotations

import pytest

from fitcheck.core.trainers.fused_head import (
    VOCAB_CHUNK_SIZE,
    FusedHeadInputs,
    backward_peak,
    forward_inputs,
    forward_peak,
    mm_buffer,
)

torch = pytest.importorskip("torch")
chunked = pytest.importorskip("trl.kernels.chunked_logprob")


def _measure(n: int, h: int, v: int, dtype: object, autocast: bool, outputs: tuple[str, ...],
             weight_grad: bool) -> tuple[int, int]:
    from fitcheck.torch_adapters.live_tracker import LiveTensorTracker

    hidden = torch.randn(n, h, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, dtype=dtype, requires_grad=weight_grad)
    targets = torch.randint(0, v, (n,))
    tracker = LiveTensorTracker()
    tracker.track([hidden, weight, targets])
    tracker.start()
    try:
        base = tracker.current
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logprobs, *_ = chunked.ChunkedLogProbFunction.apply(
                hidden, weight, None, targets, 1.0, VOCAB_CHUNK_SIZE, None, 1.0, outputs)
        fwd = tracker.peak - base
        tracker.reset_peak()
        (-logprobs.sum()).backward()
        bwd = tracker.peak - base
    finally:
        tracker.stop()
    return fwd, bwd


@pytest.mark.slow
@pytest.mark.parametrize(
    ("n", "h", "v", "dtype", "autocast", "outputs", "weight_grad"),
    [
        (127, 64, 1000, "bfloat16", True, ("log_probs", "entropy", "is_top1"), True),  # SFT, bf16 model
        (127, 64, 1000, "float32", False, ("log_probs", "entropy", "is_top1"), True),  # fp32, no autocast
        (127, 64, 1000, "float32", True, ("log_probs", "entropy", "mean_logits", "is_top1"), True),  # DPO, autocast
        (200, 32, 1500, "bfloat16", True, ("log_probs",), False),  # reference-like outputs, frozen head (LoRA)
    ],
)
def test_fused_head_bytes_match_real_kernel(n: int, h: int, v: int, dtype: str, autocast: bool,
                                            outputs: tuple[str, ...], weight_grad: bool) -> None:
    real_fwd, real_bwd = _measure(n, h, v, getattr(torch, dtype), autocast, outputs, weight_grad)
    e = 2 if dtype == "bfloat16" else 4
    x = FusedHeadInputs(rows=1, seq=n + 1, scored=None, hidden=h, vocab=v, compute_bytes=2 if autocast else e,
                        hidden_bytes=e, weight_bytes=e, cuda=False, outputs=outputs, weight_grad=weight_grad)
    est_fwd = forward_peak(x) - forward_inputs(x)  # the test builds the inputs before measuring
    est_bwd = backward_peak(x)[0] - forward_inputs(x)
    assert est_fwd == pytest.approx(real_fwd, rel=1e-3)
    assert est_bwd == pytest.approx(real_bwd, rel=1e-3)


def test_buffer_follows_chunk_width_not_vocabulary() -> None:
    small = FusedHeadInputs(rows=2, seq=129, scored=None, hidden=64, vocab=1000, compute_bytes=2, hidden_bytes=2,
                            weight_bytes=2, cuda=False)
    assert mm_buffer(small) == 256 * VOCAB_CHUNK_SIZE * 2
    cuda = FusedHeadInputs(rows=2, seq=129, scored=100, hidden=64, vocab=1000, compute_bytes=2, hidden_bytes=2,
                           weight_bytes=2, cuda=True)
    assert cuda.n == 100  # CUDA (Triton) scores only labelled positions; CPU scores every one
    assert forward_peak(cuda) < forward_peak(small)
