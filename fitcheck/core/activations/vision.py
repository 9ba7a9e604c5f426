"""Vision-language models (``image-text-to-text``): the vision tower's activations per image.

A VLM step runs the vision tower on the image patches (``--image_tokens`` patches per sample, before the
merger/projector), projects them to ``image_tokens / spatial_merge_size²`` language-model tokens that replace
placeholder tokens inside the text sequence (so ``--max_seq_length`` already counts them), then runs the
language model. Source: transformers 5.23 ``models/qwen2_5_vl/modeling_qwen2_5_vl.py`` (line numbers below):
``Qwen2_5_VisionPatchEmbed`` (l.93, a bias-free ``Conv3d``), ``Qwen2_5_VLVisionBlock`` (l.337: RMSNorm, fused
``qkv``, fp32 rotary, SDPA per attention window or over the whole image, ``proj``, RMSNorm, gated MLP with
biases), ``Qwen2_5_VLPatchMerger`` (l.180: RMSNorm ``ln_q``, ``mlp.0`` / GELU / ``mlp.2``). The blocks are
``GradientCheckpointingLayer``\\ s (checkpointed with the decoder layers, counted first by
``modeling_utils.py _set_gradient_checkpointing``); the patch embedding and the merger are not.

Autograd saves a tensor only where a gradient flows (torch ``tools/autograd/gen_variable_type.py``:
``should_compute_output``), so what the tower keeps depends on what trains and on whether its input needs a
gradient:

* trained tower (full fine-tuning): every block keeps what its weight and input gradients need;
* LoRA ``all-linear`` (peft 0.21.2 ``tuners_utils.py _maybe_include_all_linear_layers`` excludes only the
  output embedding: ``qkv``, ``proj``, the MLP and the merger's ``mlp.0`` / ``mlp.2`` get adapters): frozen
  bases, fp32 adapter input copies (peft ``lora/layer.py Linear.forward``: ``_cast_input_dtype`` to the fp32
  adapter dtype), the input gradient path;
* frozen tower (adapters only on language-model modules): nothing needs a gradient, nothing is kept; but with
  gradient checkpointing transformers calls ``enable_input_require_grads`` (``modeling_utils.py
  _activation_checkpointing_enable``, ``main_input_name == "input_ids"``), which hooks every
  ``PreTrainedModel``'s input embeddings, the vision tower's ``patch_embed`` included: its output then needs a
  gradient and every checkpointed block keeps its input, the merger its input-gradient tensors.

Bytes per patch were derived from the source line by line and checked against a fake-tensor trace fed images
(``fitcheck.torch_adapters.trace_inputs_vlm``, ``benchmarks/vision_vs_trace.py``: Qwen2.5-VL-7B widths, full
depth, bf16, SDPA).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fitcheck.findings import Finding, Severity
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import Role, TrainingSpec

if TYPE_CHECKING:
    from fitcheck.core.activations.backward import BackwardInputs

SOURCE = "transformers 5.23 models/qwen2_5_vl/modeling_qwen2_5_vl.py (patch embed, vision blocks, patch merger), " \
    "checked against a fake-tensor trace fed images (benchmarks/vision_vs_trace.py)"
# peft 0.21.2 lora/layer.py: adapters are created in fp32 (autocast_adapter_dtype=True) and Linear.forward casts
# the input to the adapter dtype (_cast_input_dtype): lora_A keeps an fp32 copy of its input, lora_B the fp32
# lora_A output
ADAPTER_BYTES = 4
_BLOCK_LINEARS = ("qkv", "proj", "gate_proj", "up_proj", "down_proj")
_MERGER_LINEARS = ("mlp.0", "mlp.2")


@dataclass(frozen=True)
class VisionWidths:
    """The vision tower's widths (``vision_config``).

    Attributes:
        hidden: Block width D (``hidden_size``).
        heads: Attention heads H (``num_heads``).
        inter: MLP width I (``intermediate_size``).
        depth: Blocks (``depth``).
        patch_in: Values per patch: ``in_channels · temporal_patch_size · patch_size²`` (1176).
    """

    hidden: int
    heads: int
    inter: int
    depth: int
    patch_in: int

    @property
    def head_dim(self) -> int:
        """Per-head width (the rotary tables' width)."""
        return max(self.hidden // max(self.heads, 1), 1)


def vision_widths(spec: TrainingSpec) -> VisionWidths | None:
    """The tower's widths from the ``vision`` traits (``Qwen2_5_VLVisionConfig`` defaults for absent keys)."""
    vc = spec.model.shape.traits.vision
    if vc is None:
        return None
    return VisionWidths(hidden=vc.hidden, heads=vc.heads, inter=vc.intermediate, depth=vc.depth, patch_in=vc.patch_in)


def _is_vision(name: str) -> bool:
    return "visual" in name or "vision" in name


def _vision_adapters(spec: TrainingSpec) -> frozenset[str]:
    """Short names (``qkv``, ``mlp.0``, ...) of the vision-tower linears that carry LoRA adapters."""
    if spec.lora is None:
        return frozenset()
    from fitcheck.core.states import plan_lora

    out: set[str] = set()
    for t in plan_lora(spec).targets:
        name = t.entry.name.rsplit(".", 1)[0]
        if _is_vision(name):
            out.update(m for m in (*_BLOCK_LINEARS, *_MERGER_LINEARS) if name.endswith("." + m))
    return frozenset(out)


def vision_trained(spec: TrainingSpec) -> bool:
    """Whether any vision-tower or projector parameter trains (full fine-tune, adapters on it, or unfrozen)."""
    if spec.lora is None and spec.quant is None and spec.freeze is None:
        return True
    if spec.lora is None:
        if spec.freeze is None:
            return False
        patterns = spec.freeze.trainable
        return any(_is_vision(p.name) and any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)
                   for p in spec.model.params)
    from fitcheck.core.states import plan_lora

    plan = plan_lora(spec)
    return any(_is_vision(t.entry.name) for t in plan.targets) or any(_is_vision(s.entry.name) for s in plan.saved)


def _full(spec: TrainingSpec) -> bool:
    """The tower trains in full (no adapters: full fine-tuning, or a partial freeze that leaves it trainable)."""
    return spec.lora is None and vision_trained(spec)


def block_saved_per_patch(w: VisionWidths, e: int, full: bool, adapters: frozenset[str], r: int) -> int:
    """Bytes per patch one (not checkpointed) vision block keeps when a gradient flows through it.

    Args:
        w: Tower widths.
        e: Activation element bytes (2 for a bf16/fp16 model, 4 for fp32).
        full: The block's weights train.
        adapters: Its LoRA-adapted linears (``qkv``, ``proj``, ``gate_proj``, ``up_proj``, ``down_proj``).
        r: LoRA rank.
    """
    d, i, a = w.hidden, w.inter, ADAPTER_BYTES
    # RMSNorm (l.68-73): the fp32 copy kept by pow/mul (4D; for an fp32 model the input itself), the rsqrt (4);
    # a trained weight also keeps the normalised 16-bit value (eD) and the linear its output (eD)
    norm = 4 * d + 4 + (2 * e * d if full else 0)
    total = 2 * norm
    # qkv output (l.286): v is a view of it and SDPA keeps v, so the whole 3D output stays (3eD); rotary
    # (l.203-214: fp32 math, the mul keeps only cos/sin) cast back: q, k (2eD) kept by SDPA; SDPA output (eD)
    # and its fp32 logsumexp (4H) (flash/efficient kernels keep out + lse); the per-window outputs are
    # concatenated (l.324) into proj's input, kept only if proj's weight trains (eD)
    total += 3 * e * d + 2 * e * d + e * d + 4 * w.heads + (e * d if full else 0)
    # MLP (l.89): gate out, act(gate) out and up out for the product's gradients (3eI); the product is
    # down_proj's input, kept if down_proj's weight trains (eI)
    total += 3 * e * i + (e * i if full else 0)
    # LoRA (peft lora/layer.py Linear.forward): lora_A keeps the fp32 copy of the base layer's input, lora_B the
    # fp32 lora_A output
    for name, width in (("qkv", d), ("proj", d), ("gate_proj", d), ("up_proj", d), ("down_proj", i)):
        if name in adapters:
            total += a * width + a * r
    return total


def outside_saved_per_patch(w: VisionWidths, e: int, full: bool, adapters: frozenset[str], r: int) -> int:
    """Bytes per patch kept outside the blocks when a gradient flows into the tower: patch embedding, rotary
    tables, merger (``Qwen2_5_VLPatchMerger``: 4 patches -> one 4D-wide row, so its per-patch widths are D)."""
    d, a = w.hidden, ADAPTER_BYTES
    # get_image_features (l.1071): pixel_values.type(visual.dtype) is a 16-bit copy that the Conv3d keeps when
    # its weight trains (an fp32 model keeps the fp32 input itself, counted as an input)
    total = e * w.patch_in if full and e != 4 else 0
    # rotary cos and sin (l.161-177), fp32 (patches, head_dim) each, shared by every block
    total += 2 * 4 * w.head_dim
    # merger ln_q RMSNorm (as a block norm) + GELU input (mlp.0 output, eD) + mlp.0/mlp.2 inputs if trained
    total += 4 * d + 4 + (2 * e * d if full else 0) + e * d + (e * d if full else 0)
    for name in _MERGER_LINEARS:
        if name in adapters:  # fp32 input copy (D per patch) and lora_A output (r per merged row: r/4 ... x4 B)
            total += a * d + r
    return total


def _mode_bytes(spec: TrainingSpec) -> int:
    return 2 if spec.precision.load_dtype.is_half or spec.precision.mixed_precision.value != "no" else 4


@dataclass(frozen=True)
class VisionSaved:
    """What the tower keeps for one micro-batch.

    Attributes:
        kept: Bytes kept from forward to backward (blocks, checkpoint inputs, patch embedding, merger).
        block: Bytes one not-checkpointed block keeps (the recomputed block's, with checkpointing).
        work: The top block's MLP backward working set (as the decoder's: +2·e·I and the residual gradient).
        grads: Gradient bytes of the tower's trained parameters (made after every text gradient but the
            input embedding's).
        detail: A line for the report.
    """

    kept: int
    block: int
    work: int
    grads: int
    detail: str


def vision_saved(spec: TrainingSpec) -> VisionSaved:
    """What the vision tower keeps for ``image_tokens`` patches per sample."""
    w = vision_widths(spec)
    sh = spec.model.shape
    patches = sh.image_tokens * spec.batch.micro_batch
    if w is None or patches <= 0:
        return VisionSaved(0, 0, 0, 0, "")
    e = _mode_bytes(spec)
    full = _full(spec)
    adapters = _vision_adapters(spec)
    r = spec.lora.r if spec.lora is not None else 0
    act = spec.activations
    trained = full or bool(adapters)
    if not trained and not act.checkpointing:
        return VisionSaved(0, 0, 0, 0, f"frozen vision tower, no gradient reaches it: nothing kept ({patches} "
                                       "patches)")
    block = block_saved_per_patch(w, e, full, adapters, r)
    n = max(1, act.checkpoint_every_n_layers)
    n_ckpt = math.ceil(w.depth / n) if act.checkpointing else 0  # blocks 0, n, 2n, ... (counted first)
    plain = w.depth - n_ckpt
    # a checkpointed block keeps its input (eD); without checkpointing and without an input gradient hook the
    # first block's first norm sees no gradient: its fp32 copy and rsqrt are not kept (LoRA: only adapters train)
    per_patch = plain * block + n_ckpt * e * w.hidden + outside_saved_per_patch(w, e, full, adapters, r)
    if not act.checkpointing and not full:
        per_patch -= 4 * w.hidden + 4
    if act.checkpointing and not full:
        # the frozen patch embedding's output, made a leaf that requires grad by enable_input_require_grads, is
        # held by its AccumulateGrad node (a trained Conv3d's output is no leaf and is freed)
        per_patch += e * w.hidden
    vc = spec.model.shape.traits.vision
    merged = patches // max(1, (vc.spatial_merge_size if vc is not None else 2) ** 2)
    kept = per_patch * patches + 8 * merged + _text_side(spec, e)
    detail = f"{block} B/patch/block x {patches} patches x {plain} blocks" + (
        f" + {n_ckpt} checkpointed block inputs" if n_ckpt else "") + ("" if trained else " (frozen tower, "
                                                                        "input gradient from checkpointing)")
    work = (2 * e * w.inter + e * w.hidden) * patches
    return VisionSaved(kept, block * patches, work, _tower_grad_bytes(spec), detail)


def _text_side(spec: TrainingSpec, e: int) -> int:
    """What images add on the language model's side when a gradient flows out of the tower (l.1224-1230).

    ``masked_scatter`` keeps its bool placeholder mask (b·s); the merger's output reordering
    (``merged[reverse_indices]``, l.481) its int64 indices (counted by the caller). With a frozen input
    embedding the scattered sequence needs a gradient only because of the images: without checkpointing the
    first decoder layer's first RMSNorm then keeps its fp32 input copy and rsqrt (4·h + 4 per token), which a
    text-only step does not; with checkpointing the embedding output (a leaf made to require grad by
    ``enable_input_require_grads``) stays held by its AccumulateGrad node next to the scattered copy (e·h).
    """
    b, s, h = spec.batch.micro_batch, spec.batch.seq_len, spec.model.shape.hidden_size
    out = b * s
    if _full(spec) and spec.freeze is None:
        return out  # the trained embedding already needs a gradient: the text formula counts the rest
    if spec.activations.checkpointing:
        return out + e * h * b * s
    return out + (4 * h + 4) * b * s


def _tower_grad_bytes(spec: TrainingSpec) -> int:
    """Gradient bytes of the tower's trainable parameters (made during the tower's backward, after the text's)."""
    if _full(spec):
        return sum(p.numel for p in spec.model.params if _is_vision(p.name)) * _grad_bytes(spec)
    return 0


def _grad_bytes(spec: TrainingSpec) -> int:
    return 2 if spec.precision.load_dtype.is_half else 4


def _embedding_grad(spec: TrainingSpec) -> int:
    """The input embedding's gradient: made last, after the tower's backward (a full fine-tune, untied)."""
    if not _full(spec) or spec.freeze is not None or spec.model.shape.tied_embeddings:
        return 0
    return sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING) * _grad_bytes(spec)


def vision_during_backward(spec: TrainingSpec, v: VisionSaved, q: BackwardInputs, head_extra: int) -> int:
    """What the tower adds to the worst moment of backward, beyond the text's own worst moment.

    The tower's saved tensors live through the whole text backward (autograd runs the tower's nodes, created
    after the input embedding's, before it): each text moment of ``activations.backward`` gains ``kept``; at the
    layer moments the tower's gradients do not exist yet (the head moment already misses every gradient).
    Then the tower's own backward: its top block (recomputed, with checkpointing) with the MLP working set, the
    text's tensors freed, the tower's and the input embedding's gradients not yet made.
    """
    from fitcheck.core.activations.backward import backward_moments

    moments = backward_moments(spec, q, head_extra)
    text = max(q.end, *moments.values())
    with_tower = dict(moments)
    for name in ("top layer", "bottom layer"):
        with_tower[name] = moments[name] + v.kept - v.grads
    with_tower["head"] = moments["head"] + v.kept
    recompute = v.block if spec.activations.checkpointing else 0
    with_tower["vision top block"] = v.kept + recompute + v.work - v.grads - _embedding_grad(spec)
    return max(q.end, *with_tower.values()) - text


def vision_components(spec: TrainingSpec, q: BackwardInputs | None = None, head_extra: int = 0
                      ) -> tuple[Component, ...]:
    """``activations.vision``: what the vision tower keeps for backward, for ``image_tokens`` per sample, and
    ``inputs.pixel_values``: the processor's float32 patches.

    Args:
        spec: A spec whose task is ``image-text-to-text``.
        q: The text's backward quantities (``activations.decoder``); None: the tower adds nothing during backward.
        head_extra: Logits-side bytes alive at the LM head's backward.
    """
    sh = spec.model.shape
    w = vision_widths(spec)
    if sh.task != "image-text-to-text" or sh.image_tokens <= 0 or w is None:
        return ()
    v = vision_saved(spec)
    patches = sh.image_tokens * spec.batch.micro_batch
    during = vision_during_backward(spec, v, q, head_extra) if q is not None and v.kept else 0
    pixels = 4 * w.patch_in * patches + 8 * 3 * spec.batch.micro_batch  # float32 pixel_values + image_grid_thw
    return (
        Component(
            "activations.vision",
            Category.ACTIVATIONS,
            Location.DEVICE,
            {Phase.FORWARD_END: v.kept, Phase.BACKWARD_START: v.kept, Phase.BACKWARD: during},
            SOURCE,
            v.detail,
        ),
        Component.persistent(
            "inputs.pixel_values", Category.ACTIVATIONS, pixels,
            "transformers 5.23 image_processing_qwen2_vl.py (float32 patches, l x in_channels*temporal*patch^2)",
            f"{patches} patches x {w.patch_in} float32",
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
    out = [
        Finding(
            "vision-tower-counted",
            Severity.INFO,
            f"vision tower {'trained (adapters or full fine-tuning reach it)' if trained else 'frozen'}: "
            f"{sh.image_tokens} patches per sample",
            "peft all-linear puts LoRA on the vision blocks and the merger too; name text-only modules (or a "
            "target regex on language_model) to keep the tower frozen" if trained else "",
        )
    ]
    why = _not_pinned(spec)
    if why:
        out.append(
            Finding(
                "vision-not-pinned",
                Severity.WARNING,
                f"vision tower activations: {why}; the Qwen2.5-VL recipe is used, not checked against a trace",
                "run `fitcheck estimate --trace` (Qwen2.5-VL) to measure the step fed images on fake tensors",
            )
        )
    return tuple(out)


def _not_pinned(spec: TrainingSpec) -> str:
    """Why the vision recipe is outside what the trace checked ('' when inside)."""
    if not spec.model.shape.traits.vision_pinned:  # the families whose tower was checked against a trace
        return f"{spec.model.shape.family} is not Qwen2.5-VL"
    if spec.precision.mixed_precision.value != "no":
        return "autocast over the tower is not modelled"
    if spec.quant is not None:
        return "a quantized tower is not modelled"
    if spec.lora is not None and (spec.lora.dropout > 0 or spec.lora.use_dora):
        return "LoRA dropout / DoRA on the tower is not modelled"
    if spec.activations.attn_implementation.value == "eager":
        return "eager attention in the tower is not modelled"
    return ""
