"""The ``fitcheck`` console script's exit (:func:`fitcheck.cli.main.console`): after a run that imported torch it
skips the interpreter's teardown, but the report, the exit code and the atexit handlers are what ``main`` gives."""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import atexit, sys
{pre}
atexit.register(lambda: print("ATEXIT-RAN", file=sys.stderr))
from fitcheck.cli.main import console
sys.argv = ["fitcheck", *sys.argv[1:]]
console()
"""


def _run(pre: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CHILD.format(pre=pre), *argv], capture_output=True, text=True,
                          timeout=120, check=False)


def test_console_after_torch_keeps_stdout_exit_code_and_atexit_handlers() -> None:
    plain = _run("", "models")
    with_torch = _run("import torch", "models")
    assert plain.returncode == with_torch.returncode == 0
    assert with_torch.stdout == plain.stdout and len(plain.stdout) > 1000  # the whole table, flushed
    assert "ATEXIT-RAN" in plain.stderr and "ATEXIT-RAN" in with_torch.stderr
    bad = _run("import torch", "estimate", "--model_name_or_path", "no/such-model-anywhere", "--no_trace")
    assert bad.returncode == 2 and "fitcheck: error" in bad.stderr and "ATEXIT-RAN" in bad.stderr
