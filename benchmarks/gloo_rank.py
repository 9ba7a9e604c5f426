"""How a CPU (gloo) rank of a multi-process benchmark starts and ends.

Start (:func:`start_rank`): a spawned rank inherits the parent's environment, and accelerate/FSDP switches a test
process set before (``ACCELERATE_USE_DEEPSPEED``, ``FSDP_*``, ...) would change what ``Accelerator`` builds; so
they are dropped, the rendezvous variables are set and an explicit gloo group is joined (accelerate reuses an
initialised one). Its FSDP1 row once failed inside the full suite with "Default process group has not been
initialized" without this.

End (:func:`finish_rank`): wait for every rank, tear the group down, leave.

CI once saw rank 0 of the 2-process DeepSpeed tuning run die with ``terminate called without an active
exception`` (SIGABRT) after its work was done: a C++ thread of the gloo process group was still joinable when
the interpreter's static destructors ran. torch documents that a process group should be destroyed before
exit (``torch/distributed/distributed_c10d.py``, ``destroy_process_group``); the barrier first makes sure no
rank tears down while the other still talks to it, and ``os._exit`` skips the remaining static destructors once
the result file is on disk and the streams are flushed.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def free_port() -> str:
    """A TCP port nothing listens on now, for a one-process rendezvous (``MASTER_PORT``): fixed ports clashed when two
    test files, run side by side by ``pytest -n 2 --dist loadfile``, started the same helper at once."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def without_deepspeed_shm_comm() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory collective in this process.

    DeepSpeed 0.19.8 builds ``deepspeed_shm_comm`` (``csrc/cpu/comm/shm*.cpp``, g++ ``-O2 -fopenmp``) when its CPU
    accelerator's ``TorchBackend`` starts (``deepspeed/comm/torch.py`` ``build_shm_op``) unless
    ``deepspeed.ops.__compatible_ops__`` says the op is not compatible. It serves ``inference_all_reduce`` only
    (same file); the training engines' collectives are ``torch.distributed``'s, and the GPU runs these CPU checks
    stand for never load it. On a fresh machine (CI) the first DeepSpeed engine paid the compile: 65 CPU-seconds,
    150 s of wall time on a loaded 2-core machine (measured session 20), and engines starting meanwhile waited on
    the build's lock. ``ops/__init__.py`` caches that dict in the module ("edits to it persist")."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def start_rank(rank: int, world: int, port: int) -> None:
    """Drop inherited accelerate/FSDP switches, set the rendezvous variables, join a gloo group of ``world``."""
    for key in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))]:
        del os.environ[key]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)


def finish_rank() -> None:
    """Barrier, destroy the default process group if one is up, flush, and exit 0 without static destructors."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def fsdp_on_cpu(accelerator: Any, plugin: Any) -> None:
    """Set on a CPU ``Accelerator`` what accelerate 1.15 ``AcceleratorState.__init__`` sets only for GPU-type
    backends (state.py: the FSDP branch sits under MULTI_GPU/...): distributed type FSDP, the plugin with the run's
    mixed precision (``set_mixed_precision``), and the CPU as device (FSDP1 refuses ``device_id=cpu:0`` against
    the CPU compute device). Everything after it (``prepare``, the Trainer) is the real code."""
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState().distributed_type = DistributedType.FSDP
    PartialState().device = torch.device("cpu")
    accelerator.state.device = torch.device("cpu")
    if accelerator.state.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.state.mixed_precision)
    accelerator.state.fsdp_plugin = plugin


def install_fsdp_on_cpu_trainer() -> None:
    """Make ``transformers.Trainer`` build its Accelerator with :func:`fsdp_on_cpu` applied (a subclass installed
    as ``transformers.trainer.Accelerator``), so that a real Trainer with an ``fsdp_config`` runs FSDP on CPU
    gloo ranks. Call it in the rank's own process, before the Trainer is built."""
    import accelerate
    import transformers

    class FsdpOnCpuAccelerator(accelerate.Accelerator):  # type: ignore[misc]
        def __init__(self, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, fsdp_plugin=fsdp_plugin, **kwargs)
            if fsdp_plugin is not None:  # what AcceleratorState.__init__ does for GPU-type backends
                fsdp_on_cpu(self, fsdp_plugin)

    transformers.trainer.Accelerator = FsdpOnCpuAccelerator
