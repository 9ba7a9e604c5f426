"""The typed description of one training run: frozen dataclasses and str-Enums.

Data flows one way: readers turn raw input (flags, config files, live objects) into a :class:`TrainingSpec`;
the pure core turns a spec into a :class:`fitcheck.report.Report`. Nothing here imports torch, reads files or
prints. Specs are frozen so that advice is cheap: ``dataclasses.replace(spec, batch=replace(spec.batch,
micro_batch=4))`` and estimate again.

Room layout: :mod:`.model` (what the model is: dtypes, parameters, shape, inventory), :mod:`.sharding`
(strategy, DeepSpeed, FSDP, processes) and :mod:`.training` (precision, optimizer, adapters, quantization,
batch, activations, hardware, :class:`TrainingSpec`). Import from here.
"""

from fitcheck.spec.model import (
    Dtype,
    Kind,
    ModelInventory,
    ModelShape,
    ParamEntry,
    Role,
)
from fitcheck.spec.sharding import (
    SHARDING_STRATEGIES,
    AutoWrapPolicy,
    DeepSpeedSpec,
    FsdpSpec,
    OffloadDevice,
    ParallelismSpec,
    ShardingSpec,
    ShardingStrategy,
    Strategy,
)
from fitcheck.spec.training import (
    DEFAULT_OPTIMIZER,
    LOSS_IMPLEMENTATIONS,
    MODELLED_VERSIONS,
    OPTIMIZER_NAMES,
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    FreezeSpec,
    HardwareSpec,
    LigerSpec,
    LoraSpec,
    LossKind,
    MixedPrecision,
    OptimizerName,
    OptimizerSpec,
    PrecisionSpec,
    QuantSpec,
    StackSpec,
    TrainerKind,
    TrainerSpec,
    TrainingSpec,
    VllmMode,
)

__all__ = [
    "DEFAULT_OPTIMIZER",
    "LOSS_IMPLEMENTATIONS",
    "MODELLED_VERSIONS",
    "OPTIMIZER_NAMES",
    "SHARDING_STRATEGIES",
    "ActivationSpec",
    "AttnImpl",
    "AutoWrapPolicy",
    "BatchSpec",
    "DeepSpeedSpec",
    "DeviceType",
    "Dtype",
    "FreezeSpec",
    "FsdpSpec",
    "HardwareSpec",
    "Kind",
    "LigerSpec",
    "LoraSpec",
    "LossKind",
    "MixedPrecision",
    "ModelInventory",
    "ModelShape",
    "OffloadDevice",
    "OptimizerName",
    "OptimizerSpec",
    "ParallelismSpec",
    "ParamEntry",
    "PrecisionSpec",
    "QuantSpec",
    "Role",
    "ShardingSpec",
    "ShardingStrategy",
    "StackSpec",
    "Strategy",
    "TrainerKind",
    "TrainerSpec",
    "TrainingSpec",
    "VllmMode",
]
