"""Shared test setup: no test may reach the network."""

from __future__ import annotations

import os

import pytest

# tiny_models.py holds shared assertions (formula vs trace): let pytest explain their failures in full
pytest.register_assert_rewrite("tiny_models")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
