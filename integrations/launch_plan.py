"""What ``accelerate launch`` will really start, and which script flags are really unknown (``fitcheck launch``).

* Processes: accelerate 1.15 ``commands/launch.py`` ``launch_command`` picks a launcher from the arguments
  as ``_validate_launch_command`` completes them from the config file: DeepSpeed, FSDP, Megatron-LM, multi-GPU
  (``distributed_type`` MULTI_GPU/NPU/MLU/SDAA/MUSA/XPU/HPU/NEURON) and TPU launchers start ``num_processes``
  processes — unless ``--cpu`` is given; everything else (``NO``, ``MULTI_CPU``, ``--cpu``) goes to
  ``simple_launcher``, which starts ONE process, or ``num_processes`` through ``mpirun`` when
  ``--mpirun_hostfile`` (config ``mpirun_config.mpirun_hostfile``) is set (``utils/launch.py``
  ``prepare_simple_launcher_cmd_env``). So ``MULTI_CPU`` with ``num_processes: 2`` and no hostfile is one
  process.
* CPU: ``--cpu`` or the config's ``use_cpu: true`` sets ``ACCELERATE_USE_CPU`` for the script
  (``prepare_simple_launcher_cmd_env`` / ``prepare_multi_gpu_env``); the script's own ``--use_cpu``
  (TrainingArguments) does the same inside the script. Either way the run trains on the CPU.
* Unknown flags: a script flag is the script's own only when it is no field of ``transformers.
  TrainingArguments`` nor of a TRL config/script dataclass (``SFTConfig``, ``DPOConfig``, ..., ``ModelConfig``,
  ``ScriptArguments``) — the names are read from the installed classes, not from a hand list.
"""

from __future__ import annotations

import copy
import dataclasses
import io
from collections.abc import Iterable
from contextlib import redirect_stderr
from dataclasses import dataclass
from functools import cache
from typing import Any

from fitcheck.findings import Finding, Severity

# accelerate 1.15 commands/launch.py launch_command: the launchers that start num_processes processes.
_MULTI_LAUNCH_FLAGS = ("use_deepspeed", "use_fsdp", "use_megatron_lm", "multi_gpu", "tpu")
# TRL dataclasses whose fields TrlParser accepts on a script's command line (trl 1.16 __init__ names).
_TRL_CLASSES = (
    "SFTConfig", "DPOConfig", "GRPOConfig", "RewardConfig", "KTOConfig", "ORPOConfig", "CPOConfig", "PPOConfig",
    "RLOOConfig", "OnlineDPOConfig", "GKDConfig", "PRMConfig", "XPOConfig", "NashMDConfig", "BCOConfig",
    "ModelConfig", "ScriptArguments",
)


@dataclass(frozen=True)
class StartedProcesses:
    """How many processes ``accelerate launch`` starts and on what.

    Attributes:
        count: Processes started (over all machines), None when it could not be worked out.
        launcher: Which accelerate launcher, in words.
        cpu: The run trains on the CPU (``--cpu`` or the config's ``use_cpu``).
    """

    count: int | None
    launcher: str
    cpu: bool


def started_processes(ns: Any) -> StartedProcesses:
    """Complete the arguments as ``accelerate launch`` does and read which launcher runs (see module doc)."""
    try:
        from accelerate.commands import launch as acc_launch
    except ImportError:  # pragma: no cover - the parser needs accelerate already
        return StartedProcesses(None, "unknown", bool(getattr(ns, "cpu", False)))
    validate = getattr(acc_launch, "_validate_launch_command", None)
    args = copy.deepcopy(ns)
    if validate is not None:
        try:
            with redirect_stderr(io.StringIO()):
                args = validate(args)[0]
        except Exception:  # a private function's other changes: read the flags as given
            args = copy.deepcopy(ns)
    cpu_flag = bool(getattr(args, "cpu", False))
    cpu = cpu_flag or bool(getattr(args, "use_cpu", False))
    n = getattr(args, "num_processes", None)
    n = int(n) if isinstance(n, int) and n > 0 else None
    multi = [f for f in _MULTI_LAUNCH_FLAGS if getattr(args, f, False)]
    if multi and not cpu_flag:
        return StartedProcesses(n, f"{multi[0]} launcher ({n or '?'} processes)", cpu)
    if getattr(args, "mpirun_hostfile", None):
        return StartedProcesses(n, "simple launcher through mpirun (--mpirun_hostfile)", cpu)
    return StartedProcesses(1, "simple launcher (one process: no multi-GPU/DeepSpeed/FSDP launcher"
                               + (" under --cpu" if cpu_flag and multi else "") + ")", cpu)


def machine_ram_bytes() -> int | None:
    """This machine's physical RAM (``os.sysconf``: pages x page size, POSIX); None where it cannot be read."""
    import os

    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def with_cpu_budget(values: dict[str, object], prov: dict[str, str] | None = None) -> str | None:
    """A CPU run given no memory gets this machine's RAM as its budget (``os.sysconf``: physical pages x page
    size, POSIX), in ``values["host_memory"]``; returns the assumption line, or None when nothing was added.

    The readers refuse a CPU run with no memory at all (no GPU's memory is the answer for it); the command
    line and the integrations run on the machine itself, so they can say how much it has.
    """
    if str(values.get("device_type", "")).lower() != "cpu" or values.get("gpu") is not None:
        return None
    if values.get("gpu_memory") is not None or values.get("host_memory") is not None:
        return None
    ram = machine_ram_bytes()
    if ram is None:
        return None
    values["host_memory"] = ram
    if prov is not None:
        prov["host_memory"] = "this machine's RAM (CPU run)"
    return f"CPU run with no --host_memory: the budget is this machine's RAM, {ram / 2**30:.2f} GiB"


@cache
def known_script_flags() -> frozenset[str]:
    """Field names of ``transformers.TrainingArguments`` and the installed TRL config/script dataclasses."""
    names: set[str] = set()
    try:
        from transformers import TrainingArguments

        names |= {f.name for f in dataclasses.fields(TrainingArguments)}
    except ImportError:  # pragma: no cover - fitcheck[hf]
        pass
    try:
        import trl
    except ImportError:
        return frozenset(names)
    for cls_name in _TRL_CLASSES:
        try:
            cls = getattr(trl, cls_name)
        except Exception:  # absent in this TRL version (or its optional dependency is missing)
            continue
        if dataclasses.is_dataclass(cls):
            names |= {f.name for f in dataclasses.fields(cls)}
    return frozenset(names)


def unknown_flags_finding(passed_over: Iterable[str], source: str) -> Finding | None:
    """The passed-over flags that are no TrainingArguments/TRL field (the script's own), as one finding."""
    known = known_script_flags()
    unknown = [f for f in passed_over if f.removeprefix("--").removeprefix("no_") not in known]
    if not unknown:
        return None
    return Finding(
        "script-flags-passed-over", Severity.INFO,
        f"{source}: flags that are not TrainingArguments/TRL names were passed over: " + " ".join(unknown[:12])
        + (" ..." if len(unknown) > 12 else ""),
    )
