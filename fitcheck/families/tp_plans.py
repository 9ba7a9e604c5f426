"""transformers 5.23 ``base_model_tp_plan`` pieces the family modules compose (``configuration_<family>.py``).

Pure data: (module pattern, tp style) pairs.
"""

from __future__ import annotations

__all__ = ["ATTN_MLP", "ATTN_ONLY", "MLP", "MOE_EXPERTS", "QK_NORM", "TpPlan"]

TpPlan = tuple[tuple[str, str], ...]

ATTN_MLP: TpPlan = (
    ("layers.*.self_attn.q_proj", "colwise"),
    ("layers.*.self_attn.k_proj", "colwise"),
    ("layers.*.self_attn.v_proj", "colwise"),
    ("layers.*.self_attn.o_proj", "rowwise"),
    ("layers.*.mlp.gate_proj", "colwise"),
    ("layers.*.mlp.up_proj", "colwise"),
    ("layers.*.mlp.down_proj", "rowwise"),
)
QK_NORM: TpPlan = (
    ("layers.*.self_attn.q_norm", "replicated_with_grad_allreduce"),
    ("layers.*.self_attn.k_norm", "replicated_with_grad_allreduce"),
)
MOE_EXPERTS: TpPlan = (
    ("layers.*.mlp.experts.gate_up_proj", "packed_colwise"),
    ("layers.*.mlp.experts.down_proj", "rowwise"),
    ("layers.*.mlp.experts", "moe_tp_experts"),
)
ATTN_ONLY: TpPlan = tuple((k, v) for k, v in ATTN_MLP if "self_attn" in k)
MLP: TpPlan = tuple((k, v) for k, v in ATTN_MLP if ".mlp." in k)
