"""What TRL's DPO / KTO / reward trainers run that the plain step does not: no dropout, and TRL's fused LM head.

- ``disable_dropout`` (DPOConfig / KTOConfig / RewardConfig default True): ``disable_dropout_in_model``
  (``trl/trainer/utils.py``) sets every ``torch.nn.Dropout``'s ``p`` to 0 before step 1, the family's own dropout
  modules included (GPT-2's ``attn_pdrop`` / ``resid_pdrop`` / ``embd_pdrop``). The formula zeroes them
  (``core.trainers.step_spec``: ``FamilyTraits.dropout_modules_disabled``), keeping the probabilities a family
  passes as a float (BLOOM's / Falcon's ``dropout_add``, Phi's attention dropout); the traced path switches the
  modules off too (``trace_step(disable_dropout=True)``).
- The fused head takes away from the saved activations only the LM head input they count (a trained head's;
  ``core.activations.lm_head_input_saved``), not the whole last hidden state: every LoRA row was -0.3 %.

The real runs are ``benchmarks/trl_replay.py``'s recorded rows (``benchmarks/data/trl_replay_cpu.json``).
"""

from __future__ import annotations

import dataclasses

import pytest
from trl_replay_rows import check_replay_row, recorded_rows

from fitcheck.core import estimate
from fitcheck.core.trainers import step_spec
from fitcheck.readers import inventory_from_config
from fitcheck.report import Phase
from fitcheck.spec import LoraSpec, TrainerKind, TrainerSpec, TrainingSpec


def _spec(config: dict[str, object], kind: TrainerKind) -> TrainingSpec:
    from fitcheck.spec import BatchSpec

    inv = inventory_from_config(config, "tiny", "tests/test_trl_dropout.py")
    trainer = TrainerSpec(kind=kind, prompt_length=8, completion_length=8) if kind is not TrainerKind.REWARD \
        else TrainerSpec(kind=kind)
    return TrainingSpec(model=inv, batch=BatchSpec(micro_batch=1, seq_len=16), trainer=trainer,
                        lora=LoraSpec(r=8, dropout=0.05, target_modules=("all-linear",)))


_GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "n_layer": 2,
         "vocab_size": 256, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}


@pytest.mark.parametrize("kind", (TrainerKind.DPO, TrainerKind.KTO, TrainerKind.REWARD))
def test_the_trainers_that_disable_dropout_run_the_family_without_its_dropout_modules(kind: TrainerKind) -> None:
    run = step_spec(_spec(_GPT2, kind))
    traits = run.model.shape.traits
    assert (traits.dropout.attention, traits.dropout.hidden, traits.dropout.embedding) == (0.0, 0.0, 0.0)
    assert traits.classifier_dropout == 0.0
    assert run.lora is not None and run.lora.dropout == 0.0
    sft = step_spec(_spec(_GPT2, TrainerKind.SFT))  # SFTConfig keeps dropout (disable_dropout is not its field)
    assert sft.model.shape.traits.dropout.hidden == 0.1 and sft.lora is not None and sft.lora.dropout == 0.05


def test_a_dropout_passed_as_a_float_stays() -> None:
    """Phi's attention dropout (a float given to the attention function), BLOOM's / Falcon's hidden dropout
    (``dropout_add``'s ``F.dropout(p=config.hidden_dropout)``) are no ``nn.Dropout``: TRL leaves them on."""
    phi = {"model_type": "phi", "architectures": ["PhiForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256, "resid_pdrop": 0.1,
           "attention_dropout": 0.1, "embd_pdrop": 0.1}
    drop = step_spec(_spec(phi, TrainerKind.DPO)).model.shape.traits.dropout
    assert (drop.attention, drop.hidden, drop.embedding) == (0.1, 0.0, 0.0)
    bloom = {"model_type": "bloom", "architectures": ["BloomForCausalLM"], "hidden_size": 64, "n_head": 4,
             "n_layer": 2, "vocab_size": 256, "hidden_dropout": 0.1, "attention_dropout": 0.1}
    drop = step_spec(_spec(bloom, TrainerKind.KTO)).model.shape.traits.dropout
    assert (drop.attention, drop.hidden) == (0.0, 0.1)


def test_the_traced_policy_step_runs_without_dropout() -> None:
    """``activation_trace_kwargs`` of a DPO run asks the tracer for no dropout; its fake-tensor trace then holds what
    the same model with every dropout probability 0 in config.json holds (a plain SFT run keeps its dropout)."""
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters import activation_trace_kwargs
    from fitcheck.torch_adapters.tracer import trace_step

    spec = dataclasses.replace(_spec(_GPT2, TrainerKind.DPO), lora=None)
    kwargs = activation_trace_kwargs(spec)
    assert kwargs["disable_dropout"] is True
    assert "disable_dropout" not in activation_trace_kwargs(dataclasses.replace(spec, trainer=TrainerSpec()))
    switched = trace_step(_GPT2, **kwargs).phases
    zero = {**_GPT2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    plain = trace_step(_GPT2, **{**kwargs, "disable_dropout": False}).phases
    config_zero = trace_step(zero, **{**kwargs, "disable_dropout": False}).phases
    for phase, breakdown in switched.items():
        assert breakdown.total == config_zero[phase].total
    end = Phase.FORWARD_END  # the dropout masks and the SDPA math path's s x s tensors, kept for backward
    assert plain[end].total > switched[end].total


_GPT2_ROWS = ("gpt2 dpo full ref no-ckpt", "gpt2 dpo full ref", "gpt2 dpo LoRA no-ckpt", "gpt2 kto full ref no-ckpt",
              "gpt2 kto LoRA no-ckpt", "gpt2 kto LoRA")


def _formula_vs_recorded(case: str) -> tuple[int, int]:
    from benchmark_module import load_benchmark

    bench = load_benchmark("trl_replay")
    (spec_case,) = [c for c in bench.ALL_CASES if c.name == case]
    return estimate(bench.case_spec(spec_case)).peak_allocated_bytes, recorded_rows()[case]["real"]["peak"]


@pytest.mark.parametrize("case", _GPT2_ROWS)
def test_gpt2_under_dpo_and_kto_formula_within_half_a_percent_of_the_real_trainer(case: str) -> None:
    """Real DPOTrainer / KTOTrainer on a tiny GPT-2 (dropout 0.1): main's formula counted the dropout masks (and
    the LoRA adapters' fp32 input copies under autocast): -0.05 % .. +10.7 %, four of the six rows beyond 0.5 %."""
    formula, real = _formula_vs_recorded(case)
    assert formula == pytest.approx(real, rel=0.005)


@pytest.mark.parametrize("case", ("sft LoRA", "sft QLoRA", "dpo LoRA", "dpo LoRA no-ckpt", "kto LoRA",
                                  "kto LoRA no-ckpt", "kto LoRA apo_zero_unpaired (no KL)", "wide dpo LoRA no-ckpt",
                                  "wide kto LoRA"))
def test_lora_rows_formula_within_a_tenth_of_a_percent(case: str) -> None:
    """A frozen LM head keeps no input, so the fused head takes none away: main was -0.31 % .. -0.56 % here (the
    ``wide`` rows: h 512, 4 layers, 2 x (64 + 192) tokens)."""
    formula, real = _formula_vs_recorded(case)
    assert formula == pytest.approx(real, rel=0.001)


@pytest.mark.parametrize("case", ("wide dpo full ref", "wide dpo LoRA no-ckpt", "wide kto full ref no-ckpt",
                                  "wide kto LoRA", *_GPT2_ROWS))
def test_second_shape_and_gpt2_replays_within_a_tenth_of_a_percent(case: str) -> None:
    """The whole-run replay of DPO's / KTO's step at a second shape and on GPT-2 (the plain step: 33-65 % under)."""
    check_replay_row(case)


def test_the_fused_head_takes_away_the_head_input_deepspeed_keeps() -> None:
    """An fp32-loaded model under DeepSpeed bf16 runs a 16-bit module without autocast (``kernels.
    deepspeed_module_view``): the activations count the final norm's 16-bit output as the LM head's input, so the
    fused head takes that away (main before session 18 read the autocast view there: 0 B; Llama-3.2-1B ZeRO-2
    2 x 512 kept 4,194,304 B)."""
    from fitcheck.core.activations import lm_head_input_saved
    from fitcheck.core.kernels import deepspeed_module_view
    from fitcheck.spec import BatchSpec, DeepSpeedSpec, Dtype, MixedPrecision, PrecisionSpec, ShardingSpec, Strategy

    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
             "vocab_size": 256}
    spec = TrainingSpec(model=inventory_from_config(llama, "tiny", "tests/test_trl_dropout.py"),
                        precision=PrecisionSpec(Dtype.FLOAT32, MixedPrecision.BF16),
                        batch=BatchSpec(micro_batch=2, seq_len=16), trainer=TrainerSpec(kind=TrainerKind.SFT),
                        sharding=ShardingSpec(Strategy.DEEPSPEED, 1, 1, DeepSpeedSpec(stage=2)))
    run = step_spec(spec)
    assert lm_head_input_saved(run) == lm_head_input_saved(deepspeed_module_view(run)) == 2 * 64 * 2 * 16
