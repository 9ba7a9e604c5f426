"""The ``optimizer`` and ``scheduler`` sections of a DeepSpeed config: which optimizer the engine builds.

With an ``optimizer`` section the Trainer builds no optimizer of its own: transformers 5.23
``integrations/deepspeed.py`` ``deepspeed_optim_sched`` passes a ``DummyOptim`` over
``model_parameters = [p for p in model.parameters() if p.requires_grad]`` (``deepspeed_init``: one parameter group,
not the Trainer's decay / no-decay pair), so ``optim``, ``optim_args`` and ``optim_target_modules`` are not used;
accelerate 1.15 ``accelerator.py`` ``_prepare_deepspeed`` hands those parameters to ``deepspeed.initialize`` without
an optimizer (and without ``map_pytorch_optim_to_deepspeed``, which only swaps a real one). DeepSpeed 0.19.8 then
builds the class from ``optimizer.type`` (``runtime/config.py``: a name of ``DEEPSPEED_OPTIMIZERS`` is matched
lower-cased; ``runtime/engine.py`` ``_configure_basic_optimizer`` / ``get_optimizer_configuration``):

* ``Adam`` / ``AdamW``: ``FusedAdam`` (``ops/adam/fused_adam.py``: ``exp_avg`` + ``exp_avg_sq`` ``zeros_like`` the
  fp32 partition, a multi-tensor kernel in place, a Python int step), ``DeepSpeedCPUAdam`` under
  ``offload_optimizer``, torch's ``AdamW`` / ``Adam`` with ``torch_adam: true`` (checked first). ``adam_w_mode``
  only changes the update. ``amsgrad`` is refused by FusedAdam and DeepSpeedCPUAdam (``RuntimeError``).
* ``Adagrad``: torch's ``Adagrad`` (``DeepSpeedCPUAdagrad`` under offload); ``Lion``: ``FusedLion`` (one
  ``exp_avg``; ``DeepSpeedCPULion`` under offload); ``Lamb``: ``FusedLamb`` (CUDA only, two states);
  ``Muon``: ``MuonWithAuxAdam``; ``MuAdam`` / ``MuAdamW`` / ``MuSGD``: the ``mup`` package's.
* any other ``type``: ``getattr(torch.optim, type)`` (case as written).

The states of that class are counted as those of the ``optim`` value with the same states (one home for state
sizes: :mod:`fitcheck.core.optimizers`); this module only says which value that is. Under ZeRO (stage >= 1)
DeepSpeed asserts the class is in ``runtime/zero/utils.py`` ``ZERO_SUPPORTED_OPTIMIZERS`` (MuonWithAuxAdam added)
unless the config sets ``zero_allow_untested_optimizer: true`` (transformers sets it only when the Trainer builds
the optimizer). ``"max_grad_norm"`` in ``optimizer.params`` is a ``ValueError`` (``_configure_basic_optimizer``).

A ``scheduler`` section is built from ``deepspeed/runtime/lr_schedules.py`` (``VALID_LR_SCHEDULES``) or
``torch.optim.lr_scheduler`` (``_scheduler_from_config``; an unknown name is an ``AssertionError``); a schedule keeps
Python numbers only: no device memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import as_bool, is_auto, where
from fitcheck.spec import OffloadDevice, OptimizerName

# deepspeed 0.19.8 runtime/config.py DEEPSPEED_OPTIMIZERS (a type matching one lower-cased is that name).
DEEPSPEED_OPTIMIZER_TYPES = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon")
# torch 2.13 torch/optim/__init__.py: the Optimizer subclasses ``getattr(torch.optim, type)`` finds (pinned by
# tests/test_deepspeed_optimizer.py against the installed torch). ``Optimizer`` itself cannot be built.
TORCH_OPTIMIZER_CLASSES = frozenset({
    "ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon", "NAdam", "RAdam",
    "RMSprop", "Rprop", "SGD", "SparseAdam",
})
# deepspeed 0.19.8 runtime/lr_schedules.py VALID_LR_SCHEDULES, and torch 2.13 optim/lr_scheduler.py's schedulers
# (``_scheduler_from_config`` looks in that order; pinned by the same test).
DEEPSPEED_SCHEDULERS = ("LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
TORCH_LR_SCHEDULERS = frozenset({
    "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
    "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR",
    "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR",
})
# deepspeed 0.19.8 runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS (+ MuonWithAuxAdam, is_zero_supported_optimizer).
ZERO_SUPPORTED_CLASSES = frozenset({
    "torch.optim.Adam", "torch.optim.AdamW", "FusedAdam", "DeepSpeedCPUAdam", "torch.optim.Adagrad",
    "DeepSpeedCPUAdagrad", "DeepSpeedCPULion", "FusedLion", "MuonWithAuxAdam",
})


@dataclass(frozen=True)
class _Built:
    """What the engine builds for a type: its class, the ``optim`` value with its states, why not modelled."""

    cls: str
    optim: OptimizerName
    not_modelled: str = ""
    args: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ConfigOptimizer:
    """The optimizer a DeepSpeed config's ``optimizer`` section builds.

    Attributes:
        type: ``optimizer.type`` as written.
        builds: The class DeepSpeed builds (``DeepSpeedSpec.optimizer_class``).
        optim: The ``optim`` value whose states are that class's (the run's ``optim`` becomes it).
        optim_args: ``optim_args`` for it (``key=value,...``: SGD's / RMSprop's memory-relevant params), or "".
        findings: What the section overrides, and what is not modelled.
    """

    type: str
    builds: str
    optim: OptimizerName
    optim_args: str
    findings: tuple[Finding, ...]


def read_config_optimizer(
    raw: Mapping[str, object],
    source: str,
    *,
    stage: int,
    offload_optimizer: OffloadDevice,
    run_optim: str | None,
    run_optim_where: str,
) -> ConfigOptimizer | None:
    """Read a DeepSpeed config's ``optimizer`` (and check its ``scheduler``) section.

    Args:
        raw: The whole parsed DeepSpeed config.
        source: The file name, for messages.
        stage: The ZeRO stage (the ZeRO-supported check applies from 1).
        offload_optimizer: ``zero_optimization.offload_optimizer.device`` after the stage's rules.
        run_optim: The run's ``optim`` when given explicitly (for the override finding), else None.
        run_optim_where: Where ``run_optim`` was read.

    Returns:
        What the section builds, or None when the config has no ``optimizer`` section.

    Raises:
        ConfigError: A section, type or setting DeepSpeed refuses.
    """
    _check_scheduler(raw, source)
    section = raw.get("optimizer")
    if section is None:
        return None
    at = where(source, "optimizer")
    if not isinstance(section, Mapping):
        raise ConfigError(f'{at}: expected a mapping like {{"type": "AdamW", "params": {{...}}}}, got {section!r}')
    type_raw = section.get("type")
    if not isinstance(type_raw, str) or not type_raw.strip():
        raise ConfigError(
            f'{where(source, "optimizer.type")}: missing; with an optimizer section the Trainer builds no optimizer '
            '(transformers deepspeed_optim_sched) and DeepSpeed builds none without a type: set "type": "AdamW"'
        )
    params = section.get("params") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{where(source, 'optimizer.params')}: expected a mapping of settings, got {params!r}")
    params = {str(k): v for k, v in params.items()}
    if "max_grad_norm" in params:  # deepspeed 0.19.8 engine.py _configure_basic_optimizer raises ValueError
        raise ConfigError(
            f"{where(source, 'optimizer.params.max_grad_norm')}: DeepSpeed refuses it as an optimizer parameter; "
            'use the top-level "gradient_clipping" (or --max_grad_norm) instead'
        )
    offload = offload_optimizer is not OffloadDevice.NONE
    built = _built(type_raw, params, source, offload=offload)
    allowed = raw.get("zero_allow_untested_optimizer", False)  # DeepSpeed default False (runtime/constants.py)
    if stage >= 1 and built.cls not in ZERO_SUPPORTED_CLASSES and not (
        not is_auto(allowed) and as_bool(allowed, at=where(source, "zero_allow_untested_optimizer"))
    ):
        raise ConfigError(
            f"{at}.type {type_raw!r} builds {built.cls}, which ZeRO-{stage} refuses: 'You are using an untested ZeRO "
            "Optimizer' (deepspeed 0.19.8 engine.py _do_optimizer_sanity_check; transformers sets "
            'zero_allow_untested_optimizer only when the Trainer builds the optimizer); add '
            '"zero_allow_untested_optimizer": true to the config, or use AdamW'
        )
    return ConfigOptimizer(type_raw, built.cls, built.optim, ",".join(f"{k}={v}" for k, v in built.args),
                           tuple(_findings(built, type_raw, source, run_optim, run_optim_where)))


def _built(type_raw: str, params: Mapping[str, object], source: str, *, offload: bool) -> _Built:
    """The class deepspeed 0.19.8 ``_configure_basic_optimizer`` builds for ``type_raw`` and its ``optim`` twin."""
    name = type_raw.lower() if type_raw.lower() in DEEPSPEED_OPTIMIZER_TYPES else type_raw
    flag = _ParamFlags(params, source)
    if name in ("adam", "adamw"):
        torch_adam = flag("torch_adam")
        amsgrad = flag("amsgrad")
        if torch_adam:
            cls = "torch.optim.AdamW" if name == "adamw" or flag("adam_w_mode", default=True) else "torch.optim.Adam"
            why = "amsgrad (a third state, max_exp_avg_sq) is not modelled" if amsgrad else ""
            if "foreach" in params and params["foreach"] is not None:
                why = why or "an explicit foreach is not modelled (torch's default for the device is)"
            return _Built(cls, "adamw_torch", why)
        cls = "DeepSpeedCPUAdam" if offload else "FusedAdam"
        if amsgrad:
            raise ConfigError(
                f"{where(source, 'optimizer.params.amsgrad')}: {cls} does not support the AMSGrad variant "
                "(deepspeed 0.19.8 ops/adam); remove it, or add torch_adam: true for torch's AdamW"
            )
        # FusedAdam: two fp32 states, updated in place by the multi-tensor kernel (torch's fused AdamW's states);
        # DeepSpeedCPUAdam is counted as accelerate's swap is (core/states/layout.py ds_cpu_optimizer).
        return _Built(cls, "adamw_torch_fused")
    if name == "adagrad":
        return _Built("DeepSpeedCPUAdagrad" if offload else "torch.optim.Adagrad", "adagrad")
    if name == "lion":  # FusedLion / DeepSpeedCPULion: one fp32 exp_avg (bitsandbytes' 32-bit Lion's states)
        return _Built("DeepSpeedCPULion" if offload else "FusedLion", "lion_32bit")
    if name == "lamb":
        why = "FusedLamb's step (per-tensor norms in its CUDA kernel) is not modelled; its two fp32 states are counted"
        if offload:
            why = "FusedLamb is a CUDA kernel and offload_optimizer keeps the fp32 partition on the host; " + why
        return _Built("FusedLamb", "adamw_torch_fused", why)
    if name == "muon":
        return _Built("MuonWithAuxAdam", "adamw_torch_fused",
                      "Muon (one momentum buffer for the matrices, Adam's two states for the rest, Newton-Schulz "
                      "temporaries) is not modelled; Adam's two fp32 states are counted for every parameter")
    if name in ("muadam", "muadamw", "musgd"):
        twin: OptimizerName = "sgd" if name == "musgd" else "adamw_torch"
        return _Built(f"mup.{type_raw}", twin, f"mup's {type_raw} is not read (mup is not installed here); "
                      f"torch's {'SGD' if twin == 'sgd' else 'Adam'} states are counted")
    if name not in TORCH_OPTIMIZER_CLASSES:
        close = [n for n in (*DEEPSPEED_OPTIMIZER_TYPES, *sorted(TORCH_OPTIMIZER_CLASSES))
                 if n.lower() == type_raw.lower()]
        raise ConfigError(
            f"{where(source, 'optimizer.type')}: '{type_raw} is not a supported DeepSpeed Optimizer' (deepspeed "
            "0.19.8 engine.py _do_sanity_check: neither a DeepSpeed optimizer nor a torch.optim class)"
            + (f"; did you mean {close[0]!r}?" if close else "; its optimizer types are "
               + ", ".join(DEEPSPEED_OPTIMIZER_TYPES) + " (any case) or a torch.optim class name")
        )
    if name in ("SGD", "RMSprop"):  # the memory-relevant params as optim_args (core/optimizers/by_name.py reads them)
        momentum = flag.number("momentum")
        args: list[tuple[str, str]] = [("momentum", f"{momentum:g}")] if momentum else []
        extra = "nesterov" if name == "SGD" else "centered"
        if flag(extra):
            args.append((extra, "true"))
        return _Built(f"torch.optim.{name}", "sgd" if name == "SGD" else "rmsprop", "", tuple(args))
    return _Built(f"torch.optim.{name}", "adamw_torch",
                  f"torch.optim.{name}'s states are not modelled; torch AdamW's two states are counted")


class _ParamFlags:
    """Typed reads of ``optimizer.params`` (``"auto"`` is filled only for lr, betas, eps and weight_decay)."""

    def __init__(self, params: Mapping[str, object], source: str) -> None:
        self.params, self.source = params, source

    def _value(self, key: str) -> object:
        value = self.params.get(key)
        if is_auto(value):
            raise ConfigError(f'{where(self.source, "optimizer.params." + key)}: "auto" is not filled by '
                              "transformers for this key (only lr, betas, eps, weight_decay); set a value")
        return value

    def __call__(self, key: str, default: bool = False) -> bool:
        value = self._value(key)
        return default if value is None else as_bool(value, at=where(self.source, "optimizer.params." + key))

    def number(self, key: str) -> float:
        value = self._value(key)
        if value is None:
            return 0.0
        try:
            return float(str(value))
        except ValueError:
            raise ConfigError(f"{where(self.source, 'optimizer.params.' + key)}: expected a number, "
                              f"got {value!r}") from None


def _findings(built: _Built, type_raw: str, source: str, run_optim: str | None, run_where: str) -> list[Finding]:
    out: list[Finding] = []
    given = f"; optim {run_optim} ({run_where}) is not used" if run_optim else ""
    differs = run_optim is not None and run_optim.strip().lower() != built.optim
    out.append(Finding(
        "deepspeed-optimizer",
        Severity.WARNING if differs else Severity.INFO,
        f"{source}: optimizer.type {type_raw} builds DeepSpeed's {built.cls} over one parameter group of every "
        f"trainable parameter (transformers deepspeed_optim_sched: DummyOptim){given}; its states are counted as "
        f"optim {built.optim}'s",
        f"remove the optimizer section of {source} to train with --optim {run_optim}" if differs else "",
    ))
    if built.not_modelled:
        out.append(Finding("not-modelled", Severity.WARNING,
                           f"{source}: optimizer.type {type_raw} ({built.cls}): {built.not_modelled}", ""))
    return out


def _check_scheduler(raw: Mapping[str, object], source: str) -> None:
    """A ``scheduler`` section DeepSpeed can build (it holds no device memory); ConfigError otherwise."""
    section = raw.get("scheduler")
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where(source, 'scheduler')}: expected a mapping like "
                          f'{{"type": "WarmupLR", "params": {{...}}}}, got {section!r}')
    name = section.get("type")
    if name is None:  # deepspeed get_scheduler_name: no type, no scheduler built
        return
    if not isinstance(name, str) or (name not in DEEPSPEED_SCHEDULERS and name not in TORCH_LR_SCHEDULERS):
        raise ConfigError(
            f"{where(source, 'scheduler.type')}: DeepSpeed does not recognize LR scheduler {name!r} (deepspeed 0.19.8 "
            f"engine.py _scheduler_from_config); use one of {', '.join(DEEPSPEED_SCHEDULERS)} or a "
            "torch.optim.lr_scheduler class"
        )
