"""fitcheck as an axolotl plugin: one ``plugins:`` line runs the preflight and adds :class:`FitcheckCallback`.

In the axolotl config::

    plugins:
      - fitcheck.integrations.axolotl_plugin.FitcheckPlugin
    fitcheck_stop_if_not_fits: true   # optional: stop the run before the model loads when it will not fit
    fitcheck_gpu: A100-80GB           # optional (default: this machine's GPU); or fitcheck_gpu_memory: 24GiB

axolotl's ``PluginManager`` (``integrations/base.py``, commit ``067b021c8b87a9e5e380b9173c704cf7340e30f5``) imports
the class by its dotted name, calls ``pre_model_load(cfg)`` before the model is loaded (``loaders/model.py``) and
``add_callbacks_pre_trainer(cfg, model)`` when the Trainer is built (``core/builders/base.py``). Here:

* ``pre_model_load`` reads the config file axolotl loaded (``cfg.axolotl_config_path``, set by ``cli/config.py``
  ``load_cfg``) with :func:`fitcheck.readers.read_axolotl`, estimates it for ``cfg.world_size`` processes and
  prints the report; with ``fitcheck_stop_if_not_fits: true`` it raises :class:`DoesNotFitError` when the run
  will not fit (nothing has been loaded yet);
* ``add_callbacks_pre_trainer`` returns :class:`FitcheckCallback` (the loaded model's real dtypes, adapters and
  quantized layers; measured vs predicted peak after the first steps);
* ``get_input_args`` names :class:`FitcheckArgs`, so axolotl's config validation accepts the ``fitcheck_*`` keys.

axolotl does not install with fitcheck's pinned stack (axolotl 0.19.0 pins transformers==5.16.1, peft==0.20.0,
accelerate==1.13.0, trl==1.9.0), so without axolotl the plugin subclasses a stand-in with BasePlugin's method
names and signatures at that commit (``tests/test_axolotl_plugin.py`` checks them against the source).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fitcheck.errors import ConfigError
from fitcheck.report import Report


class _StandIn:
    """Stand-in for ``axolotl.integrations.base.BasePlugin`` (the hooks fitcheck uses, same signatures)."""

    def __init__(self) -> None:
        """Nothing to set up (as BasePlugin)."""

    def register(self, cfg: dict[str, Any]) -> None:
        """Called with the unparsed config when the plugin is registered."""

    def get_input_args(self) -> str | None:
        """The dotted name of a pydantic model of the plugin's config keys."""
        return None

    def pre_model_load(self, cfg: Any) -> None:
        """Called before the model is loaded."""

    def add_callbacks_pre_trainer(self, cfg: Any, model: Any) -> list[Any]:
        """Callbacks to add to the Trainer."""
        return []


if TYPE_CHECKING:
    _PluginBase = _StandIn
else:
    try:  # axolotl's own base class when axolotl is installed
        from axolotl.integrations.base import BasePlugin as _PluginBase
    except ImportError:  # not installable with the pinned stack (see the module docstring)
        _PluginBase = _StandIn


try:  # axolotl validates plugin keys with pydantic (a dependency of axolotl, not of fitcheck)
    from pydantic import BaseModel

    class FitcheckArgs(BaseModel):
        """The ``fitcheck_*`` keys of an axolotl config (merged into axolotl's schema by ``get_input_args``)."""

        fitcheck_stop_if_not_fits: bool | None = None
        fitcheck_gpu: str | None = None
        fitcheck_gpu_memory: str | None = None
        fitcheck_num_processes: int | None = None

except ImportError:  # pragma: no cover - pydantic absent: axolotl is absent too
    pass


class FitcheckPlugin(_PluginBase):
    """Preflight before the model loads and :class:`FitcheckCallback` in the Trainer (see the module docstring).

    Attributes:
        report: The preflight's report (None before ``pre_model_load``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.report: Report | None = None

    def get_input_args(self) -> str:
        """axolotl imports this pydantic model and accepts its keys in the config."""
        return "fitcheck.integrations.axolotl_plugin.FitcheckArgs"

    def pre_model_load(self, cfg: Any) -> None:
        """Estimate the run from the config file; stop it when asked and it will not fit.

        Raises:
            DoesNotFitError: ``fitcheck_stop_if_not_fits: true`` and the run will not fit.
        """
        from fitcheck.integrations.trainer import DoesNotFitError

        stop = bool(_get(cfg, "fitcheck_stop_if_not_fits"))
        try:
            self.report = axolotl_preflight(cfg, env=dict(os.environ))
        except ConfigError as exc:
            if stop:
                raise
            print(f"fitcheck: no estimate: {exc}", file=sys.stderr)
            return
        from fitcheck.render import make_console, print_report

        print_report(self.report, make_console())
        if stop and (not self.report.fits or self.report.errors):
            raise DoesNotFitError(self.report)

    def add_callbacks_pre_trainer(self, cfg: Any, model: Any) -> list[Any]:
        """:class:`FitcheckCallback` for the Trainer axolotl builds (warns; never stops the run)."""
        from fitcheck.integrations.trainer import FitcheckCallback

        return [FitcheckCallback(gpu=_get(cfg, "fitcheck_gpu"), gpu_memory=_get(cfg, "fitcheck_gpu_memory"))]


def _get(cfg: Any, key: str) -> Any:
    """A key of axolotl's ``DictDefault`` (a dict whose missing keys read as None) or of a plain mapping."""
    return cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)


def axolotl_preflight(cfg: Any, env: Mapping[str, str]) -> Report:
    """The estimate of the axolotl run whose config ``cfg`` was loaded from ``cfg.axolotl_config_path``.

    Args:
        cfg: axolotl's config (``DictDefault``) or a mapping with ``axolotl_config_path``.
        env: Environment (``WORLD_SIZE`` when ``cfg.world_size`` is not set; the HF cache).

    Returns:
        The report.

    Raises:
        ConfigError: No config file, or what :func:`fitcheck.readers.read_axolotl` refuses.
    """
    from fitcheck.integrations.spec_build import build_spec, inventory_for

    from fitcheck.core import estimate
    from fitcheck.readers import read_axolotl

    path = _get(cfg, "axolotl_config_path")
    if not path or not Path(str(path)).is_file():
        raise ConfigError("axolotl plugin: cfg.axolotl_config_path names no file (axolotl's load_cfg sets it); "
                          "run the config with `axolotl train FILE`")
    run = read_axolotl(str(path), cwd=os.getcwd())
    values = dict(run.values)
    where = dict(run.where)
    processes = _get(cfg, "fitcheck_num_processes") or _get(cfg, "world_size") or env.get("WORLD_SIZE")
    if processes:
        values["num_processes"] = int(str(processes))
        where["num_processes"] = "axolotl world_size"
    for key in ("gpu", "gpu_memory"):
        if _get(cfg, f"fitcheck_{key}"):
            values[key] = _get(cfg, f"fitcheck_{key}")
            where[key] = f"{path}:fitcheck_{key}"
    if "gpu" not in values and "gpu_memory" not in values:
        from fitcheck.integrations.spec_build import detected_gpu

        values.update(detected_gpu())
    if "fsdp_config" in values and "fsdp" not in values:
        values["fsdp"] = "full_shard"  # axolotl's FSDP section: fully sharded unless it says otherwise
    model = str(values.pop("model_name_or_path"))
    findings = list(run.findings)
    # rl: dpo/kto/grpo arrive as the `trainer` setting: the readers' merge builds the TRL trainer from it
    spec, assumptions = build_spec(inventory_for(model, env), values, where, findings, env)
    report = estimate(spec)
    import dataclasses

    return dataclasses.replace(report, assumptions=(*report.assumptions, *run.notes, *assumptions))
