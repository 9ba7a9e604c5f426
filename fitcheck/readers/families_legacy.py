"""Parameter layouts of older transformers releases, where they differ from 5.23 in what memory depends on.

transformers 4.x ``MixtralSparseMoeBlock`` (models/mixtral/modeling_mixtral.py, 4.36-4.57) holds the router as
``gate = nn.Linear(hidden, num_experts, bias=False)`` and each expert as ``MixtralBlockSparseTop2MLP`` with three
``nn.Linear``: ``w1`` (hidden -> ffn), ``w3`` (hidden -> ffn), ``w2`` (ffn -> hidden), under
``model.layers.N.block_sparse_moe``. Being ``nn.Linear``, bitsandbytes quantizes them and peft ``all-linear``
targets them; transformers 5 fuses the experts into 3-D parameters that neither touches
(``fitcheck.families.mixtral``). Pure: no torch.
"""

from __future__ import annotations

import dataclasses

from fitcheck.spec import Kind, ModelInventory, ParamEntry, Role, StackSpec

_MOE = "model.layers.*.block_sparse_moe"


def _linear(name: str, in_f: int, out_f: int, role: Role, repeat: int) -> ParamEntry:
    return ParamEntry(
        name=name,
        shape=(out_f, in_f),
        role=role,
        kind=Kind.LINEAR,
        repeat=repeat,
        module=name.split(".")[-2],
        in_features=in_f,
        out_features=out_f,
    )


def _mixtral_v4(inventory: ModelInventory) -> ModelInventory:
    sh = inventory.shape
    h, inter, experts, layers = sh.hidden_size, sh.intermediate_size, sh.num_experts, sh.num_layers
    moe = [_linear(f"{_MOE}.gate.weight", h, experts, Role.ROUTER, layers)]
    for e in range(experts):
        moe.append(_linear(f"{_MOE}.experts.{e}.w1.weight", h, inter, Role.EXPERTS, layers))
        moe.append(_linear(f"{_MOE}.experts.{e}.w2.weight", inter, h, Role.EXPERTS, layers))
        moe.append(_linear(f"{_MOE}.experts.{e}.w3.weight", h, inter, Role.EXPERTS, layers))
    # in named_parameters() order, where the 5.x ``mlp`` entries were (4.x MixtralDecoderLayer.__init__: self_attn,
    # block_sparse_moe, then the norms): the model's last parameter stays ``lm_head.weight``, the one module
    # get_keys_to_not_convert keeps unquantized (appended at the end, expert 7's w3 of every layer was kept in
    # 16-bit and upcast to fp32 by k-bit preparation: +7.0 GiB on Mixtral-8x7B QLoRA)
    at = next(i for i, p in enumerate(inventory.params) if ".mlp." in p.name)
    kept = [p for p in inventory.params if ".mlp." not in p.name]
    return dataclasses.replace(inventory, params=(*kept[:at], *moe, *kept[at:]))


def inventory_for_stack(inventory: ModelInventory, stack: StackSpec) -> ModelInventory:
    """The inventory as the environment's transformers builds it (unchanged for transformers >= 5).

    Args:
        inventory: The transformers 5.23 inventory (pure-Python or meta).
        stack: The environment's versions.

    Returns:
        Mixtral on transformers 4.x: router and experts as per-expert ``nn.Linear`` (same parameter count).
    """
    release = stack.release("transformers")
    if release is None or release[0] >= 5:
        return inventory
    if inventory.shape.family == "mixtral" and inventory.shape.num_experts:
        return _mixtral_v4(inventory)
    return inventory
