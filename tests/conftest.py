"""Shared test setup: no test may reach the network."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# tiny_models.py holds shared assertions (formula vs trace): let pytest explain their failures in full
pytest.register_assert_rewrite("tiny_models")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# fitcheck's trace cache (fitcheck/torch_adapters/trace_cache.py) never writes to the real ~/.cache from tests or CI
_TRACE_CACHES = tempfile.mkdtemp(prefix="fitcheck-test-cache-")
os.environ["FITCHECK_CACHE_DIR"] = _TRACE_CACHES
atexit.register(shutil.rmtree, _TRACE_CACHES, True)


@pytest.fixture(autouse=True)
def _own_trace_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own empty trace cache (its subprocesses inherit it): what one test traced is never another
    test's cache hit (a test that makes a trace fail must see it fail)."""
    monkeypatch.setenv("FITCHECK_CACHE_DIR", tempfile.mkdtemp(dir=_TRACE_CACHES))


@pytest.fixture
def free_port() -> int:
    """A TCP port nothing listens on now, for a ``torch.distributed.run`` rendezvous (fixed ports clashed when two
    multi-process tests, or two suites, ran on one machine)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
