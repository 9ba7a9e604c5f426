"""Shared test setup: no test may reach the network."""

from __future__ import annotations

import os

import pytest

# tiny_models.py holds shared assertions (formula vs trace): let pytest explain their failures in full
pytest.register_assert_rewrite("tiny_models")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def free_port() -> int:
    """A TCP port nothing listens on now, for a ``torch.distributed.run`` rendezvous (fixed ports clashed when two
    multi-process tests, or two suites, ran on one machine)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
