"""LoRA targeting as peft 0.21.2 resolves it."""

from __future__ import annotations

from test_model_states_inventories import llama_like, mixtral_like

from fitcheck.core.states.lora import adapter_param_count, plan_lora
from fitcheck.spec import LoraSpec, TrainingSpec


def _plan(lora: LoraSpec, inv=None):  # type: ignore[no-untyped-def]
    return plan_lora(TrainingSpec(model=inv or llama_like(), lora=lora))


def test_all_linear_llama3_8b() -> None:
    assert (
        _plan(LoraSpec(r=16, target_modules=("all-linear",))).adapter_params == 41_943_040
    )  # design note 04


def test_explicit_names_layers_rank_pattern_regex() -> None:
    qv = _plan(LoraSpec(r=8, target_modules=("q_proj", "v_proj"))).adapter_params
    assert qv == 32 * 8 * ((4096 + 4096) + (4096 + 1024))
    first2 = _plan(LoraSpec(r=8, target_modules=("q_proj",), layers_to_transform=(0, 1))).adapter_params
    assert first2 == 2 * 8 * 8192
    ranked = _plan(LoraSpec(r=8, target_modules=("q_proj",), rank_pattern={"q_proj": 4})).adapter_params
    assert ranked == 32 * 4 * 8192
    regex = _plan(LoraSpec(r=8, target_regex=r"model\.layers\.[01]\.self_attn\.q_proj")).adapter_params
    assert regex == 2 * 8 * 8192


def test_dora_and_modules_to_save() -> None:
    dora = _plan(LoraSpec(r=8, target_modules=("q_proj",), use_dora=True)).adapter_params
    assert dora == 32 * (8 * 8192 + 4096)
    spec = TrainingSpec(
        model=llama_like(), lora=LoraSpec(r=8, target_modules=("q_proj",), modules_to_save=("lm_head",))
    )
    assert adapter_param_count(spec) == 32 * 8 * 8192 + 128256 * 4096


def test_mixtral_v4_names_become_param_wrappers() -> None:
    plan = _plan(LoraSpec(r=16, target_modules=("w1", "w3", "w2", "gate")), mixtral_like())
    assert all(t.via_param_wrapper for t in plan.targets)
    ranks = {t.entry.name.rsplit(".", 1)[-1]: t.rank for t in plan.targets}
    assert ranks == {"weight": 16, "gate_up_proj": 32, "down_proj": 16}  # peft doubles r on the fused gate_up
    bad = _plan(LoraSpec(r=16, dropout=0.1, target_modules=("all-linear",)), mixtral_like())
    assert any("lora_dropout" in m for m, _ in bad.problems)


def test_no_match_is_empty() -> None:
    assert _plan(LoraSpec(r=8, target_modules=("nope",))).targets == ()
