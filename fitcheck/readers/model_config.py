"""config.json -> :class:`~fitcheck.spec.ModelInventory`, offline.

``--model_name_or_path`` resolves in this order (the first that exists wins):

1. a directory containing ``config.json``;
2. a path to a ``config.json`` file;
3. a Hub id present in the local Hugging Face cache,
   ``<hub cache>/models--<org>--<name>/snapshots/<rev>/config.json``, where the hub cache is ``HF_HUB_CACHE``,
   else ``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``
   (huggingface_hub/constants.py); the snapshot ``refs/main`` names wins, else the newest;
4. the built-in catalog (:mod:`fitcheck.catalog.models`), matched case-insensitively.

Known families are counted in pure Python (:mod:`fitcheck.families`) without importing torch; any
other architecture is built on the meta device by a builder the caller passes in (``meta_fallback``:
:func:`fitcheck.torch_adapters.meta_device.meta_inventory`). Remote code is never run. The environment
comes in as an explicit mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from fitcheck.catalog import find_catalog_config
from fitcheck.errors import ConfigError, UnsupportedModelError, short_repr
from fitcheck.families import family_inventory, supported_families
from fitcheck.readers.sources import read_text_file, safe_json_load
from fitcheck.readers.task_heads import (
    CLASSIFIER_TASKS,
    classifier_inventory,
    pure_task_supported,
    resolve_num_labels,
    resolve_task,
    task_config,
    with_task,
)
from fitcheck.spec import ModelInventory, ModelShape, ParamEntry

_PASS_CONFIG_HINT = (
    "Pass a local config.json instead: --model_name_or_path /path/to/model_dir (a directory containing "
    "config.json) or --model_name_or_path /path/to/config.json (copy it from the model's Hub page, "
    "'Files and versions' tab). No network is used."
)


def _expand_user(path: str, env: Mapping[str, str]) -> Path:
    """Expand a leading ``~`` with ``HOME`` from ``env`` (left as is when ``env`` has no home)."""
    home = env.get("HOME") or env.get("USERPROFILE")
    if home and (path == "~" or path.startswith("~/")):
        path = home + path[1:]
    return Path(path)


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache directory, as huggingface_hub resolves it (constants.py).

    Args:
        env: Environment variables (``HF_HUB_CACHE``, ``HF_HOME``, ``XDG_CACHE_HOME``, ``HOME``).
    """
    if env.get("HF_HUB_CACHE"):
        return _expand_user(env["HF_HUB_CACHE"], env)
    if env.get("HF_HOME"):
        return _expand_user(env["HF_HOME"], env) / "hub"
    return _expand_user(env.get("XDG_CACHE_HOME") or "~/.cache", env) / "huggingface" / "hub"


def find_cached_config(model_id: str, env: Mapping[str, str]) -> Path | None:
    """``config.json`` of a Hub id in the local HF cache (newest snapshot), or None."""
    parts = model_id.strip().strip("/").split("/")
    if len(parts) > 2 or not all(parts):
        return None
    repo = hf_hub_cache(env) / ("models--" + "--".join(parts))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    # refs/main names the snapshot huggingface_hub would load; else the newest one.
    ref = repo / "refs" / "main"
    if ref.is_file():
        main = snapshots / ref.read_text(encoding="utf-8").strip() / "config.json"
        if main.is_file():
            return main
    candidates = [p for p in snapshots.glob("*/config.json") if p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def read_config_file(path: Path) -> dict[str, object]:
    """Parse a config.json.

    Raises:
        ConfigError: The file cannot be read or is not a JSON object with a ``model_type``.
    """
    text = read_text_file(path, what="model config")
    data = safe_json_load(text, source=str(path), what="model config (pass the model's config.json)")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a JSON object (a model's config.json), got {type(data).__name__}"
        )
    if not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise ConfigError(
            f"{path}: key 'model_type' is missing; this does not look like a transformers config.json "
            "(adapter_config.json and tokenizer files are not model configs)"
        )
    return data


def resolve_config(model_name_or_path: str, env: Mapping[str, str]) -> tuple[dict[str, object], str, str]:
    """Find the config for a model argument, in the documented order.

    Returns:
        ``(config, source, where)``: the parsed config, a provenance note and the file it came from (empty
        for the catalog).

    Raises:
        ConfigError: A local config.json is malformed.
        UnsupportedModelError: Nothing matches.
    """
    text = model_name_or_path.strip()
    if not text:
        raise UnsupportedModelError("--model_name_or_path is empty. " + _PASS_CONFIG_HINT)
    path = _expand_user(text, env)
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise UnsupportedModelError(f"{path} is a directory without a config.json. " + _PASS_CONFIG_HINT)
        return read_config_file(config_path), f"local directory {path}", str(config_path)
    if path.is_file():
        return read_config_file(path), f"local file {path}", str(path)
    cached = find_cached_config(text, env)
    if cached is not None:
        return read_config_file(cached), f"Hugging Face cache {cached}", str(cached)
    found = find_catalog_config(text)
    if found is not None:
        config, source = found
        return config, source, ""
    from fitcheck.catalog import similar_catalog_ids

    close = similar_catalog_ids(text)
    mean = f" Did you mean {' or '.join(close)}?" if close else ""
    raise UnsupportedModelError(
        f"model {short_repr(text)} was not found.{mean} It is not a local directory or file, not in the "
        "Hugging Face cache "
        f"({hf_hub_cache(env)}) and not in fitcheck's built-in catalog "
        "(`fitcheck.catalog.models.catalog_ids()` lists it). " + _PASS_CONFIG_HINT
    )


def _inventory(
    config: Mapping[str, object], model_id: str, source: str, family: tuple[list[ParamEntry], ModelShape]
) -> ModelInventory:
    params, shape = family
    quant = config.get("quantization_config")
    return ModelInventory(
        model_id=model_id,
        shape=shape,
        params=tuple(params),
        source=source,
        counted_by="pure-python",
        quantization_config=quant if isinstance(quant, Mapping) else None,
        config=dict(config),
    )


def inventory_from_config(config: Mapping[str, object], model_id: str, source: str) -> ModelInventory:
    """Pure-Python inventory of a config of a known family (no torch import).

    Args:
        config: The parsed config.json.
        model_id: What the user asked for.
        source: Where the config came from.

    Raises:
        UnsupportedModelError: The family has no pure-Python inventory (use the meta path).
        ConfigError: A key has a value of the wrong type or a required key is missing.
    """
    family = family_inventory(config)
    if family is None:
        raise UnsupportedModelError(
            f"{model_id}: model_type {config.get('model_type')!r} has no pure-Python inventory "
            f"(known: {', '.join(supported_families())}); it needs torch + transformers (meta device)"
        )
    return _inventory(config, model_id, source, family)


# Keys of config.json that are sizes of the model (transformers' config classes and the GPT-2/Falcon/BLOOM
# spellings): a value must be a positive integer, or transformers builds no model (torch.empty refuses a
# negative size; a zero head count divides by zero in the attention classes).
_DIMENSION_KEYS = (
    "hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers", "num_attention_heads",
    "n_head", "num_key_value_heads", "intermediate_size", "vocab_size", "moe_intermediate_size",
)
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# The most layers fitcheck reads. The deepest published decoders have about 126 (Llama-3.1-405B: 126,
# catalog/models); the estimate does per-layer work, so 10^6 layers would take minutes for no real model.
MAX_LAYERS = 10_000


def check_dimensions(config: Mapping[str, object], label: str) -> None:
    """Refuse a config.json whose sizes no model can have (zero or negative, or more than MAX_LAYERS layers),
    in the top level and in ``text_config`` / ``vision_config``.

    Raises:
        ConfigError: Naming the file, the key and the value.
    """
    for section in ("", "text_config", "vision_config"):
        cfg = config.get(section) if section else config
        if not isinstance(cfg, Mapping):
            continue
        for key in _DIMENSION_KEYS:
            value = cfg.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # absent, null or a wrong type (the family reader names the wrong type)
            name = f"{section}.{key}" if section else key
            if value <= 0:
                raise ConfigError(f"{label}: key {name!r} must be a positive integer, got {value!r}; "
                                  "copy the model's config.json from its Hub repo")
            if key in _LAYER_KEYS and value > MAX_LAYERS:
                raise ConfigError(f"{label}: key {name!r} is {value:,}: more than {MAX_LAYERS:,} layers is no "
                                  "published model; check the value")


class MetaFallback(Protocol):
    """Builds an inventory of an architecture with no pure-Python family: ``(config, model_id, source, task)``.

    The meta-device builder lives above the readers (``fitcheck.torch_adapters.meta_device.meta_inventory``);
    callers on higher floors pass it in, so this reader never imports torch or an upper floor. ``task`` is the
    transformers task class to build (``seq-cls``, ``token-cls``, ``image-text-to-text``; None: causal/MLM)."""

    def __call__(
        self, config: Mapping[str, object], model_id: str, source: str, task: str | None = None, /
    ) -> ModelInventory:
        """Build the inventory."""


def load_inventory(
    model_name_or_path: str,
    *,
    env: Mapping[str, str],
    meta_fallback: MetaFallback | None = None,
    task: str | None = None,
    num_labels: int | None = None,
) -> ModelInventory:
    """Resolve a model argument offline and inventory its parameters.

    Args:
        model_name_or_path: A directory with config.json, a config.json path, a Hub id in the local HF cache,
            or a Hub id of the built-in catalog (case-insensitive).
        env: Environment variables (for the HF cache location and ``~``).
        meta_fallback: Builds unknown architectures (the meta-device inventory, which imports torch and
            transformers); None: such architectures raise :class:`UnsupportedModelError`.
        task: ``--task`` (None: what config.json ``architectures`` names; :mod:`fitcheck.readers.task_heads`).
        num_labels: ``--num_labels`` for a classifier task (None: the config's ``id2label``, else 2).

    Returns:
        The inventory, with ``source`` saying where the config came from and ``counted_by`` how.

    Raises:
        ConfigError: The config.json is malformed (the message names the file and key).
        UnsupportedModelError: The model cannot be found, or its architecture cannot be inventoried.
    """
    config, source, where = resolve_config(model_name_or_path, env)
    label = where or source
    resolved = resolve_task(config, task)
    labels = resolve_num_labels(config, num_labels) if resolved in CLASSIFIER_TASKS else 0
    config = task_config(config, resolved, labels)
    model_type = config.get("model_type")
    check_dimensions(config, label)
    pure = resolved in ("causal-lm", "masked-lm") or pure_task_supported(str(model_type), resolved)
    try:
        family = family_inventory(config) if pure else None
    except ConfigError as exc:
        raise ConfigError.collect([f"{label}: {p}" for p in exc.problems]) from None
    except ValueError as exc:  # a shape the spec refuses (spec/model.py ModelShape, ParamEntry)
        raise ConfigError(f"{label}: {exc}; this config.json describes no model transformers can build") from None
    if family is not None:
        inv = _inventory(config, model_name_or_path, source, family)
        return classifier_inventory(inv, resolved, labels) if resolved in CLASSIFIER_TASKS else inv
    if meta_fallback is None:
        raise UnsupportedModelError(
            f"{label}: model_type {model_type!r} has no pure-Python inventory "
            f"(known: {', '.join(supported_families())}) and the meta-device path is disabled"
        )
    try:
        meta_task = None if resolved in ("causal-lm", "masked-lm") else resolved
        return with_task(meta_fallback(config, model_name_or_path, source, meta_task), resolved, labels)
    except ImportError as exc:
        raise UnsupportedModelError(
            f"{label}: model_type {model_type!r} needs torch and transformers to be counted "
            f"(pip install 'fitcheck[hf]'): {exc}"
        ) from exc
