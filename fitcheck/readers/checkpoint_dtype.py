"""The dtype ``from_pretrained`` loads when config.json names none, and gpt-oss's MXFP4 experts (pure).

transformers 5.23 ``from_pretrained`` defaults to ``dtype="auto"`` (modeling_utils.py: ``if dtype is None: dtype
= "auto"``). ``_get_dtype`` then uses ``config.dtype``; when config.json has none it reads the checkpoint: the
``dtype`` in a sharded index's metadata, else ``get_state_dict_dtype`` of the first shard, i.e. the dtype of its
first floating-point tensor. fitcheck has the config, not the weights, so for such configs it says what it
assumed and how to make the load dtype explicit. transformers 4.x has no "auto" default: without
``torch_dtype`` it loads in ``torch.get_default_dtype()`` (float32).

gpt-oss (``quantization_config.quant_method == "mxfp4"``): the checkpoint stores the MoE expert weights as MXFP4
``*_blocks`` (uint8, two 4-bit values per byte) and ``*_scales`` (uint8 E8M0, one per 32 values), and every
other tensor, the expert biases included, in bf16 (shared/catalog openai/gpt-oss-20b source.txt: "everything
else BF16"); its first floating tensor is bf16, so ``dtype="auto"`` loads bf16. MXFP4 cannot be trained:
``Mxfp4HfQuantizer.is_trainable`` is False and ``validate_quantization_for_training`` (trainer_utils.py) refuses
it, so fine-tuning loads with ``Mxfp4Config(dequantize=True)``, and transformers also dequantizes to bf16 by
itself whenever the kernels are absent (quantizer_mxfp4.py ``validate_environment``: no Triton >= 3.4 / no
``kernels`` package / compute capability < 7.5, and on CPU without ``use_kernels``). Dequantization
(integrations/mxfp4.py ``_convert_moe_packed_tensors``) builds each expert tensor in bf16 from int32 lookup
indices: per tensor of n values, blocks n/2 B + int32 scales n/8 B + indices 2n B next to the 2n B output.
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.findings import Finding, Severity
from fitcheck.spec import Dtype, Kind, ModelInventory, StackSpec

_GIB = 2**30


def mxfp4(inventory: ModelInventory) -> bool:
    """True for a checkpoint whose config.json declares MXFP4 quantization (gpt-oss)."""
    qc = inventory.quantization_config
    return isinstance(qc, Mapping) and str(qc.get("quant_method", "")).lower() == "mxfp4"


def auto_dtype_without_config(inventory: ModelInventory, stack: StackSpec) -> tuple[Dtype, str]:
    """The load dtype fitcheck assumes when config.json names none and the user passed no dtype.

    Returns:
        ``(dtype, why)``: bf16 for an MXFP4 checkpoint on transformers 5, else float32.
    """
    release = stack.release("transformers")
    if release is not None and release[0] < 5:
        return Dtype.FLOAT32, (
            f"transformers {stack.get('transformers')}: from_pretrained without torch_dtype loads "
            "torch's default dtype, float32"
        )
    if mxfp4(inventory):
        return Dtype.BFLOAT16, (
            "dtype 'auto' (transformers 5 default): config.json names no dtype; the MXFP4 checkpoint's first "
            "floating tensor is bf16, so bfloat16"
        )
    return Dtype.FLOAT32, (
        "dtype 'auto': config.json names no dtype, so the checkpoint's first floating tensor decides; "
        "assumed float32"
    )


def missing_dtype_finding(inventory: ModelInventory, load: Dtype) -> Finding:
    """Warn that config.json names no dtype: what was assumed and the flag that makes it explicit."""
    return Finding(
        "dtype-not-in-config",
        Severity.WARNING,
        f"{inventory.model_id}: config.json names no dtype; from_pretrained(dtype='auto') takes the dtype of the "
        f"checkpoint's first floating-point tensor (transformers 5.23 modeling_utils.py _get_dtype), and "
        f"transformers 4.x loads float32 without torch_dtype. Estimated as {load.value}",
        "load in bf16 explicitly: from_pretrained(..., dtype=torch.bfloat16) (fitcheck: --dtype bfloat16)",
    )


def mxfp4_checkpoint_bytes(inventory: ModelInventory) -> tuple[int, int]:
    """Bytes of an MXFP4 checkpoint: ``(expert bytes as MXFP4, every other tensor in bf16)``.

    Per expert value: half a byte (two 4-bit values per uint8 of ``*_blocks``) plus one uint8 E8M0 scale per
    32 values (``*_scales``); everything else bf16. gpt-oss-20b: 10,152,345,600 + 3,608,919,168 =
    13,761,264,768 B, the ``total_size`` of its model.safetensors.index.json (shared/catalog source.txt).
    """
    experts = sum(p.numel for p in inventory.params if p.kind is Kind.FUSED_EXPERTS)
    return experts // 2 + experts // 32, 2 * (inventory.total_params - experts)
