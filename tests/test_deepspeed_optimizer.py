"""A DeepSpeed config's own ``optimizer`` / ``scheduler`` sections (readers/deepspeed_optimizer.py): what DeepSpeed
builds, what it refuses, and the real engine's peaks with it (benchmarks/deepspeed_optimizer_cpu.py, recorded from
deepspeed 0.19.8 on CPU in benchmarks/data/deepspeed_optimizer_cpu.json)."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.errors import ConfigError
from fitcheck.findings import Severity
from fitcheck.readers.deepspeed import resolve_deepspeed
from fitcheck.readers.deepspeed_optimizer import (
    DEEPSPEED_OPTIMIZER_TYPES,
    DEEPSPEED_SCHEDULERS,
    TORCH_LR_SCHEDULERS,
    TORCH_OPTIMIZER_CLASSES,
    ZERO_SUPPORTED_CLASSES,
)
from fitcheck.readers.merge import merge_sources

ROOT = Path(__file__).parent.parent
RECORDED = json.loads((ROOT / "benchmarks" / "data" / "deepspeed_optimizer_cpu.json").read_text())


def _deepspeed_source(module: str) -> ast.Module:
    """The installed deepspeed's source of ``module`` (read, not imported: importing deepspeed takes seconds)."""
    spec = importlib.util.find_spec("deepspeed")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations)), *module.split(".")).with_suffix(".py")
    return ast.parse(path.read_text())


def _assigned(tree: ast.Module, name: str) -> list[str]:
    """The names or strings listed in a module-level ``name = [...]`` (constants resolved in the module)."""
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              for t in n.targets if isinstance(t, ast.Name)}
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets))
    assert isinstance(node, ast.List)
    return [str(consts.get(e.id, e.id)) if isinstance(e, ast.Name) else ast.unparse(e) for e in node.elts]


def test_names_are_the_installed_libraries() -> None:
    """The type, class and scheduler names are deepspeed 0.19.8's (its sources) and torch 2.13's own."""
    import torch

    assert tuple(_assigned(_deepspeed_source("runtime.config"), "DEEPSPEED_OPTIMIZERS")) == DEEPSPEED_OPTIMIZER_TYPES
    schedules = _deepspeed_source("runtime.lr_schedules")
    assert tuple(_assigned(schedules, "VALID_LR_SCHEDULES")) == DEEPSPEED_SCHEDULERS
    supported = {n for n in _assigned(_deepspeed_source("runtime.zero.utils"), "ZERO_SUPPORTED_OPTIMIZERS")
                 if n != "ZenFlowCPUAdam"}  # ZenFlow: not configured by a section's type
    assert supported | {"MuonWithAuxAdam"} == ZERO_SUPPORTED_CLASSES
    optim = {n for n in torch.optim.__all__ if isinstance(getattr(torch.optim, n), type)
             and issubclass(getattr(torch.optim, n), torch.optim.Optimizer) and n != "Optimizer"}
    assert optim == TORCH_OPTIMIZER_CLASSES
    sched = torch.optim.lr_scheduler
    assert {n for n in sched.__all__ if isinstance(getattr(sched, n), type)} == TORCH_LR_SCHEDULERS


def _merged(tmp_path: Path, ds: dict[str, Any], cli: dict[str, object] | None = None) -> Any:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", **ds}))
    return merge_sources({"num_processes": 2, "bf16": True, **(cli or {})}, training_args_file=None,
                         deepspeed_file=str(path), accelerate_config_file=None, fsdp=None, env={}, hidden_size=64)


@pytest.mark.parametrize(("section", "offload", "builds", "optim", "args"), [
    ({"type": "AdamW", "params": {"lr": "auto"}}, False, "FusedAdam", "adamw_torch_fused", ""),
    ({"type": "adam", "params": {"adam_w_mode": False}}, True, "DeepSpeedCPUAdam", "adamw_torch_fused", ""),
    ({"type": "AdamW", "params": {"torch_adam": True}}, False, "torch.optim.AdamW", "adamw_torch", ""),
    ({"type": "Lion"}, False, "FusedLion", "lion_32bit", ""),
    ({"type": "Lion"}, True, "DeepSpeedCPULion", "lion_32bit", ""),
    ({"type": "Adagrad"}, True, "DeepSpeedCPUAdagrad", "adagrad", ""),
])
def test_section_builds_deepspeeds_class_and_overrides_optim(
    tmp_path: Path, section: dict[str, Any], offload: bool, builds: str, optim: str, args: str
) -> None:
    """deepspeed 0.19.8 engine.py ``_configure_basic_optimizer``; the Trainer's ``--optim`` is not used
    (transformers 5.23 ``deepspeed_optim_sched``: DummyOptim)."""
    zero: dict[str, object] = {"stage": 2, **({"offload_optimizer": {"device": "cpu"}} if offload else {})}
    run = _merged(tmp_path, {"zero_optimization": zero, "optimizer": section}, {"optim": "adamw_bnb_8bit"})
    assert run.sharding.deepspeed.optimizer_class == builds
    assert (run.values["optim"], run.values["optim_args"]) == (optim, args)
    found = [f for f in run.findings if f.code == "deepspeed-optimizer"]
    assert len(found) == 1 and found[0].severity is Severity.WARNING and "adamw_bnb_8bit" in found[0].message


def test_sgd_params_and_not_modelled_types(tmp_path: Path) -> None:
    sgd = {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}
    run = _merged(tmp_path, {"zero_optimization": {"stage": 0}, "optimizer": sgd})
    assert (run.values["optim"], run.values["optim_args"]) == ("sgd", "momentum=0.9,nesterov=true")
    assert [f.severity for f in run.findings if f.code == "deepspeed-optimizer"] == [Severity.INFO]
    lamb = {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "optimizer": {"type": "Lamb"}}
    assert any(f.code == "not-modelled" and "FusedLamb" in f.message for f in _merged(tmp_path, lamb).findings)


@pytest.mark.parametrize("case", sorted(RECORDED["outcomes"]))
def test_refused_exactly_where_the_real_engine_refuses(case: str) -> None:
    """Each config of ``REFUSALS``: fitcheck exits 2 (ConfigError) where the real ``deepspeed.initialize``
    raised, and reads it where the engine built its optimizer (the class it built)."""
    from benchmarks.deepspeed_optimizer_cpu import REFUSALS

    outcome = RECORDED["outcomes"][case]
    raw = {"train_micro_batch_size_per_gpu": 1, **REFUSALS[case]}
    if not outcome.startswith("built "):
        with pytest.raises(ConfigError):
            resolve_deepspeed(raw, source="ds.json", run={}, run_provenance={}, world_size=1, hidden_size=64)
        return
    read = resolve_deepspeed(raw, source="ds.json", run={}, run_provenance={}, world_size=1, hidden_size=64)
    assert read.spec.optimizer_class is not None
    assert read.spec.optimizer_class.rsplit(".", 1)[-1] == outcome.removeprefix("built ")


@pytest.mark.parametrize("case", sorted(RECORDED["peaks"]))
def test_real_engine_peaks_with_the_sections_optimizer(case: str) -> None:
    """The tiny Llama's forward, backward and optimizer-step live-tensor peaks on the real engine (recorded) against
    the estimate: FusedAdam with --optim adamw_bnb_8bit given (before: the 8-bit states, -29.95 / -26.41 / +51.90 %),
    torch SGD with momentum (+35.67 / +30.66 / +44.38 %), torch Adagrad at ZeRO-1 (+15.13 / +12.45 / +29.94 %)."""
    from benchmarks.deepspeed_optimizer_cpu import estimates

    est = estimates(case)["after"]
    for real, got in zip(RECORDED["peaks"][case], est, strict=True):
        assert abs(got - real) <= 0.003 * real, (case, est, RECORDED["peaks"][case])
