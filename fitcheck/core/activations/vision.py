"""Vision-language models (``image-text-to-text``): the vision tower's activations per image.

A VLM step runs the vision tower on the image patches (``--image_tokens`` patches per sample, before the
merger/projector), projects them to ``image_tokens / spatial_merge_size²`` language-model tokens that replace
placeholder tokens inside the text sequence (so ``--max_seq_length`` already counts them), then runs the
language model. transformers 5.23 ``models/qwen2_5_vl/modeling_qwen2_5_vl.py``: ``Qwen2_5_VisionTransformer``
(``depth`` ``Qwen2_5_VLVisionBlock``\\ s: RMSNorm, fused ``qkv``, ``proj``, gated ``gate_proj/up_proj/down_proj``
MLP), ``Qwen2_5_VLPatchMerger`` (the projector: ``mlp.0`` / ``mlp.2``); both are ``GradientCheckpointingLayer``-
checkpointed with the language model (``_no_split_modules``: decoder layer and vision block).

What the vision tower keeps for backward depends on whether anything in it trains:

* frozen tower (LoRA on the language model only, e.g. ``target_modules`` naming text-only modules): no input
  needs a gradient and no weight is trained, so autograd saves nothing in it; only its output survives, as
  part of the text sequence.
* trained tower (full fine-tuning, or LoRA ``all-linear``: peft 0.21.2 ``tuners_utils.py
  _maybe_include_all_linear_layers`` excludes only the output embedding, so the vision blocks' ``qkv`` /
  ``proj`` / MLP and the merger's linears get adapters): every block saves its activations like a decoder
  layer at the vision width, or only its input when checkpointed.

The per-block bytes reuse the decoder recipe at the vision widths (``hidden_size``, ``intermediate_size``,
``num_heads`` of ``vision_config``, MHA, gated MLP): not pinned to a trace of the vision tower, and the finding
says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import ModelShape, TrainingSpec

SOURCE = "transformers 5.23 models/qwen2_5_vl/modeling_qwen2_5_vl.py (vision blocks, patch merger); " \
    "decoder recipe at vision widths (core/activations/decoder.py), not pinned to a trace"


def _vision_config(spec: TrainingSpec) -> Mapping[str, object] | None:
    vc = spec.model.config.get("vision_config")
    return vc if isinstance(vc, Mapping) else None


def _int(vc: Mapping[str, object], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = vc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def vision_trained(spec: TrainingSpec) -> bool:
    """Whether any vision-tower or projector parameter trains (full fine-tune, or adapters on it)."""
    if spec.lora is None and spec.quant is None and spec.freeze is None:
        return True
    if spec.lora is None:
        return False
    from fitcheck.core.states import plan_lora

    plan = plan_lora(spec)
    return any("visual" in t.entry.name or "vision" in t.entry.name for t in plan.targets) or any(
        "visual" in s.entry.name or "vision" in s.entry.name for s in plan.saved
    )


def vision_components(
    spec: TrainingSpec, per_token: Callable[[TrainingSpec], tuple[int, int]]
) -> tuple[Component, ...]:
    """``activations.vision``: what the vision tower keeps for backward, for ``image_tokens`` per sample.

    Args:
        spec: A spec whose task is ``image-text-to-text``.
        per_token: The decoder recipe ``(bytes per token per layer, s² term)`` (``layer_saved_per_token``).
    """
    sh = spec.model.shape
    vc = _vision_config(spec)
    if sh.task != "image-text-to-text" or sh.image_tokens <= 0 or vc is None:
        return ()
    hidden = _int(vc, "hidden_size", "embed_dim", default=sh.hidden_size)
    heads = _int(vc, "num_heads", "num_attention_heads", default=1)
    depth = _int(vc, "depth", "num_hidden_layers", default=1)
    inter = _int(vc, "intermediate_size", default=4 * hidden)
    tokens = sh.image_tokens * spec.batch.micro_batch
    if not vision_trained(spec):
        kept = 0
        detail = f"frozen vision tower: nothing saved ({tokens} patches)"
    else:
        vision_shape = ModelShape(
            family="qwen2", architecture="vision", hidden_size=hidden, num_layers=depth, num_heads=heads,
            num_kv_heads=heads, head_dim=max(hidden // heads, 1), intermediate_size=inter, vocab_size=1,
        )
        sub = dataclasses.replace(spec, model=dataclasses.replace(spec.model, shape=vision_shape))
        layer, _ = per_token(sub)
        act = spec.activations
        e = 2 if spec.precision.load_dtype.is_half or spec.precision.mixed_precision.value != "no" else 4
        if act.checkpointing:
            n_ckpt = math.ceil(depth / max(1, act.checkpoint_every_n_layers))
            kept = ((depth - n_ckpt) * layer + n_ckpt * e * hidden) * tokens
        else:
            kept = depth * layer * tokens
        detail = f"{layer} B/patch/block x {tokens} patches x {depth} blocks" + (" (checkpointed)" if
                                                                               act.checkpointing else "")
    return (
        Component(
            "activations.vision",
            Category.ACTIVATIONS,
            Location.DEVICE,
            {Phase.FORWARD_END: kept, Phase.BACKWARD_START: kept},
            SOURCE,
            detail,
        ),
    )


def vision_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """Say how the vision tower is counted (and that ``--image_tokens`` is needed for it)."""
    sh = spec.model.shape
    if sh.task != "image-text-to-text":
        return ()
    if sh.image_tokens <= 0:
        return (
            Finding(
                "vision-tokens-not-given",
                Severity.WARNING,
                "a vision-language model without --image_tokens: the vision tower's activations are not counted "
                "(its parameters are)",
                "pass --image_tokens N: vision patches per sample before the merger (Qwen2.5-VL: "
                "(height/14)·(width/14) per image; the language model sees N/4 of them inside --max_seq_length)",
            ),
        )
    trained = vision_trained(spec)
    return (
        Finding(
            "vision-tower-counted",
            Severity.INFO,
            f"vision tower {'trained (adapters or full fine-tuning reach it)' if trained else 'frozen'}: "
            f"{sh.image_tokens} patches per sample; its activations use the decoder recipe at the vision widths, "
            "not pinned to a trace",
            "peft all-linear puts LoRA on the vision blocks and the merger too; name text-only modules (or a "
            "target regex on language_model) to keep the tower frozen" if trained else "",
        ),
    )
