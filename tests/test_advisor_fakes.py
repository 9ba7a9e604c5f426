"""Test doubles for the advisor/compute/tuner tests: a hand-built Llama inventory and a stand-in estimate.

The stand-in estimate is deliberately simple (Korthikanti-style activations, textbook model states), so that
the advisor, the batch search and the tuner can be tested on their own logic, independent of the real
estimator's numbers. Tests of the real pipeline use ``fitcheck.core.estimator.estimate``.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families import traits_of_type
from fitcheck.report import PHASES, Category, Component, Location, Phase, Report
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    Dtype,
    HardwareSpec,
    Kind,
    MixedPrecision,
    ModelInventory,
    ModelShape,
    OffloadDevice,
    ParamEntry,
    PrecisionSpec,
    Role,
    Strategy,
    TrainingSpec,
)

GIB = 1024**3


def llama_inventory(
    h: int = 4096,
    layers: int = 32,
    heads: int = 32,
    kv: int = 8,
    inter: int = 14336,
    vocab: int = 128256,
    tied: bool = False,
    model_id: str = "test/llama-3.1-8b-shape",
) -> ModelInventory:
    """A Llama-family inventory (names as transformers' LlamaForCausalLM)."""
    hd = h // heads
    per = "model.layers.*."
    lin = [
        ("self_attn.q_proj", h, heads * hd, Role.ATTENTION),
        ("self_attn.k_proj", h, kv * hd, Role.ATTENTION),
        ("self_attn.v_proj", h, kv * hd, Role.ATTENTION),
        ("self_attn.o_proj", heads * hd, h, Role.ATTENTION),
        ("mlp.gate_proj", h, inter, Role.MLP),
        ("mlp.up_proj", h, inter, Role.MLP),
        ("mlp.down_proj", inter, h, Role.MLP),
    ]
    params = [
        ParamEntry("model.embed_tokens.weight", (vocab, h), Role.EMBEDDING, Kind.EMBEDDING, 1, "embed_tokens")
    ]
    for name, fin, fout, role in lin:
        params.append(
            ParamEntry(
                f"{per}{name}.weight", (fout, fin), role, Kind.LINEAR, layers, name.split(".")[-1], fin, fout
            )
        )
    for norm in ("input_layernorm", "post_attention_layernorm"):
        params.append(ParamEntry(f"{per}{norm}.weight", (h,), Role.NORM, Kind.NORM, layers, norm))
    params.append(ParamEntry("model.norm.weight", (h,), Role.NORM, Kind.NORM, 1, "norm"))
    if not tied:
        params.append(
            ParamEntry("lm_head.weight", (vocab, h), Role.LM_HEAD, Kind.LINEAR, 1, "lm_head", h, vocab)
        )
    shape = ModelShape(
        family="llama",
        traits=traits_of_type("llama"),
        architecture="LlamaForCausalLM",
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        config_dtype=Dtype.BFLOAT16,
    )
    return ModelInventory(model_id=model_id, shape=shape, params=tuple(params))


def llama8b_spec(micro: int = 1, seq: int = 4096, gas: int = 1, **hw: object) -> TrainingSpec:
    """Llama-3.1-8B shape, bf16 weights + bf16 autocast, adamw_torch_fused, one H100-80GB."""
    return TrainingSpec(
        model=llama_inventory(),
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16),
        batch=BatchSpec(micro_batch=micro, seq_len=seq, grad_accum=gas),
        activations=ActivationSpec(attn_implementation=AttnImpl.SDPA),
        hardware=HardwareSpec(
            gpu_name="H100-80GB", gpu_memory_bytes=int(hw.get("mem", 80 * GIB)), peak_tflops_bf16=989.0
        ),
    )


def _trainable(spec: TrainingSpec) -> int:
    if spec.lora is not None:
        from fitcheck.core.states.lora import adapter_param_count

        return adapter_param_count(spec)
    return spec.model.total_params


def fake_estimate(spec: TrainingSpec) -> Report:
    """A stand-in estimator: textbook model states + Korthikanti activations + full-vocab logits."""
    s, h, L = spec.model.shape, spec.model.shape.hidden_size, spec.model.shape.num_layers
    n = spec.data_parallel_size
    ds = spec.sharding.deepspeed if spec.sharding.strategy is Strategy.DEEPSPEED else None
    stage = ds.stage if ds is not None else 0
    p_total = spec.model.total_params
    wb = spec.precision.load_dtype.nbytes
    weights = p_total * (0.52 if spec.quant is not None else wb)
    trainable = _trainable(spec)
    tb = 4 if spec.lora is not None else wb
    grads = trainable * tb
    per_state = 1 if "8bit" in spec.optimizer.name else tb
    optim = trainable * 2 * per_state
    if stage >= 3:
        weights /= n
    if stage >= 2:
        grads /= n
    if stage >= 1:
        optim /= n
    off_opt = ds is not None and ds.offload_optimizer is not OffloadDevice.NONE
    off_par = ds is not None and ds.offload_param is not OffloadDevice.NONE
    tokens = spec.batch.micro_batch * spec.batch.seq_len
    per_layer = tokens * h * 34 + (
        5 * s.num_heads * spec.batch.seq_len * tokens
        if spec.activations.attn_implementation is AttnImpl.EAGER
        else 0
    )
    if spec.activations.checkpointing:
        every = spec.activations.checkpoint_every_n_layers
        ckpt_layers = L // every
        acts = ckpt_layers * tokens * h * 2 + (L - ckpt_layers) * per_layer + per_layer
    else:
        acts = L * per_layer
    logits = 0 if spec.activations.loss == "chunked" else tokens * s.vocab_size * 10

    def comp(name: str, cat: Category, nbytes: float, loc: Location = Location.DEVICE) -> Component:
        return Component.persistent(name, cat, int(nbytes), "test double", location=loc)

    comps = [
        comp("weights", Category.WEIGHTS, weights, Location.HOST if off_par else Location.DEVICE),
        comp("gradients", Category.GRADIENTS, grads),
        comp("optimizer", Category.OPTIMIZER, optim, Location.HOST if off_opt else Location.DEVICE),
        Component(
            "activations", Category.ACTIVATIONS, Location.DEVICE, {Phase.BACKWARD_START: int(acts)}, "test"
        ),
        Component("logits", Category.LOGITS, Location.DEVICE, {Phase.BACKWARD_START: int(logits)}, "test"),
        comp("cuda_context", Category.OVERHEAD, 512 * 1024**2, Location.DEVICE_OTHER),
    ]
    if off_par:  # one gathered layer stays on the GPU
        comps.append(comp("gathered", Category.BUFFERS, p_total / L * wb))
    totals = {p: sum(c.at(p) for c in comps if c.location is Location.DEVICE) for p in PHASES}
    phase = max(PHASES, key=lambda p: totals[p])
    used = totals[phase] + 512 * 1024**2
    host = sum(c.peak_bytes for c in comps if c.location is Location.HOST)
    return Report(
        spec=spec,
        components=tuple(comps),
        peak_phase=phase,
        peak_allocated_bytes=totals[phase],
        peak_reserved_bytes=totals[phase],
        device_used_bytes=used,
        budget_bytes=spec.hardware.gpu_memory_bytes,
        host_bytes=host,
        fits=used <= spec.hardware.gpu_memory_bytes,
        findings=(),
        regime="test double",
        trainable_params=trainable,
        total_params=p_total,
    )


def with_budget(spec: TrainingSpec, gib: float) -> TrainingSpec:
    """The spec on a GPU with ``gib`` GiB."""
    return replace(spec, hardware=replace(spec.hardware, gpu_memory_bytes=int(gib * GIB)))


def test_llama_inventory_matches_the_published_8b_count() -> None:
    # 8,030,261,248 = meta-device count of meta-llama/Llama-3.1-8B (design note 04).
    assert llama_inventory().total_params == 8_030_261_248


def test_fake_estimate_grows_with_micro_batch() -> None:
    small = fake_estimate(llama8b_spec(micro=1)).peak_allocated_bytes
    big = fake_estimate(llama8b_spec(micro=2)).peak_allocated_bytes
    assert big > small



def test_a_suggestion_that_only_adds_changes_without_gain_is_dropped() -> None:
    from fitcheck.advice.advisor import Suggestion, Tier, _dominates

    def make(argv: tuple[str, ...], used: int) -> Suggestion:
        return Suggestion(title="t", argv=argv, changes=(), peak_allocated_bytes=used, device_used_bytes=used,
                          fits=True, relative_step_time=1.0, host_bytes=0, tier=Tier.SAME_TRAINING,
                          micro_batch=1, grad_accum=2)

    small = make(("--per_device_train_batch_size", "1"), 10)
    more = make(("--loss", "chunked", "--per_device_train_batch_size", "1"), 10)
    assert _dominates(small, more) and not _dominates(more, small)
    better = make(("--loss", "chunked", "--per_device_train_batch_size", "1"), 5)
    assert not _dominates(small, better)  # the extra change buys memory: keep it
