"""What the model is: element types, every parameter by name and role, the architecture numbers.

Part of :mod:`fitcheck.spec` (import from there). Filled by the config readers (``fitcheck.readers``), read
by every formula in ``fitcheck.core``.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from fitcheck.spec.traits import FamilyTraits


class Dtype(str, Enum):
    """Element types of parameters, states and activations."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    INT8 = "int8"
    UINT8 = "uint8"

    @property
    def nbytes(self) -> int:
        """Bytes per element."""
        return 4 if self is Dtype.FLOAT32 else 2 if self in (Dtype.BFLOAT16, Dtype.FLOAT16) else 1

    @property
    def is_half(self) -> bool:
        """True for the 16-bit floating types."""
        return self in (Dtype.BFLOAT16, Dtype.FLOAT16)

    @classmethod
    def from_name(cls, name: object) -> Dtype | None:
        """The dtype a name denotes, or None: ``"bfloat16"``, ``"bf16"``, ``"torch.bfloat16"``, ``"half"``...

        Accepts what config.json, TrainingArguments/TRL flags, BitsAndBytesConfig fields and ``str(torch.dtype)``
        spell (case-insensitive).
        """
        text = str(name).strip().lower().removeprefix("torch.")
        return _DTYPE_ALIASES.get(text) or next((d for d in cls if d.value == text), None)


_DTYPE_ALIASES: dict[str, Dtype] = {
    "fp32": Dtype.FLOAT32,
    "float": Dtype.FLOAT32,
    "bf16": Dtype.BFLOAT16,
    "fp16": Dtype.FLOAT16,
    "half": Dtype.FLOAT16,
}


class Role(str, Enum):
    """What a parameter does in the model (for the itemised inventory)."""

    EMBEDDING = "embedding"
    POSITION = "position_embedding"
    LM_HEAD = "lm_head"
    ATTENTION = "attention"
    MLP = "mlp"
    EXPERTS = "experts"
    ROUTER = "router"
    NORM = "norm"
    BIAS = "bias"
    OTHER = "other"


class Kind(str, Enum):
    """Which torch module holds a parameter: decides bitsandbytes quantization and LoRA targeting."""

    LINEAR = "linear"  # weight of nn.Linear or GPT-2 Conv1D: quantized by bnb, LoRA-targetable
    EMBEDDING = "embedding"  # nn.Embedding weight: never quantized by bnb
    NORM = "norm"  # LayerNorm/RMSNorm weight or bias
    FUSED_EXPERTS = "fused_experts"  # 3-D MoE expert tensor (transformers 5): not quantized, LoRA via target_parameters
    BIAS = "bias"  # bias of a Linear (stays in the compute dtype under bnb)
    OTHER = "other"


@dataclass(frozen=True)
class ParamEntry:
    """One parameter name (with ``*`` for the layer index) and how many instances of it exist.

    Attributes:
        name: Full parameter name as transformers names it, layer index replaced by ``*``,
            e.g. ``"model.layers.*.self_attn.q_proj.weight"``.
        shape: Shape of one instance.
        role: What it does.
        kind: Which module type holds it.
        repeat: Number of instances (the number of layers for per-layer names, else 1).
        module: Short module name used by PEFT target matching, e.g. ``"q_proj"``.
        in_features: For linear weights, the input features (GPT-2 Conv1D stores the transpose).
        out_features: For linear weights, the output features.
    """

    name: str
    shape: tuple[int, ...]
    role: Role
    kind: Kind
    repeat: int = 1
    module: str = ""
    in_features: int = 0
    out_features: int = 0

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise ValueError(f"{self.name}: repeat must be >= 1")
        if any(d < 0 for d in self.shape):
            raise ValueError(f"{self.name}: negative dimension in {self.shape}")

    @property
    def numel_each(self) -> int:
        """Elements of one instance."""
        return math.prod(self.shape)

    @property
    def numel(self) -> int:
        """Elements of all instances."""
        return self.numel_each * self.repeat

    @property
    def per_layer(self) -> bool:
        """True when the name has a layer index."""
        return "*" in self.name

    def matches(self, pattern: str) -> bool:
        """fnmatch the name (layer index as ``*``) against a pattern such as ``"*.mlp.gate"``."""
        return fnmatch.fnmatchcase(self.name, pattern)


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers the activation and compute formulas need.

    Attributes:
        family: ``model_type`` from config.json (``"llama"``, ``"mistral"``, ``"qwen2"``, ``"gemma2"``, ...).
        architecture: The transformers class, e.g. ``"LlamaForCausalLM"``.
        hidden_size: Model width h.
        num_layers: Number of decoder/encoder layers L.
        num_heads: Attention heads a.
        num_kv_heads: Key/value heads (GQA); equals num_heads for MHA.
        head_dim: Per-head dimension (may differ from hidden/heads, e.g. Gemma-7B).
        intermediate_size: MLP inner width (per expert for MoE).
        vocab_size: Vocabulary size V.
        max_position_embeddings: Context length the config declares.
        mlp_activation: ``"swiglu"`` (gated) or ``"gelu"`` / ``"relu"`` (plain two-matrix MLP).
        norm: ``"rmsnorm"`` or ``"layernorm"``.
        num_experts: Experts per MoE layer (0 for dense models).
        experts_per_token: Top-k routing.
        tied_embeddings: Whether the LM head shares the input embedding tensor.
        sliding_window: Sliding-window size if the config sets one.
        causal_lm: False for encoder models (BERT), whose head differs.
        config_dtype: ``torch_dtype``/``dtype`` in config.json (what ``dtype="auto"`` loads), if any.
        no_split_module: The decoder-layer class (FSDP wrap unit, device_map no-split class).
        parallel_attn: Falcon/Phi-style parallel attention+MLP block.
        partial_rotary_factor: Fraction of head_dim rotated (Phi-2).
        task: The head the model carries: ``"causal-lm"`` (vocabulary-sized LM head), ``"seq-cls"`` /
            ``"token-cls"`` (a ``num_labels``-wide classifier), ``"image-text-to-text"`` (vision-language), or
            ``"masked-lm"`` (BERT's MLM head); read from ``architectures`` or ``--task``.
        num_labels: Classifier width for ``seq-cls`` / ``token-cls`` (0 otherwise).
        image_tokens: Vision-tower patches per image (before the merger) for ``image-text-to-text`` (0 = none).
        traits: What kind of model the family builds (filled by the readers from :mod:`fitcheck.families`);
            the formulas read these, never ``family``.
    """

    family: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 0
    mlp_activation: str = "swiglu"
    norm: str = "rmsnorm"
    num_experts: int = 0
    experts_per_token: int = 0
    tied_embeddings: bool = False
    sliding_window: int | None = None
    causal_lm: bool = True
    config_dtype: Dtype | None = None
    no_split_module: str = ""
    parallel_attn: bool = False
    partial_rotary_factor: float = 1.0
    task: str = "causal-lm"
    num_labels: int = 0
    image_tokens: int = 0
    traits: FamilyTraits = field(default_factory=FamilyTraits)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model shape: {name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class ModelInventory:
    """Every parameter of the model, by name and role, plus its shape numbers.

    Attributes:
        model_id: What the user asked for (Hub id or path).
        shape: Architecture numbers.
        params: The parameter entries; tied tensors appear once.
        source: Where the config came from (catalog entry with its source, a path, the HF cache).
        counted_by: ``"pure-python"`` (family formulas) or ``"meta"`` (``from_config`` on the meta device).
        quantization_config: The ``quantization_config`` already in config.json (pre-quantized checkpoints).
        config: The raw config.json mapping (kept for adapters that rebuild the model).
    """

    model_id: str
    shape: ModelShape
    params: tuple[ParamEntry, ...]
    source: str = ""
    counted_by: str = "pure-python"
    quantization_config: Mapping[str, object] | None = None
    config: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)

    @property
    def total_params(self) -> int:
        """Number of parameters (tied tensors counted once)."""
        return sum(p.numel for p in self.params)

    def by_role(self) -> dict[Role, int]:
        """Parameter count per role."""
        out: dict[Role, int] = {}
        for p in self.params:
            out[p.role] = out.get(p.role, 0) + p.numel
        return out
