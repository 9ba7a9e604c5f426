"""How many processes ``accelerate launch`` starts from a config file, and on what device.

accelerate 1.15 ``commands/launch.py``: ``_validate_launch_command`` turns ``distributed_type`` into a launcher
flag (DEEPSPEED → ``use_deepspeed``, FSDP → ``use_fsdp``, MEGATRON_LM, XLA → ``tpu``, MULTI_GPU/NPU/MLU/SDAA/
MUSA/XPU/HPU/NEURON → ``multi_gpu``); ``launch_command`` runs those launchers with ``num_processes`` processes
and everything else (``NO``, ``MULTI_CPU``) through ``simple_launcher``, which starts ONE process, or
``num_processes`` through mpirun when ``mpirun_config.mpirun_hostfile`` is set (``utils/launch.py``
``prepare_simple_launcher_cmd_env``). ``use_cpu`` (which ``accelerate config`` writes as true for MULTI_CPU,
``commands/config/cluster.py``) becomes ``ACCELERATE_USE_CPU`` for the script: it trains on the CPU. The same rule
as ``fitcheck launch`` (``integrations/launch_plan.py``), read from the file alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.findings import Finding, Severity
from fitcheck.readers.accelerate_config import AccelerateRead
from fitcheck.readers.sources import where

# distributed_type values whose launcher starts num_processes processes (accelerate 1.15 launch_command).
MULTI_LAUNCH_TYPES = frozenset({
    "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON",
    "DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA",
})


@dataclass(frozen=True)
class LaunchedProcesses:
    """What ``accelerate launch`` starts for a config file.

    Attributes:
        count: Processes started; None when the requested count stands (a multi-process launcher or mpirun).
        where: Provenance text for ``num_processes`` when ``count`` is set.
        finding: Said when a requested count of more than one is not what accelerate starts.
    """

    count: int | None
    where: str = ""
    finding: Finding | None = None


def launched_processes(acc: AccelerateRead, requested: int | None) -> LaunchedProcesses:
    """The process count ``accelerate launch`` uses with this file (``requested``: the flag's or the file's)."""
    if acc.distributed_type in MULTI_LAUNCH_TYPES or acc.mpirun_hostfile:
        return LaunchedProcesses(None)
    text = (f"{where(acc.source, 'distributed_type')}={acc.distributed_type}: accelerate launch's simple launcher "
            "starts one process (no mpirun_config.mpirun_hostfile)")
    finding = None
    if requested is not None and requested > 1:
        finding = Finding(
            "accelerate-one-process", Severity.WARNING,
            f"{text}, not {requested}: counted 1",
            "for several CPU processes set mpirun_config.mpirun_hostfile; for GPUs use distributed_type MULTI_GPU",
        )
    return LaunchedProcesses(1, text, finding)
