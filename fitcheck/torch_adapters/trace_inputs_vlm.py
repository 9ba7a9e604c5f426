"""Image inputs for a traced vision-language step (``--task image-text-to-text``), on fake or real tensors.

A Qwen2.5-VL training batch, as the processor builds it (transformers 5.23
``models/qwen2_5_vl/processing_qwen2_5_vl.py``; ``image_processing_qwen2_vl.py``), is:

* ``pixel_values``: float32 ``(patches, in_channels * temporal_patch_size * patch_size²)`` (1176 wide for
  Qwen2.5-VL), all images of the batch concatenated; ``image_grid_thw``: int64 ``(images, 3)`` = (t, h, w) in
  patches, h and w multiples of ``spatial_merge_size``;
* ``input_ids`` with ``t·h·w / spatial_merge_size²`` ``image_token_id`` placeholders per image
  (``replace_image_token``), between ``vision_start_token_id`` and ``vision_end_token_id``;
* ``mm_token_type_ids`` (``return_mm_token_type_ids = True``), from which ``Qwen2_5_VLModel.forward`` computes
  the 3-D rope positions with ``get_rope_index``.

The tracer feeds one image of ``--image_tokens`` patches per sample (grid ``(1, h, w)``, h·w = patches, as
square as the 2 × 2 merge allows) and the same placeholders, so the language model sees them inside
``--max_seq_length`` as in a real run.

What fake tensors cannot do, and how it is done instead (all on small integer metadata, never on activations):

* The vision tower's grid metadata is data-dependent (``transformers/vision_utils.py``: ``.tolist()``,
  boolean-mask indexing, ``unique_consecutive``). transformers lets callers precompute it ("can be precomputed
  before torch.compile / torch.export tracing"): ``get_vision_attention_seqlens``,
  ``get_vision_position_ids`` and ``get_vision_window_index`` are called here on real CPU tensors and passed as
  ``image_cu_seqlens`` / ``image_position_ids`` / ``image_window_index`` / ``image_cu_window_seqlens``
  (``utils/generic.py accepts_precomputed_kwargs`` strips the ``image_`` prefix for ``get_image_features``).
* The 3-D rope positions (``get_rope_index``: ``.tolist()`` over ``mm_token_type_ids``) are computed the same
  way on real tensors and passed as ``position_ids``: same (3, batch, seq) tensor as the model would build.
* The rest reads values inside the forward: the per-window ``cu_seqlens[1:] - cu_seqlens[:-1]`` ``.tolist()``
  of ``Qwen2_5_VLVisionAttention.forward`` (SDPA / eager path), ``image_grid_thw.prod(-1).tolist()`` of
  ``get_image_features`` and the placeholder count check of ``get_placeholder_mask``. Fake tensors made from
  real values by ``torch.tensor`` keep those values as a *constant* (``torch/_subclasses/fake_tensor.py``:
  the lift path and constant propagation), but only up to ``CONSTANT_NUMEL_LIMIT`` (1) elements:
  :func:`image_metadata_constants` raises that limit during the trace to the size of ``input_ids``, so the
  metadata tensors (grid, cumulative lengths, token ids) stay constants. Activations and parameters are
  never constants (they derive from fake parameters or random inputs), so nothing is computed for real
  beyond these integer tensors and the recorded bytes are unchanged.

Only Qwen2.5-VL is fed images; another vision-language family is refused (:func:`check_traceable`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from fitcheck.errors import ConfigError, UnsupportedModelError

TASK = "image-text-to-text"
# model_type -> the families whose image inputs this module builds
SUPPORTED = ("qwen2_5_vl",)


def check_traceable(config: Mapping[str, Any], image_tokens: int) -> None:
    """Refuse a vision-language trace this module cannot feed.

    Raises:
        UnsupportedModelError: A family other than Qwen2.5-VL given images.
        ConfigError: Patches that do not tile into ``spatial_merge_size``² blocks.
    """
    if image_tokens <= 0:
        return
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(
            f"tracing image inputs is implemented for {', '.join(SUPPORTED)} only, not {model_type!r}; "
            "estimate without --trace (the vision formula, not pinned)"
        )
    image_grid(config, image_tokens)


def _vision(config: Mapping[str, Any]) -> Mapping[str, Any]:
    vc = config.get("vision_config")
    return vc if isinstance(vc, Mapping) else {}


def image_grid(config: Mapping[str, Any], image_tokens: int) -> tuple[int, int]:
    """(h, w) in patches of one image of ``image_tokens`` patches: h·w = patches, both multiples of the merge
    size, h the largest such factor ≤ √patches (a square image when there is one).

    Raises:
        ConfigError: When ``image_tokens`` is not a multiple of ``spatial_merge_size``².
    """
    m = int(_vision(config).get("spatial_merge_size", 2))
    if image_tokens % (m * m):
        raise ConfigError(
            f"--image_tokens {image_tokens}: Qwen2.5-VL patches come in {m}x{m} blocks (spatial_merge_size {m}); "
            f"use a multiple of {m * m} (height/14 * width/14 with both sides multiples of {14 * m} pixels)"
        )
    blocks = image_tokens // (m * m)
    hb = max(d for d in range(1, math.isqrt(blocks) + 1) if blocks % d == 0)
    return hb * m, (blocks // hb) * m


@contextlib.contextmanager
def image_metadata_constants(task: str, numel: int) -> Iterator[None]:
    """Let fake tensors built from real integer metadata keep their values (see the module docstring).

    Args:
        task: The traced task; anything but ``image-text-to-text`` leaves fake tensors as they are.
        numel: The largest metadata tensor (the ``input_ids`` of the step, plus one element per row).
    """
    if task != TASK:
        yield
        return
    import torch._subclasses.fake_tensor as ft

    original = ft.CONSTANT_NUMEL_LIMIT
    ft.CONSTANT_NUMEL_LIMIT = max(original, numel)
    try:
        yield
    finally:
        ft.CONSTANT_NUMEL_LIMIT = original


def _inner_vlm(model: Any) -> Any:
    """The ``Qwen2_5_VLModel`` inside a (peft-wrapped) ``Qwen2_5_VLForConditionalGeneration``."""
    for module in model.modules():
        if hasattr(module, "get_rope_index") and hasattr(module, "visual"):
            return module
    raise UnsupportedModelError(f"{type(model).__name__}: no vision-language base model (get_rope_index) found")


def image_inputs(model: Any, ids: Any, image_tokens: int) -> tuple[Any, dict[str, Any]]:
    """Input ids with image placeholders and the image keyword arguments of one training step.

    Args:
        model: The built model (possibly peft-wrapped), inside the fake mode (or not, for a real step).
        ids: Random ``(batch, seq)`` input ids.
        image_tokens: Patches per sample (one image each); 0 = a text-only step.

    Returns:
        ``(input_ids, kwargs)``: the ids (placeholders written in) and ``pixel_values``, ``image_grid_thw``,
        ``position_ids`` and the precomputed ``image_*`` metadata for ``model(...)``.

    Raises:
        ConfigError: More image tokens than the sequence holds, or patches not in merge blocks.
    """
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers.vision_utils import (
        get_vision_attention_seqlens,
        get_vision_position_ids,
        get_vision_window_index,
    )

    if image_tokens <= 0:
        return ids, {}
    cfg = model.config
    check_traceable(cfg.to_dict(), image_tokens)
    vc = cfg.vision_config
    batch, seq = int(ids.shape[0]), int(ids.shape[1])
    h, w = image_grid(cfg.to_dict(), image_tokens)
    merged = image_tokens // (vc.spatial_merge_size**2)
    if merged + 2 > seq:
        raise ConfigError(
            f"--image_tokens {image_tokens}: {merged} image tokens (+2 vision start/end) do not fit in "
            f"--max_seq_length {seq}; the language model sees every image token inside the sequence"
        )
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    with unset_fake_temporarily():  # real integer metadata, as the processor and vision_utils compute it
        real_ids = torch.randint(0, int(cfg.get_text_config(decoder=True).vocab_size), (batch, seq))
        real_ids[:, 0] = cfg.vision_start_token_id
        real_ids[:, 1 : 1 + merged] = cfg.image_token_id
        real_ids[:, 1 + merged] = cfg.vision_end_token_id
        types = torch.zeros_like(real_ids, dtype=torch.int32)
        types[:, 1 : 1 + merged] = 1
        grid = torch.tensor([[1, h, w]] * batch)
        cu, _ = get_vision_attention_seqlens(grid, vc)
        vpos = get_vision_position_ids(grid, vc.spatial_merge_size)
        window_index, cu_window = get_vision_window_index(grid, vc.spatial_merge_size, vc.window_size, vc.patch_size)
        rope, _ = _inner_vlm(model).get_rope_index(real_ids, types, image_grid_thw=grid)

    def const(t: Any) -> Any:
        return torch.tensor(t.tolist(), dtype=t.dtype)  # a constant fake tensor under the fake mode

    extra = {
        "pixel_values": torch.randn(batch * image_tokens, width),  # float32, as the image processor returns
        "image_grid_thw": const(grid),
        "position_ids": const(rope),
        "image_cu_seqlens": const(cu),
        "image_cu_window_seqlens": const(cu_window),
        "image_position_ids": const(vpos),
        "image_window_index": const(window_index),
    }
    return const(real_ids), extra
