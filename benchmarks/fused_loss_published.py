"""Published fused-loss memory measurements vs fitcheck's formulas from the libraries' source.

Two sources, each reproduced from the allocations the library's source makes (``fitcheck.core.kernels``):

* Liger-Kernel's own benchmark data (github.com/linkedin/Liger-Kernel ``benchmark/data/all_benchmark_data.csv``,
  kernel ``fused_linear_cross_entropy``, metric ``memory``, mode ``full``, H=4096, V=128256, bf16, A100-80GB,
  liger 0.4.2, 2024-11-22). The script (``benchmark/scripts/benchmark_fused_linear_cross_entropy.py`` at that
  commit) builds BOTH an ``nn.Linear(H, V)`` for torch and one for Liger, an input ``x (BT, H)`` that requires a
  gradient and int64 targets, then runs forward + backward ten times without zeroing gradients and reports the
  median ``max_memory_allocated`` (MiB). Steady state: both weights, x, targets, the provider's ``W.grad`` and
  ``x.grad`` persist; on top, Liger's forward (``flce_bytes``: grad_input, grad_weight, loss_1d, the target mask and
  the live logits chunk; 0.4.2 keeps 8 B per chunk element alive, 0.8.5 keeps 2) and torch's
  ``nn.CrossEntropyLoss`` on bf16 logits, whose peak is the log-softmax backward: its output, its gradient and the
  logits gradient, 6 B x BT x V.
* Cut Cross-Entropy's README benchmark (cut_cross_entropy 25.1.1 package README, "Expected output with A100 SMX4";
  ``benchmark/__main__.py``: Gemma-2 2B head, 8192 tokens, D=2304, V=256000, bf16; ``op_mem_mb`` is the increase of
  the allocated peak over the op, MiB): rows ``cce loss-fw``, ``cce loss-bw``, ``cce loss-fw-bw``.

Run: ``PYTHONPATH=. python benchmarks/fused_loss_published.py`` (exit 1 when a row is off by more than 10 %).
"""

from __future__ import annotations

import sys

from fitcheck.core.kernels import FLCE_CHUNK_BYTES_PER_LOGIT, cce_bytes, flce_bytes

MIB = 2**20
# (BT, liger MiB, huggingface MiB) from all_benchmark_data.csv (y_value_50), liger_version 0.4.2.
LIGER_CSV = (
    (4096, 4245.5478515625, 6092.2822265625),
    (8192, 4466.9697265625, 9162.3134765625),
    (16384, 4910.4384765625, 15302.3759765625),
    (32768, 5794.6259765625, 27582.5),
)
H, V = 4096, 128256
# (kind, measured MiB) from the cut_cross_entropy 25.1.1 README benchmark table, method cce, test_data gemma2.
CCE_README = (("loss-fw", 1.1), ("loss-bw", 1163.0), ("loss-fw-bw", 1164.0))
CCE_N, CCE_D, CCE_V = 8192, 2304, 256000


def liger_rows() -> list[tuple[str, float, float]]:
    """(row, published MiB, fitcheck MiB) for Liger's FLCE benchmark, both providers."""
    rows = []
    for bt, liger_mib, torch_mib in LIGER_CSV:
        weights = 2 * V * H * 2  # the torch and the Liger module's bf16 weights
        inputs = bt * H * 2 + bt * 8  # x and the int64 targets
        grads = V * H * 2 + bt * H * 2  # W.grad and x.grad from the previous iteration
        steady = weights + inputs + grads
        for version in ("0.4.2", "0.8.5"):
            fwd, _, _ = flce_bytes(bt, H, V, input_bytes=2, logit_bytes=2, weight_bytes=2, head_trained=True,
                                   chunk_bytes_per_logit=FLCE_CHUNK_BYTES_PER_LOGIT[version])
            if version == "0.4.2":
                rows.append((f"Liger FLCE BT={bt} (0.4.2 chunk)", liger_mib, (steady + fwd) / MIB))
            else:
                rows.append(("  same, 0.8.5 source (not measured)", liger_mib, (steady + fwd) / MIB))
        rows.append((f"torch CE BT={bt}", torch_mib, (steady + 6 * bt * V) / MIB))
    return rows


def cce_rows() -> list[tuple[str, float, float]]:
    """(row, published MiB, fitcheck MiB) for the CCE README rows."""
    fwd, saved, bwd = cce_bytes(CCE_N, CCE_D, CCE_V, input_bytes=2, head_trained=True)
    est = {"loss-fw": fwd, "loss-bw": bwd, "loss-fw-bw": saved + bwd}
    return [(f"CCE gemma2 {kind}", mib, est[kind] / MIB) for kind, mib in CCE_README]


def main() -> int:
    """Print the table; exit 1 when a measured row is off by more than 10 %."""
    print(f"{'row':40} {'published MiB':>14} {'fitcheck MiB':>13} {'error':>8}")
    worst = 0.0
    for name, pub, est in [*liger_rows(), *cce_rows()]:
        err = (est - pub) / pub * 100
        if "not measured" not in name:
            worst = max(worst, abs(err))
        print(f"{name:40} {pub:14.1f} {est:13.1f} {err:+7.1f}%")
    print(f"worst |error| over measured rows {worst:.1f}%")
    return 0 if worst <= 10.0 else 1


if __name__ == "__main__":
    sys.exit(main())
