"""The public API: `__all__` is exactly what is importable, and the core stays free of torch."""

from __future__ import annotations

import subprocess
import sys

import fitcheck


def test_all_names_resolve_and_are_documented() -> None:
    for name in fitcheck.__all__:
        obj = getattr(fitcheck, name)
        if callable(obj):
            assert obj.__doc__, f"{name} has no docstring"


def test_all_lists_the_public_names() -> None:
    public = {
        n for n in dir(fitcheck) if not n.startswith("_") and n not in {"annotations", "TYPE_CHECKING", "Any"}
    }
    public -= {
        "core",
        "errors",
        "findings",
        "report",
        "spec",
        "units",
        "readers",
        "families",
        "advice",
        "catalog",
        "render",
        "cli",
        "torch_adapters",
        "integrations",
    }
    assert public <= set(fitcheck.__all__)


def test_core_import_does_not_import_torch() -> None:
    code = (
        "import sys, fitcheck\n"
        "from fitcheck.core.estimator import estimate\n"
        "from fitcheck.readers.model_config import load_inventory\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_readmes_integrations_import_works() -> None:
    """Issue 21: README's ``from fitcheck.integrations import tune_micro_batch`` raised ImportError."""
    pytest = __import__("pytest")
    pytest.importorskip("torch")
    from fitcheck.integrations import FitcheckCallback, preflight, tune_micro_batch

    assert callable(tune_micro_batch) and callable(preflight) and isinstance(FitcheckCallback, type)
