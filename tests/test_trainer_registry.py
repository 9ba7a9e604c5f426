"""One home per trainer kind and per loss kind (issue 18).

Every module reads the trainer registry (``fitcheck/core/trainers/registry.py``) instead of keeping its own set,
tuple, list or dict of ``TrainerKind`` values, and the loss table (``fitcheck/core/kernels/loss.py LOSSES``)
answers every ``LossKind`` and refuses the rest.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from fitcheck.core.kernels import LOSSES, fused_loss
from fitcheck.core.trainers import TRAINERS, runs_fused_head
from fitcheck.errors import NotModelledError
from fitcheck.spec import LOSS_IMPLEMENTATIONS, ActivationSpec, TrainerKind

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "fitcheck" / "core" / "trainers" / "registry.py"


def _names_a_kind(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "TrainerKind"


def trainer_kind_tables(root: Path) -> list[str]:
    """``file:line`` of every set/tuple/list/dict literal holding a ``TrainerKind.X`` outside the registry."""
    found = []
    files = [*sorted((root / "fitcheck").rglob("*.py")), *sorted((root / "integrations").glob("*.py"))]
    for path in files:
        if path == root / "fitcheck" / "core" / "trainers" / "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = [*(k for k in node.keys if k is not None), *node.values]
            else:
                continue
            if any(_names_a_kind(item) for item in items):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_trainer_kind_table_outside_the_registry() -> None:
    tables = trainer_kind_tables(ROOT)
    assert not tables, ("TrainerKind sets/tables outside fitcheck/core/trainers/registry.py (read a registry "
                        "column instead):\n" + "\n".join(tables))


def test_every_trainer_kind_has_one_row() -> None:
    assert set(TRAINERS) == set(TrainerKind)
    for kind, row in TRAINERS.items():
        assert row.kind is kind
        assert (row.config_class is None) == (kind is TrainerKind.TRAINER)
        assert set(row.script_fields) <= {*row.defaults, "loss_type", "generation_batch_size",
                                          "steps_per_generation"}


def test_kto_runs_the_fused_head() -> None:
    # trl/trainer/kto_trainer.py L967-970 (TRL 1.16): add_fused_lm_head(outputs=log_probs, entropy, mean_logits)
    assert runs_fused_head(TrainerKind.KTO)
    assert not runs_fused_head(TrainerKind.TRAINER) and not runs_fused_head(TrainerKind.REWARD)


def test_full_logits_is_a_dpo_and_kto_variant_only() -> None:
    # --loss full-logits: LLaMA-Factory's CustomDPOTrainer / CustomKTOTrainer read the full logits
    assert not runs_fused_head(TrainerKind.DPO, "full-logits") and runs_fused_head(TrainerKind.DPO)
    assert not runs_fused_head(TrainerKind.KTO, "full-logits") and runs_fused_head(TrainerKind.KTO)
    assert runs_fused_head(TrainerKind.SFT, "full-logits") and runs_fused_head(TrainerKind.GRPO, "full-logits")


def test_every_loss_kind_has_a_row() -> None:
    assert set(LOSSES) == set(LOSS_IMPLEMENTATIONS)
    full = ("torch", "full-logits")  # the full-logits terms of fitcheck.core.activations, not a fused row
    assert all((LOSSES[k] is None) == (k in full) for k in LOSS_IMPLEMENTATIONS)


def _spec(loss: str):  # type: ignore[no-untyped-def]
    from tiny_models import spec_from_config

    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 172, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 1000, "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
    spec = spec_from_config(config)
    return dataclasses.replace(spec, activations=dataclasses.replace(spec.activations, loss=loss))


@pytest.mark.parametrize("loss", LOSS_IMPLEMENTATIONS)
def test_each_loss_answers_its_own_bytes(loss: str) -> None:
    out = fused_loss(_spec(loss), act_bytes=2, residual_bytes=2, autocast=False)
    assert (out is None) == (loss in ("torch", "full-logits"))
    if out is not None:
        assert ("Liger" in out.detail) == (loss == "liger-flce") and ("Cut Cross" in out.detail) == (loss == "cce")


def test_an_unknown_loss_is_an_error_not_cce_bytes() -> None:
    # before the table, anything not torch/Liger fell through to Cut Cross-Entropy's bytes
    assert ActivationSpec(loss="chunked").loss == "chunked"  # type: ignore[arg-type]
    with pytest.raises(NotModelledError, match="chunked"):
        fused_loss(_spec("chunked"), act_bytes=2, residual_bytes=2, autocast=False)
