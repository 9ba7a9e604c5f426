"""What kind of model a family builds: typed traits the core reads instead of ``model_type`` names.

Part of :mod:`fitcheck.spec` (import from there). One :class:`FamilyTraits` rides on every
:class:`fitcheck.spec.ModelShape`; :mod:`fitcheck.families` declares each family's traits in one module and fills
the config-dependent ones from config.json (litgpt's ``Config`` carries ``norm_qk_type``/``latent_attention`` the
same way: the model code reads traits, never names). A field's default is what an undeclared architecture gets:
the Llama-style decoder recipe, not pinned to a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class LayerRecipe(str, Enum):
    """Which per-layer recipe of ``fitcheck.core.activations`` counts the saved bytes."""

    DECODER = "pre-norm-decoder"  # Llama-style: RMSNorm, rotary attention, gated or MoE MLP
    LATENT_MOE = "latent-attention-moe"  # DeepSeek-V3: multi-head latent attention, dense then MoE layers
    GPT2_BLOCK = "gpt2-block"  # pre-LN, fused Conv1D qkv, gelu_new MLP, learned positions
    BERT_BLOCK = "bert-post-ln"  # post-LN encoder layer, erf GELU MLP
    PHI_PARALLEL = "phi-parallel"  # one LayerNorm, parallel attention + gelu_new MLP, partial rotary
    FALCON_PARALLEL = "falcon-parallel"  # one LayerNorm, parallel multi-query attention + GELU MLP
    BLOOM_ALIBI = "bloom-alibi"  # pre-LN, fused qkv, ALiBi eager attention

    @property
    def layernorm_block(self) -> bool:
        """True for the LayerNorm recipes (``fitcheck.core.activations.layernorm_blocks``)."""
        return self not in (LayerRecipe.DECODER, LayerRecipe.LATENT_MOE)


class NormKind(str, Enum):
    """How the normalisation layers compute (what a trained weight makes them keep)."""

    RMS = "rms"  # LlamaRMSNorm: the normalised tensor cast back to the input dtype, times the weight
    RMS_ONE_PLUS = "rms-one-plus-fp32"  # GemmaRMSNorm: fp32 throughout, times (1 + weight.float())
    RMS_FP32_PRODUCT = "rms-fp32-product"  # OLMo-2 / gpt-oss: weight times the fp32 normalised tensor, then cast
    LAYERNORM = "layernorm"


class NormPlacement(str, Enum):
    """Where the per-layer norms sit."""

    PRE = "pre"  # before attention and before the MLP (2 per layer)
    POST = "post"  # only after attention and the MLP (OLMo-2): no norm over the embedding output
    PRE_AND_POST = "pre-and-post"  # Gemma-2/3: pre-norms plus post-attention / post-feedforward norms (4)


class QkNorm(str, Enum):
    """Norms on the query and key projections."""

    NONE = "none"
    PER_HEAD = "per-head"  # Qwen3 / Gemma-3: RMSNorm over head_dim, one rsqrt per head
    FULL_WIDTH = "full-width"  # OLMo-2: RMSNorm over the whole q / kv width


class AttentionKind(str, Enum):
    """What distinguishes the attention of a family from plain (grouped-query) dot-product attention."""

    STANDARD = "standard"  # MHA / GQA / MQA (the head counts say which)
    LATENT = "latent"  # MLA (DeepSeek): low-rank q and compressed kv
    SINKS = "sinks"  # gpt-oss: a learned sink logit per head concatenated to the scores
    SOFTCAPPED = "softcapped"  # Gemma-2: tanh soft-capping of the scores
    ALIBI = "alibi"  # BLOOM (and Falcon configs with ``alibi``): linear position biases, no rotary


class RotaryTables(str, Enum):
    """The cos/sin tables every layer reads."""

    MODEL_DTYPE = "model-dtype"  # (1, s, head_dim·partial_rotary_factor), cast to the model dtype
    FP32 = "fp32"  # OLMo-2: returned uncast
    HALF_HEAD_DIM = "half-head-dim"  # gpt-oss: (1, s, head_dim / 2), no cat


class MoeLayout(str, Enum):
    """How the experts and router are built (transformers 5.23)."""

    DENSE = "dense"
    FUSED_EXPERTS = "fused-experts"  # 3-D gate_up / down tensors, softmax over all experts (Mixtral, Qwen-MoE)
    GROUPED_MM_CLAMPED = "grouped-mm-clamped"  # gpt-oss: grouped_mm experts, clamped SwiGLU, top-k softmax
    SHARED_FP32_ROUTER = "shared-fp32-router"  # DeepSeek-V3: shared experts, router weight cast to fp32


class MoeConversion(str, Enum):
    """Which peft v4->v5 MoE target rewrite applies (peft 0.21.2 utils/transformers_weight_conversion.py)."""

    NONE = "none"
    MIXTRAL = "mixtral-pattern"
    QWEN2_MOE = "qwen2-moe-pattern"


@dataclass(frozen=True)
class Dropout:
    """Dropout probabilities of a LayerNorm family, from config.json with its config class's defaults.

    Attributes:
        attention: On the attention probabilities.
        hidden: On the sublayer outputs (residual dropout).
        embedding: On the embedding output.
        functional: The probabilities the family applies by a call that reads the config's float
            (``F.dropout(x, p=config.hidden_dropout)`` in BLOOM's and Falcon's ``dropout_add``, Phi's
            ``attention_dropout`` passed to the attention function), not through an ``nn.Dropout`` module: TRL's
            ``disable_dropout_in_model`` leaves them on (:meth:`modules_disabled`).
    """

    attention: float = 0.0
    hidden: float = 0.0
    embedding: float = 0.0
    functional: tuple[str, ...] = ()

    def modules_disabled(self) -> Dropout:
        """The probabilities once every ``nn.Dropout`` module's ``p`` is 0 (TRL 1.16 ``trl/trainer/utils.py``
        ``disable_dropout_in_model``), the :attr:`functional` ones kept."""
        kept = {name: getattr(self, name) if name in self.functional else 0.0
                for name in ("attention", "hidden", "embedding")}
        return Dropout(**kept, functional=self.functional)


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention and MLP widths of a DeepSeek-V3 config (``DeepseekV3Config`` defaults).

    Attributes:
        q_rank: ``q_lora_rank`` (0: q_proj reads the hidden state, as ``null`` in config.json).
        kv_rank: ``kv_lora_rank``.
        rope: ``qk_rope_head_dim``.
        nope: ``qk_nope_head_dim``.
        v_head_dim: ``v_head_dim``.
        dense_intermediate: ``intermediate_size`` of the dense layers.
        shared_experts: ``n_shared_experts``.
        first_dense: ``first_k_dense_replace``.
    """

    q_rank: int
    kv_rank: int
    rope: int
    nope: int
    v_head_dim: int
    dense_intermediate: int
    shared_experts: int
    first_dense: int


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's widths (``vision_config``, ``Qwen2_5_VLVisionConfig`` defaults for absent keys).

    Attributes:
        hidden: Block width (``hidden_size``).
        heads: Attention heads (``num_heads``).
        intermediate: MLP width (``intermediate_size``).
        depth: Blocks (``depth``).
        patch_in: Values per patch: ``in_channels · temporal_patch_size · patch_size²``.
        spatial_merge_size: Patches merged per side by the merger.
    """

    hidden: int
    heads: int
    intermediate: int
    depth: int
    patch_in: int
    spatial_merge_size: int


@dataclass(frozen=True)
class RecipeGaps:
    """What the family's activation recipe was not checked against a trace for (None: checked).

    Attributes:
        always: Not pinned in any mode.
        config: Not pinned for this config (a variant of the family, read from config.json).
        lora_on_experts: Not pinned with LoRA on the fused experts.
        lora_ckpt_or_freeze: Not pinned under LoRA with checkpointing or partial freezing.
        ckpt_or_freeze: Not pinned with checkpointing or partial freezing.
    """

    always: str | None = None
    config: str | None = None
    lora_on_experts: str | None = None
    lora_ckpt_or_freeze: str | None = None
    ckpt_or_freeze: str | None = None


@dataclass(frozen=True)
class FamilyTraits:
    """The architecture traits of one model family, as the formulas read them.

    Attributes:
        recipe: Which per-layer activation recipe applies.
        norm_kind: How the norms compute.
        norm_placement: Where the per-layer norms sit.
        qk_norm: Norms on q / k.
        attention: What distinguishes the attention.
        eager_only: transformers has no SDPA path for this config (soft-capping, ALiBi, sinks).
        fused_projections: q/k/v and gate/up are single fused linears (Phi-3 ``qkv_proj``/``gate_up_proj``).
        rotary: The cos/sin tables.
        moe: How the experts are built.
        v4_linear_experts: transformers 4.x built the experts as ``nn.Linear`` (Mixtral).
        moe_conversion: peft's MoE target rewrite for this model_type.
        encoder: A bidirectional encoder (its classifier pools the first token).
        classifier_layer: The traits the layer formulas read when this encoder is a classifier (RoBERTa-likes
            run BERT's layer); None: its own.
        dropout: Dropout probabilities (LayerNorm recipes).
        classifier_dropout: The dropout before a classifier head.
        logit_softcapping: The LM head's logits are soft-capped (``final_logit_softcapping``).
        eager_mask_kinds: Distinct 4-D causal masks every layer's arguments hold (gpt-oss: full and sliding).
        banded_sliding_mask: With ``ModelShape.sliding_window`` set, transformers builds the layers' masks with
            ``create_sliding_window_causal_mask`` (Mistral, Mixtral, Phi-3, Qwen2, Qwen-MoE): from the window on,
            SDPA runs with a materialised banded mask (``core/activations/recipe_gaps.py``).
        config_num_labels: ``num_labels`` of config.json (1 when absent).
        mla: Latent-attention widths (DeepSeek-V3), else None.
        vision: The vision tower's widths when config.json has a ``vision_config``, else None.
        tp_plan: transformers' ``base_model_tp_plan`` as (module pattern, style) pairs, None when it has none.
        activations_pinned: The layer recipe was checked against traces of this family.
        backward_pinned: The backward MLP working set was checked against traces.
        moe_backward_traced: The MoE/MLA backward moments were checked against traces (no ckpt, 16-bit, SDPA).
        kbit_pinned: The QLoRA / LLM.int8 layer recipes were traced on this family (Llama-style layer).
        vision_pinned: The vision-tower recipe was checked against a trace of this family.
        liger_patched: Liger-Kernel has a monkey patch for this model_type.
        embedding_scaled_outside: The embedding output is scaled outside the input-embedding module (Granite's
            ``inputs_embeds * embedding_multiplier``), so the leaf ``enable_input_require_grads`` makes of a frozen
            embedding's output is not the first layer's input: its AccumulateGrad node keeps it through backward.
        gaps: What the recipe was not checked for.
    """

    recipe: LayerRecipe = LayerRecipe.DECODER
    norm_kind: NormKind = NormKind.RMS
    norm_placement: NormPlacement = NormPlacement.PRE
    qk_norm: QkNorm = QkNorm.NONE
    attention: AttentionKind = AttentionKind.STANDARD
    eager_only: bool = False
    fused_projections: bool = False
    rotary: RotaryTables = RotaryTables.MODEL_DTYPE
    moe: MoeLayout = MoeLayout.DENSE
    v4_linear_experts: bool = False
    moe_conversion: MoeConversion = MoeConversion.NONE
    encoder: bool = False
    classifier_layer: FamilyTraits | None = None
    dropout: Dropout = Dropout()
    classifier_dropout: float = 0.1
    logit_softcapping: bool = False
    eager_mask_kinds: int = 1
    banded_sliding_mask: bool = False
    config_num_labels: int = 1
    mla: MlaConfig | None = None
    vision: VisionConfig | None = None
    tp_plan: tuple[tuple[str, str], ...] | None = None
    activations_pinned: bool = False
    backward_pinned: bool = False
    moe_backward_traced: bool = False
    kbit_pinned: bool = False
    vision_pinned: bool = False
    liger_patched: bool = False
    embedding_scaled_outside: bool = False
    gaps: RecipeGaps = RecipeGaps()

    def dropout_modules_disabled(self) -> FamilyTraits:
        """These traits after TRL's ``disable_dropout_in_model`` (every ``nn.Dropout``'s ``p`` set to 0): the
        layers' module dropouts (:meth:`Dropout.modules_disabled`) and the classifier head's (an ``nn.Dropout``
        in transformers' ``*ForSequenceClassification`` / ``*ForTokenClassification`` heads) are 0."""
        layer = self.classifier_layer
        return replace(self, dropout=self.dropout.modules_disabled(), classifier_dropout=0.0,
                       classifier_layer=None if layer is None else layer.dropout_modules_disabled())
