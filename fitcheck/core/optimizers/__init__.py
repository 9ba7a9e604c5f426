"""Optimizer memory for every ``TrainingArguments.optim`` value, as each implementation allocates it.

- :mod:`.by_name`: ``optim`` names -> the implementation (torch AdamW/SGD/Adagrad/..., and the dispatch);
- :mod:`.other_families`: bitsandbytes, torchao, Adafactor, GaLore, AnyPrecision, ...;
- :mod:`.step_tensors`: the tensor groups one step walks over, the Trainer's parameter groups and the
  transient bytes of a step (single-tensor, foreach, fused).

Where a new optimizer goes: its states and step temporaries in :mod:`.other_families` (or a new module here
when it is a family of its own), its name in :mod:`.by_name`'s table.
"""

from fitcheck.core.optimizers.by_name import OPTIMIZER_NAMES, canonical_optimizer, optimizer_memory
from fitcheck.core.optimizers.step_tensors import OptimizerMemory, TensorGroup, step_runs, trainer_decays

__all__ = [
    "OPTIMIZER_NAMES",
    "OptimizerMemory",
    "TensorGroup",
    "canonical_optimizer",
    "optimizer_memory",
    "step_runs",
    "trainer_decays",
]
