"""Which ``model_type`` values peft rewrites MoE LoRA targets for (transformers 5 fused experts).

peft 0.21.2 utils/transformers_weight_conversion.py ``_convert_peft_config_moe`` looks the type up in
transformers 5.23 conversion_mapping.py ``_MODEL_TO_CONVERSION_PATTERN`` (+ peft's own ``"mixtral": "mixtral"``);
a type absent there (qwen2_moe itself) is not rewritten. The MoE entries of that table. Pure data.
"""

from __future__ import annotations

from fitcheck.spec import MoeConversion

__all__ = ["MOE_CONVERSION"]

MOE_CONVERSION: dict[str, MoeConversion] = {
    "mixtral": MoeConversion.MIXTRAL, "minimax": MoeConversion.MIXTRAL, "minimax_m2": MoeConversion.MIXTRAL,
    **{t: MoeConversion.QWEN2_MOE for t in (
        "afmoe", "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe", "glm4_moe", "glm4_moe_lite",
        "glm_moe_dsa", "glm4v_moe", "longcat_flash", "solar_open", "mellum", "qwen3_moe", "beam", "qwen3_omni_moe",
        "qwen3_omni_moe_thinker", "qwen3_omni_moe_text", "qwen3_next", "hunyuan_v1_moe", "flex_olmo", "olmoe",
        "exaone_moe", "cohere2_moe")},
}
