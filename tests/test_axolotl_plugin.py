"""The axolotl plugin (``integrations/axolotl_plugin.py``) against axolotl's ``BasePlugin`` interface from source.

axolotl does not install with fitcheck's pinned stack (axolotl 0.19.0 pins transformers==5.16.1, peft==0.20.0,
accelerate==1.13.0, trl==1.9.0; ``pip install --dry-run -c .ci/constraints.txt axolotl`` backtracks without a
solution), so no real axolotl run is possible here. The interface is read from the source instead:
``tests/fixtures/axolotl/base_plugin_interface.json`` lists every ``BasePlugin`` method's parameters at commit
067b021c (read with ``ast`` from ``src/axolotl/integrations/base.py``); the hooks the plugin implements must
take exactly those, and the hooks are run the way axolotl's ``PluginManager`` calls them (keyword arguments
``cfg=``/``model=``, a ``DictDefault``-like config carrying ``axolotl_config_path``).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from fitcheck.integrations.axolotl_plugin import FitcheckPlugin, axolotl_preflight
from fitcheck.integrations.trainer import DoesNotFitError, FitcheckCallback

FIXTURES = Path(__file__).parent / "fixtures" / "axolotl"
INTERFACE = json.loads((FIXTURES / "base_plugin_interface.json").read_text())["methods"]


class DictDefault(dict[str, Any]):
    """axolotl utils/dict.py DictDefault: a dict whose missing keys read as None, also as attributes."""

    def __missing__(self, key: str) -> None:
        return None

    def __getattr__(self, key: str) -> Any:
        return self[key]


def _cfg(name: str, **extra: Any) -> DictDefault:
    return DictDefault({"axolotl_config_path": str(FIXTURES / "examples" / name), "world_size": 1, **extra})


@pytest.mark.parametrize("method", ["__init__", "register", "get_input_args", "pre_model_load",
                                    "add_callbacks_pre_trainer"])
def test_hooks_take_base_plugin_parameters(method: str) -> None:
    params = list(inspect.signature(getattr(FitcheckPlugin, method)).parameters)
    assert params == INTERFACE[method]


def test_plugin_line_is_not_an_unknown_plugin() -> None:
    from fitcheck.readers.axolotl import FITCHECK_PLUGIN

    module, name = FITCHECK_PLUGIN.rsplit(".", 1)  # axolotl load_plugin: rsplit(".", 1), import, instantiate
    assert module == FitcheckPlugin.__module__ and name == FitcheckPlugin.__name__


def test_input_args_name_an_importable_pydantic_model() -> None:
    pytest.importorskip("pydantic")
    import importlib

    module, name = FitcheckPlugin().get_input_args().rsplit(".", 1)
    model = getattr(importlib.import_module(module), name)
    assert set(model.model_fields) >= {"fitcheck_stop_if_not_fits", "fitcheck_gpu", "fitcheck_gpu_memory"}


def test_pre_model_load_reports_and_stops_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = FitcheckPlugin()
    plugin.pre_model_load(cfg=_cfg("mistral/qlora.yml", fitcheck_gpu_memory="4GiB"))  # does not fit: warns
    assert plugin.report is not None and not plugin.report.fits
    assert plugin.report.spec.batch.micro_batch == 2 and plugin.report.spec.quant is not None
    with pytest.raises(DoesNotFitError):
        plugin.pre_model_load(cfg=_cfg("mistral/qlora.yml", fitcheck_gpu_memory="4GiB", fitcheck_stop_if_not_fits=True))
    plugin.pre_model_load(cfg=_cfg("mistral/qlora.yml", fitcheck_gpu="H100-80GB", fitcheck_stop_if_not_fits=True))
    assert plugin.report.fits
    assert "FITS" in capsys.readouterr().out


def test_preflight_counts_world_size_and_the_zero3_file() -> None:
    report = axolotl_preflight(_cfg("gpt-oss/gpt-oss-20b-fft-deepspeed-zero3.yaml", world_size=8), env={})
    assert report.spec.sharding.num_processes == 8 and report.spec.sharding.zero_stage == 3


def test_preflight_reads_the_rl_trainer() -> None:
    from fitcheck.spec import TrainerKind

    report = axolotl_preflight(_cfg("llama-3/qlora-1b-kto.yaml"), env={})
    assert report.spec.trainer.kind is TrainerKind.KTO and report.spec.batch.seq_len == 2048


def test_refused_config_warns_or_stops(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = FitcheckPlugin()
    # gpt-oss with Hub kernels (use_kernels) stays refused (qwen3/32b-qlora's gradient_checkpointing: offload is
    # modelled now, as axolotl rewrites it)
    plugin.pre_model_load(cfg=_cfg("gpt-oss/gpt-oss-20b-sft-lora-singlegpu.yaml"))
    assert plugin.report is None and "use_kernels: not modelled" in capsys.readouterr().err
    with pytest.raises(Exception, match="use_kernels"):
        plugin.pre_model_load(cfg=_cfg("gpt-oss/gpt-oss-20b-sft-lora-singlegpu.yaml", fitcheck_stop_if_not_fits=True))


def test_add_callbacks_pre_trainer_gives_the_callback() -> None:
    callbacks = FitcheckPlugin().add_callbacks_pre_trainer(cfg=_cfg("llama-3/lora-1b.yml", fitcheck_gpu="A100-80GB"),
                                                           model=None)
    assert len(callbacks) == 1 and isinstance(callbacks[0], FitcheckCallback) and callbacks[0].gpu == "A100-80GB"


def test_subclasses_axolotls_base_plugin_when_installed() -> None:
    base = pytest.importorskip("axolotl.integrations.base")
    assert issubclass(FitcheckPlugin, base.BasePlugin)
