"""Optimizer state bytes per TrainingArguments.optim value, and the retired-name mapping."""

from __future__ import annotations

import pytest

from fitcheck.core.optimizers.by_name import OPTIMIZER_NAMES, TensorGroup, canonical_optimizer, optimizer_memory
from fitcheck.errors import NotModelledError
from fitcheck.spec import Dtype, OptimizerSpec

BIG = TensorGroup("w", (4096, 4096), Dtype.BFLOAT16, repeat=2, low_rank=True)
SMALL = TensorGroup("norm", (1024,), Dtype.BFLOAT16, decay=False)
EMB = TensorGroup("emb", (32000, 4096), Dtype.BFLOAT16, embedding=True)
N = 4096 * 4096


def test_names_match_installed_transformers() -> None:
    names = pytest.importorskip("transformers.training_args").OptimizerNames
    assert tuple(n.value for n in names) == OPTIMIZER_NAMES


def test_every_optimizer_is_modelled_or_refused_clearly() -> None:
    modelled = 0
    for name in OPTIMIZER_NAMES:
        spec = OptimizerSpec(name, {"rank": "64"})
        try:
            mem = optimizer_memory(spec, [BIG, SMALL, EMB])
        except NotModelledError as exc:
            assert name in str(exc)
            continue
        modelled += 1
        assert mem.states + mem.managed >= 0 and mem.source, name
    assert modelled >= 35


def test_retired_names_and_unknown() -> None:
    assert canonical_optimizer("adamw_torch") == ("adamw_torch", None)
    name, finding = canonical_optimizer("adamw_hf")
    assert name == "adamw_torch" and finding is not None and "adamw_hf" in finding.message
    assert canonical_optimizer("adamw_apex_fused")[0] == "adamw_torch_fused"
    with pytest.raises(NotModelledError, match="adamw_torch_fused"):
        canonical_optimizer("adam_w_magic")


def test_torch_adamw_states_in_param_dtype() -> None:
    mem = optimizer_memory(OptimizerSpec("adamw_torch"), [BIG])
    assert mem.states == 2 * 2 * N * 2
    assert mem.step_counters_host == 8
    assert mem.step_temporary == 2 * N * 2  # foreach sqrt copy of the group


def test_bnb_8bit_layout_threshold_and_embedding_override() -> None:
    mem = optimizer_memory(OptimizerSpec("adamw_bnb_8bit"), [BIG, SMALL, EMB])
    big = 2 * (2 * N + 2 * 4 * (N // 256))
    small = 2 * 4 * 1024  # < 4096 elements: fp32 states
    emb = 2 * 4 * 32000 * 4096  # Trainer registers nn.Embedding for 32-bit states
    assert mem.states == big + small + emb + 2 * 1024  # + the two qmaps
    assert mem.states / (2 * N * 2 + 1024 + 32000 * 4096) > 2.0


def test_paged_states_go_to_managed_memory() -> None:
    mem = optimizer_memory(OptimizerSpec("paged_adamw_32bit"), [BIG, SMALL])
    assert mem.managed == 2 * 4 * N * 2  # >= 1e5 elements: managed
    assert mem.states == 2 * 4 * 1024  # small tensors: ordinary allocation


def test_one_and_three_state_optimizers() -> None:
    lion = optimizer_memory(OptimizerSpec("lion_32bit"), [BIG])
    assert lion.states == 4 * N * 2
    ademamix = optimizer_memory(OptimizerSpec("ademamix"), [BIG])
    assert ademamix.states == 3 * 4 * N * 2
    sgd = optimizer_memory(OptimizerSpec("sgd"), [BIG])
    assert sgd.states == 0  # the Trainer passes no momentum
    assert optimizer_memory(OptimizerSpec("sgd", {"momentum": "0.9"}), [BIG]).states == 2 * N * 2


def test_adafactor_factored() -> None:
    mem = optimizer_memory(OptimizerSpec("adafactor"), [BIG, SMALL])
    assert mem.states == 2 * 4 * (4096 + 4096) + 4 * 1024 + 4 * 3


def test_galore_projected_states() -> None:
    mem = optimizer_memory(OptimizerSpec("galore_adamw", {"rank": "64"}), [BIG, SMALL])
    assert mem.projections == 2 * 64 * 4096 * 2
    assert mem.states == 2 * 2 * 64 * 4096 * 2 + 2 * 1024 * 2
    with pytest.raises(NotModelledError):
        optimizer_memory(OptimizerSpec("galore_adamw"), [SMALL])


def test_torchao_8bit() -> None:
    mem = optimizer_memory(OptimizerSpec("adamw_torch_8bit"), [BIG, SMALL])
    assert mem.states == 2 * 2 * (N + 4 * N // 256 + 1024) + 2 * 1024 * 2


def test_adamw_hf_kept_on_a_stack_that_still_has_transformers_adamw() -> None:
    # transformers.AdamW existed through 4.49 (4.49.0 optimization.py) and was removed in 4.50 (PR #36177)
    assert canonical_optimizer("adamw_hf", (4, 49)) == ("adamw_hf", None)
    assert canonical_optimizer("adamw_hf", (4, 16, 2)) == ("adamw_hf", None)
    for release in ((4, 50), (5, 23), None):
        name, finding = canonical_optimizer("adamw_hf", release)
        assert name == "adamw_torch" and finding is not None


def test_transformers_adamw_steps_one_parameter_at_a_time() -> None:
    """transformers.AdamW.step (4.16.2 optimization.py lines 334-361): ``denom = exp_avg_sq.sqrt().add_(eps)`` per
    parameter, the previous parameter's ``denom`` still bound; states as torch's; ``state["step"]`` an int."""
    a = TensorGroup("a", (1024, 1024), Dtype.FLOAT32)  # 4 MiB
    b = TensorGroup("b", (3 * 1024, 1024), Dtype.FLOAT32)  # 12 MiB
    c = TensorGroup("c", (2 * 1024, 1024), Dtype.FLOAT32)  # 8 MiB
    hf = optimizer_memory(OptimizerSpec("adamw_hf"), [a, b, c], transformers=(4, 16))
    torch_adamw = optimizer_memory(OptimizerSpec("adamw_torch"), [a, b, c], transformers=(4, 16))
    assert hf.states == torch_adamw.states == 2 * 4 * 6 * 1024 * 1024
    assert hf.step_temporary == (12 + 8) * 1024 * 1024  # b's denom bound while c's sqrt is allocated
    assert torch_adamw.step_temporary == 24 * 1024 * 1024  # foreach: the sqrt of every exp_avg_sq at once
    assert hf.step_counters_host == hf.step_counters_device == 0
    # one loop over both groups: the last decayed tensor's denom is bound when the first no-decay sqrt allocates
    n = TensorGroup("n", (2 * 1024, 1024), Dtype.FLOAT32, decay=False)  # 8 MiB
    assert optimizer_memory(OptimizerSpec("adamw_hf"), [a, b, n], transformers=(4, 16)).step_temporary == (
        (12 + 8) * 1024 * 1024)
    # on a 5.x stack the name is retired: torch AdamW, as before
    assert optimizer_memory(OptimizerSpec("adamw_hf"), [a, b, c]).step_temporary == torch_adamw.step_temporary


def test_reader_keeps_adamw_hf_for_an_old_stack_only() -> None:
    from fitcheck.readers import inventory_from_config, spec_from_values

    inv = inventory_from_config(
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256}, "tiny", "test")
    old, _ = spec_from_values({"optim": "adamw_hf", "stack": "transformers=4.45"}, inventory=inv)
    new, _ = spec_from_values({"optim": "adamw_hf"}, inventory=inv)
    assert old.optimizer.name == "adamw_hf" and new.optimizer.name == "adamw_torch"
