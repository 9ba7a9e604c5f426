"""The built-in catalog of popular model configs, keyed by their official Hugging Face Hub ids.

Each ``models/<org>/<name>/config.json`` is the Hub repo's config.json as data (copied verbatim from the
project's shared catalog); ``source.txt`` beside it records whether the file is VERBATIM or RECONSTRUCTED and
where every value came from. Data is read with :mod:`importlib.resources`, so it works from a wheel. Pure:
no torch, no network, no env reads.

Ids match case-insensitively. A few legacy names that users still paste resolve through :data:`ALIASES`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

# Legacy / renamed ids -> official catalog id. The Hub redirects each of these to the official repo.
ALIASES: dict[str, str] = {
    # GPT-2 was published without an org; the Hub moved it to openai-community/ (2024) and redirects.
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    # BERT likewise moved from org-less ids to google-bert/ (2024).
    "bert-base-uncased": "google-bert/bert-base-uncased",
    "bert-large-uncased": "google-bert/bert-large-uncased",
    # Llama 3.1 repos were renamed from "Meta-Llama-3.1-*" to "Llama-3.1-*" (Sept. 2024); old ids redirect.
    "meta-llama/meta-llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "meta-llama/meta-llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "meta-llama/meta-llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    # Only ids that existed on the Hub are listed: a bare "falcon-7b" or "Mistral-7B-v0.1" never did and is
    # not guessed (it may be a local directory name).
}


def _models_root() -> Traversable:
    return resources.files("fitcheck.catalog").joinpath("models")


@lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    """Lower-cased id -> official id for every catalog entry."""
    out: dict[str, str] = {}
    for org in _models_root().iterdir():
        if not org.is_dir():
            continue
        for name in org.iterdir():
            if name.is_dir() and name.joinpath("config.json").is_file():
                model_id = f"{org.name}/{name.name}"
                out[model_id.lower()] = model_id
    return out


def catalog_ids() -> list[str]:
    """Official Hub ids of every catalog entry, sorted case-insensitively."""
    return sorted(_index().values(), key=str.lower)


def resolve_catalog_id(model_id: str) -> str | None:
    """The official catalog id for ``model_id`` (case-insensitive, legacy aliases applied), or None."""
    key = model_id.strip().strip("/").lower()
    key = ALIASES.get(key, key).lower()
    return _index().get(key)


def catalog_source_text(model_id: str) -> str:
    """The full provenance note (source.txt) of a catalog entry.

    Raises:
        KeyError: If the id is not in the catalog.
    """
    official = resolve_catalog_id(model_id)
    if official is None:
        raise KeyError(model_id)
    org, name = official.split("/", 1)
    return _models_root().joinpath(org, name, "source.txt").read_text(encoding="utf-8")


def _one_line_source(official: str, text: str) -> str:
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    status = fields.get("status", "unknown status")
    where = fields.get("Where the file came from", "")
    return (
        f"built-in catalog {official} ({status}; {where})"
        if where
        else f"built-in catalog {official} ({status})"
    )


def find_catalog_config(model_id: str) -> tuple[dict[str, Any], str] | None:
    """Look a model up in the built-in catalog.

    Args:
        model_id: A Hub id such as ``"meta-llama/Meta-Llama-3-8B"`` (any case) or a legacy alias
            (``"gpt2"``, ``"bert-base-uncased"``, ``"meta-llama/Meta-Llama-3.1-8B"``).

    Returns:
        ``(config, source)`` where ``config`` is a fresh copy of the config.json mapping and ``source`` is a
        one-line provenance note, or None if the model is not in the catalog.
    """
    official = resolve_catalog_id(model_id)
    if official is None:
        return None
    org, name = official.split("/", 1)
    folder = _models_root().joinpath(org, name)
    config = json.loads(folder.joinpath("config.json").read_text(encoding="utf-8"))
    source = _one_line_source(official, folder.joinpath("source.txt").read_text(encoding="utf-8"))
    return config, source


def similar_catalog_ids(text: str, n: int = 3) -> list[str]:
    """Catalog ids close to ``text`` (a mistyped id), best first (``difflib`` ratios, case-insensitive; the part
    after the organisation is compared too, so ``llama-3.2-1b`` finds ``meta-llama/Llama-3.2-1B``)."""
    import difflib

    key = text.strip().lower()[:200]
    short = key.split("/")[-1]

    def score(model_id: str) -> float:
        low = model_id.lower()
        return max(difflib.SequenceMatcher(None, key, low).ratio(),
                   difflib.SequenceMatcher(None, short, low.split("/")[-1]).ratio())

    scored = sorted(((score(i), i) for i in catalog_ids()), key=lambda p: (-p[0], p[1]))
    return [i for s, i in scored if s >= 0.6][:n]
