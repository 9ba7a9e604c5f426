"""Model-state memory in the pure core: regimes, QLoRA on Llama-3-8B, and the seeds' worked examples."""

from __future__ import annotations

import pytest
from test_model_states_inventories import catalog, llama_like, mixtral_like

from fitcheck.core.states.model_states import (
    describe_regime,
    model_state_components,
    model_state_findings,
    trainable_params,
)
from fitcheck.core.states.quantization import quantized_bytes
from fitcheck.families import traits_of_type
from fitcheck.report import Component, Location, Phase
from fitcheck.spec import (
    DeepSpeedSpec,
    Dtype,
    FreezeSpec,
    Kind,
    LoraSpec,
    MixedPrecision,
    ModelInventory,
    ModelShape,
    OffloadDevice,
    OptimizerSpec,
    ParamEntry,
    PrecisionSpec,
    QuantSpec,
    Role,
    ShardingSpec,
    Strategy,
    TrainingSpec,
)

GB = 10**9
BF16 = PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16)


def _c(spec: TrainingSpec) -> dict[str, Component]:
    return {c.name: c for c in model_state_components(spec)}


def _device_at(spec: TrainingSpec, phase: Phase) -> int:
    return sum(c.at(phase) for c in model_state_components(spec) if c.location is Location.DEVICE)


def _synthetic(params: int) -> ModelInventory:
    """`params` parameters in four equal Linear weights (for the seeds' round-number arithmetic)."""
    rows = params // 4 // 20000
    shape = ModelShape("llama", "LlamaForCausalLM", 4096, 4, 32, 32, 128, 11008, 32000, traits=traits_of_type("llama"))
    entry = ParamEntry(
        "model.layers.*.mlp.up_proj.weight", (rows, 20000), Role.MLP, Kind.LINEAR, 4, "up_proj", 20000, rows
    )
    return ModelInventory("synthetic-2b", shape, (entry,))


def test_llama3_8b_inventory_totals() -> None:
    assert llama_like().total_params == 8_030_261_248  # design note 04 (meta device)
    assert mixtral_like().total_params == 46_702_792_704


@pytest.mark.parametrize(
    ("model_id", "hand_built"),
    [("meta-llama/Meta-Llama-3-8B", llama_like), ("mistralai/Mixtral-8x7B-v0.1", mixtral_like)],
)
def test_hand_built_inventories_equal_the_reader(model_id: str, hand_built: object) -> None:
    """The tests' inventories are the reader's (names, shapes, kinds, roles, order)."""
    real = catalog(model_id)
    mine = hand_built()  # type: ignore[operator]
    assert [(p.name, p.shape, p.kind, p.role, p.repeat) for p in real.params] == [
        (p.name, p.shape, p.kind, p.role, p.repeat) for p in mine.params
    ]


def test_full_ft_bf16_adamw_regime_a_and_phases() -> None:
    spec = TrainingSpec(
        model=catalog("meta-llama/Meta-Llama-3-8B"), precision=BF16, optimizer=OptimizerSpec("adamw_torch")
    )
    c = _c(spec)
    p = 8_030_261_248
    assert c["weights.trainable"].at(Phase.FORWARD_END) == 2 * p
    assert c["gradients"].at(Phase.FORWARD_END) == 0  # set_to_none after the previous step
    assert c["gradients"].at(Phase.BACKWARD) == 2 * p
    assert c["optimizer.states"].at(Phase.FORWARD_END) == 4 * p  # bf16 exp_avg + exp_avg_sq
    assert "master.fp32" not in c
    # foreach temporary: sqrt of the decay group's exp_avg_sq (all but the 65 norm vectors), bf16
    assert c["optimizer.step_temporaries"].at(Phase.OPTIMIZER_STEP) == 2 * (p - 65 * 4096)
    assert c["optimizer.step_temporaries"].at(Phase.BACKWARD) == 0
    assert "no fp32 master copy" in describe_regime(spec)
    fused = _c(TrainingSpec(model=llama_like(), precision=BF16, optimizer=OptimizerSpec("adamw_torch_fused")))
    assert "optimizer.step_temporaries" not in fused
    assert fused["optimizer.step_counters"].location is Location.DEVICE


def test_grad_accum_keeps_gradients_through_forward() -> None:
    from fitcheck.spec import BatchSpec

    spec = TrainingSpec(model=llama_like(), precision=BF16, batch=BatchSpec(grad_accum=4))
    assert _c(spec)["gradients"].at(Phase.FORWARD_END) == 2 * 8_030_261_248


def test_fp32_autocast_regime_b() -> None:
    spec = TrainingSpec(model=llama_like(), precision=PrecisionSpec(Dtype.FLOAT32, MixedPrecision.BF16))
    c = _c(spec)
    assert c["weights.trainable"].at(Phase.BACKWARD) == 4 * 8_030_261_248
    assert c["optimizer.states"].at(Phase.BACKWARD) == 8 * 8_030_261_248
    assert "bf16 autocast" in describe_regime(spec)


def test_qlora_nf4_double_quant_llama3_8b() -> None:
    spec = TrainingSpec(
        model=catalog("meta-llama/Meta-Llama-3-8B"),
        precision=BF16,
        lora=LoraSpec(r=16, alpha=32, target_modules=("all-linear",)),
        quant=QuantSpec(bits=4, quant_type="nf4", double_quant=True, compute_dtype=Dtype.BFLOAT16),
    )
    c = _c(spec)
    quant = c["weights.quantized"].at(Phase.FORWARD_END) + c["quantization.metadata"].at(Phase.FORWARD_END)
    quantized = 8_030_261_248 - 1_050_939_392  # all Linear weights but lm_head; embeddings and norms excluded
    expected = sum(
        quantized_bytes(e.numel_each, spec.quant, e.out_features).total * e.repeat  # type: ignore[arg-type]
        for e in spec.model.params
        if e.kind is Kind.LINEAR and e.role is not Role.LM_HEAD
    )
    assert quant == expected
    # the measured table (design note 04): 0.515934 B/param at 4096x4096; the model mixes shapes
    assert 0.51586 < quant / quantized < 0.51594
    assert quantized_bytes(4096 * 4096, spec.quant).total / (4096 * 4096) == pytest.approx(0.515934, abs=5e-7)
    assert trainable_params(spec) == 41_943_040
    assert c["adapters.lora"].at(Phase.FORWARD_END) == 4 * 41_943_040
    assert c["gradients"].at(Phase.BACKWARD) == 4 * 41_943_040
    assert c["optimizer.states"].at(Phase.FORWARD_END) == 8 * 41_943_040
    # prepare_model_for_kbit_training: embeddings, lm_head and norms to fp32
    assert c["weights.frozen"].at(Phase.FORWARD_END) == 4 * 1_050_939_392
    assert any(f.code == "kbit-fp32-upcast" for f in model_state_findings(spec))


def test_seed_2b_adam_arithmetic() -> None:
    """Seed: "2B params with Adam: 4 GB weights + 4 GB grads + 16 GB Adam + a master copy".

    Right only for DeepSpeed-style mixed precision (regime c): 16-bit weights 4 GB, 16-bit grads 4 GB, fp32
    Adam
    16 GB, fp32 master 8 GB = 32 GB (+ an 8 GB fp32 gradient partition built during the step). NOTE where
    the seed
    is wrong: with the HF Trainer and plain torch AdamW there is no master copy — a bf16-loaded model keeps
    bf16 Adam states (8 GB, total 16 GB), an fp32-loaded one keeps fp32 weights (8 GB, total 32 GB).
    """
    inv = _synthetic(2 * GB)
    assert inv.total_params == 2 * GB
    ds = TrainingSpec(
        model=inv,
        precision=BF16,
        optimizer=OptimizerSpec("adamw_torch"),
        sharding=ShardingSpec(Strategy.DEEPSPEED, 1, deepspeed=DeepSpeedSpec(stage=0)),
    )
    c = _c(ds)
    assert c["weights.trainable"].at(Phase.BACKWARD) == 4 * GB
    assert c["gradients"].at(Phase.BACKWARD) == 4 * GB
    assert c["optimizer.states"].at(Phase.BACKWARD) == 16 * GB
    assert c["master.fp32"].at(Phase.BACKWARD) == 8 * GB
    assert c["gradients.fp32_partition"].at(Phase.OPTIMIZER_STEP) == 8 * GB
    assert "fp32 master" in describe_regime(ds)
    plain = _c(TrainingSpec(model=inv, precision=BF16, optimizer=OptimizerSpec("adamw_torch")))
    assert plain["optimizer.states"].at(Phase.BACKWARD) == 8 * GB and "master.fp32" not in plain
    zero2 = _c(
        TrainingSpec(
            model=inv,
            precision=BF16,
            sharding=ShardingSpec(Strategy.DEEPSPEED, 8, deepspeed=DeepSpeedSpec(stage=2)),
        )
    )
    assert zero2["weights.trainable"].at(Phase.BACKWARD) == 4 * GB  # 16-bit params replicated under ZeRO-2
    assert zero2["optimizer.states"].at(Phase.BACKWARD) == 2 * GB  # 16 GB / 8
    assert zero2["master.fp32"].at(Phase.BACKWARD) == GB
    offload = _c(
        TrainingSpec(
            model=inv,
            precision=BF16,
            sharding=ShardingSpec(
                Strategy.DEEPSPEED, 8, deepspeed=DeepSpeedSpec(stage=2, offload_optimizer=OffloadDevice.CPU)
            ),
        )
    )
    assert offload["optimizer.states"].location is Location.HOST
    assert offload["optimizer.states"].at(Phase.BACKWARD) == 16 * GB  # 8 processes x 2 GB on one node


def test_seed_mixtral_router_only() -> None:
    """Seed: Mixtral-8x7B, router only trained, on a 44 GB card.

    NOTE: the seed counted only the router's states; the frozen bf16 weights stay resident: 93.4 GB > 44 GB.
    """
    spec = TrainingSpec(
        model=mixtral_like(), precision=BF16, freeze=FreezeSpec(trainable=("*.mlp.gate.weight",))
    )
    c = _c(spec)
    assert trainable_params(spec) == 32 * 8 * 4096 == 1_048_576
    assert c["gradients"].at(Phase.BACKWARD) == 2 * 1_048_576
    assert c["optimizer.states"].at(Phase.BACKWARD) == 4 * 1_048_576
    weights = c["weights.frozen"].at(Phase.FORWARD_END) + c["weights.trainable"].at(Phase.FORWARD_END)
    assert weights == 2 * 46_702_792_704
    assert _device_at(spec, Phase.OPTIMIZER_STEP) > 44 * GB


def test_seed_mixtral_six_layers_two_experts_and_router() -> None:
    """Seed: Mixtral-8x7B, 6 layers x 2 experts + router trainable.

    NOTE: transformers 5 stores each layer's 8 experts as two fused 3-D tensors, and requires_grad is per
    tensor:
    "2 experts" cannot be selected without gradient masking, so all 8 experts of the 6 layers train (4x the
    seed's expert count), and the 93 GB of frozen bf16 weights stay resident.
    """
    spec = TrainingSpec(
        model=mixtral_like(),
        precision=BF16,
        freeze=FreezeSpec(
            trainable=("*.mlp.experts.*", "*.mlp.gate.weight"), trainable_layers=tuple(range(6))
        ),
    )
    per_layer_experts = 8 * 28672 * 4096 + 8 * 4096 * 14336
    n = 6 * per_layer_experts + 6 * 8 * 4096
    assert trainable_params(spec) == n == 8_455_913_472
    c = _c(spec)
    assert c["optimizer.states"].at(Phase.BACKWARD) == 4 * n
    assert _device_at(spec, Phase.OPTIMIZER_STEP) > 140 * GB


def test_seed_mixtral_4bit_lora_experts_router_44gb() -> None:
    """Seed: 4-bit base + LoRA r=16 on experts and router, 44 GB card (design note 04: experts stay bf16)."""
    spec = TrainingSpec(
        model=mixtral_like(),
        precision=BF16,
        lora=LoraSpec(r=16, alpha=32, target_modules=("w1", "w2", "w3", "gate")),
        quant=QuantSpec(bits=4, double_quant=True, compute_dtype=Dtype.BFLOAT16),
    )
    c = _c(spec)
    per_layer = 16 * (4096 + 8) + 32 * 8 * (28672 + 4096) + 16 * 8 * (4096 + 14336)
    assert trainable_params(spec) == 32 * per_layer == 346_034_176
    experts = 32 * (8 * 28672 * 4096 + 8 * 4096 * 14336)
    # prepare_model_for_kbit_training upcasts the unquantized bf16 experts to fp32: ~180 GB
    assert c["weights.frozen"].at(Phase.FORWARD_END) >= 4 * experts
    assert _device_at(spec, Phase.FORWARD_END) > 44 * GB
    codes = {f.code: f for f in model_state_findings(spec)}
    assert (
        "quantization-mostly-skipped" in codes
        and "fused 3-D MoE expert" in codes["quantization-mostly-skipped"].message
    )
    no_prepare = TrainingSpec(
        model=spec.model,
        precision=BF16,
        lora=spec.lora,
        quant=QuantSpec(double_quant=True, prepare_for_kbit_training=False),
    )
    assert _c(no_prepare)["weights.frozen"].at(Phase.FORWARD_END) >= 2 * experts > 44 * GB
    dropout = TrainingSpec(
        model=spec.model,
        precision=BF16,
        quant=spec.quant,
        lora=LoraSpec(r=16, dropout=0.05, target_modules=("w1", "w2", "w3", "gate")),
    )
    assert "peft-refuses-config" in {f.code for f in model_state_findings(dropout)}


def test_zero3_partitions_weights_and_lora_frozen_base() -> None:
    spec = TrainingSpec(
        model=llama_like(),
        precision=BF16,
        lora=LoraSpec(r=16, target_modules=("all-linear",)),
        sharding=ShardingSpec(Strategy.DEEPSPEED, 8, deepspeed=DeepSpeedSpec(stage=3)),
    )
    c = _c(spec)
    assert c["weights.frozen"].at(Phase.FORWARD_END) == -(-(2 * 8_030_261_248) // 8)
    assert c["master.fp32"].at(Phase.FORWARD_END) == 4 * 41_943_040 // 8
    assert c["adapters.lora"].at(Phase.FORWARD_END) == 2 * 41_943_040 // 8  # DeepSpeed casts adapters to bf16


def test_fp16_gradscaler_error_and_quantized_full_ft_error() -> None:
    fp16 = TrainingSpec(
        model=llama_like(**{"layers": 1}), precision=PrecisionSpec(Dtype.FLOAT16, MixedPrecision.FP16)
    )
    assert "fp16-gradscaler" in {f.code for f in model_state_findings(fp16)}
    q = TrainingSpec(model=llama_like(layers=1), precision=BF16, quant=QuantSpec())
    assert "quantized-full-finetune" in {f.code for f in model_state_findings(q)}


def test_paged_optimizer_outside_allocator() -> None:
    spec = TrainingSpec(model=llama_like(), precision=BF16, optimizer=OptimizerSpec("paged_adamw_8bit"))
    c = _c(spec)
    assert c["optimizer.states_paged"].location is Location.DEVICE_OTHER
    assert "paged-optimizer" in {f.code for f in model_state_findings(spec)}


def test_layerwise_galore_has_no_full_gradient_set() -> None:
    spec = TrainingSpec(
        model=llama_like(),
        precision=BF16,
        optimizer=OptimizerSpec("galore_adamw_layerwise", {"rank": "64"}, ("attn", "mlp")),
    )
    c = _c(spec)
    assert c["gradients"].at(Phase.BACKWARD) == 2 * 128256 * 4096  # the largest single gradient
    assert c["gradients"].at(Phase.OPTIMIZER_STEP) == 0
    assert c["optimizer.projections"].at(Phase.FORWARD_END) > 0
