"""The pure core: a frozen :class:`~fitcheck.spec.TrainingSpec` in, an itemised :class:`~fitcheck.report.Report` out.

No torch import, no files, no environment reads, no printing. The orchestration lives here:

- :mod:`.estimator`: :func:`estimate` sums every component per phase, finds the peak, gives the verdict and findings;
- :mod:`.step`: the components of one step and the phase where they peak;
- :mod:`.allocator`: the caching allocator (reserved vs allocated; :class:`ReplayedGap`, what a replay measured);
- :mod:`.overheads`: CUDA context, cuBLAS workspaces, NCCL (memory a CPU trace cannot see);
- :mod:`.compute`: FLOPs, step time and communication.

Rooms: :mod:`.states` (weights, adapters, gradients, optimizer states, sharding), :mod:`.activations`
(saved activations, logits, backward), :mod:`.optimizers` (every ``optim`` value), :mod:`.trainers` (TRL's
SFT/DPO/GRPO/Reward steps: fused LM head, reference model, generation phase), :mod:`.loading` (the load phase),
:mod:`.saving` (the save phase: :func:`save_cost`).
"""

from fitcheck.core.allocator import ReplayedGap, reserved_bytes
from fitcheck.core.compute import ComputeAssumptions, ComputeEstimate, compute_estimate, relative_time_per_token
from fitcheck.core.estimator import estimate
from fitcheck.core.overheads import cublas_thread_workspaces
from fitcheck.core.saving import save_cost
from fitcheck.core.step import collect_components, peak_phase

__all__ = [
    "ComputeAssumptions",
    "ComputeEstimate",
    "ReplayedGap",
    "collect_components",
    "compute_estimate",
    "cublas_thread_workspaces",
    "estimate",
    "peak_phase",
    "relative_time_per_token",
    "reserved_bytes",
    "save_cost",
]
