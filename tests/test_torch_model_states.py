"""Cross-checks of the pure model-state core against what torch / peft / bitsandbytes really allocate.

Every test builds real library objects from configs (meta device or FakeTensorMode; no weights, no network)
and compares storage bytes with ``fitcheck.core.states.model_states`` to the byte.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_model_states_inventories import llama_like, mixtral_like  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from fitcheck.core.optimizers.by_name import OptimizerMemory, TensorGroup, optimizer_memory  # noqa: E402
from fitcheck.core.states.lora import plan_lora  # noqa: E402
from fitcheck.core.states.model_states import model_state_components  # noqa: E402
from fitcheck.core.states.quantization import quantized_bytes  # noqa: E402
from fitcheck.report import Component, Phase  # noqa: E402
from fitcheck.spec import (  # noqa: E402
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    ModelInventory,
    OptimizerSpec,
    PrecisionSpec,
    QuantSpec,
    TrainingSpec,
)

SMALL = {"vocab": 512, "hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 512}


def _llama_config(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int) -> Any:
    return transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        tie_word_embeddings=False,
    )


def _meta_model(config: Any, dtype: Any) -> Any:
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)


def _nbytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[id(st) if t.device.type == "meta" else st.data_ptr() or id(st)] = st.nbytes()
    return sum(seen.values())


def _by_name(comps: tuple[Component, ...]) -> dict[str, Component]:
    return {c.name: c for c in comps}


def _spec(
    inv: ModelInventory, optim: str = "adamw_torch", device: DeviceType = DeviceType.CUDA
) -> TrainingSpec:
    return TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16),
        optimizer=OptimizerSpec(optim),
        hardware=HardwareSpec(device_type=device),
    )


def _check_inventory_matches(model: Any, inv: ModelInventory) -> None:
    real = {n: tuple(p.shape) for n, p in model.named_parameters()}
    expanded: dict[str, tuple[int, ...]] = {}
    for e in inv.params:
        names = [e.name.replace("*", str(i), 1) for i in range(e.repeat)] if "*" in e.name else [e.name]
        for n in names:
            expanded[n] = e.shape
    assert expanded == real


@pytest.mark.slow
def test_llama3_8b_full_ft_adamw_equals_torch_to_the_byte() -> None:
    """Llama-3-8B bf16, torch AdamW: params, grads and states of a real step on the meta device."""
    config = _llama_config(128256, 4096, 32, 32, 8, 14336)
    model = _meta_model(config, torch.bfloat16)
    inv = llama_like()
    _check_inventory_matches(model, inv)
    params = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in params) == 8_030_261_248
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(params, lr=1e-5, foreach=False)
    opt.step()
    state = [t for s in opt.state.values() for t in s.values()]
    on_device = [t for t in state if t.device.type == "meta"]
    on_host = [t for t in state if t.device.type == "cpu"]  # the 0-d step counters

    comps = _by_name(model_state_components(_spec(inv)))
    assert comps["weights.trainable"].at(Phase.OPTIMIZER_STEP) == _nbytes(params) == 16_060_522_496
    assert comps["gradients"].at(Phase.OPTIMIZER_STEP) == _nbytes(p.grad for p in params)
    assert comps["optimizer.states"].at(Phase.OPTIMIZER_STEP) == _nbytes(on_device) == 32_121_044_992
    assert comps["optimizer.step_counters"].at(Phase.OPTIMIZER_STEP) == 4 * len(on_host) == 4 * 291


class _LiveBytes(TorchDispatchMode):
    """Counts bytes of storages created under the mode while they are alive; records the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _track(self, t: Any) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._seen:
            return
        self._seen.add(key)
        n = st.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)

        def release(k: int = key, size: int = n) -> None:
            self.live -= size
            self._seen.discard(k)

        weakref.finalize(st, release)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else [out]:
            views = ("aten::detach", "aten::view", "aten::alias")
            in_place = any(a.is_write for a in func._schema.arguments if a.alias_info is not None)
            if isinstance(t, torch.Tensor) and func._schema.name not in views and not in_place:
                self._track(t)
        return out


def _trainer_groups(model: Any) -> list[dict[str, Any]]:
    # transformers Trainer.create_optimizer: decay (weights) and no-decay (biases, norms) groups.
    decay = [p for n, p in model.named_parameters() if "norm" not in n and not n.endswith(".bias")]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n or n.endswith(".bias")]
    return [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]


@pytest.mark.parametrize("foreach", [True, False])
def test_small_llama_fake_step_states_and_temporaries(foreach: bool) -> None:
    """Small-width Llama-3 under FakeTensorMode: states to the byte; foreach / single-tensor step
    temporaries."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    inv = llama_like(**SMALL)
    with FakeTensorMode():
        model = transformers.AutoModelForCausalLM.from_config(_llama_config(**SMALL), dtype=torch.bfloat16)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(_trainer_groups(model), lr=1e-3, foreach=foreach)
        opt.step()  # step 1 creates the states
        tracker = _LiveBytes()
        with tracker:
            opt.step()  # steady state: only temporaries are new
        state = [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
        states_bytes = sum(t.untyped_storage().nbytes() for t in state)
    spec = _spec(inv, device=DeviceType.CUDA if foreach else DeviceType.CPU)
    comps = _by_name(model_state_components(spec))
    assert comps["optimizer.states"].at(Phase.BACKWARD) == states_bytes
    assert comps["optimizer.step_temporaries"].at(Phase.OPTIMIZER_STEP) == tracker.peak


def test_adafactor_states_match_transformers() -> None:
    """transformers Adafactor (as the Trainer builds it) on a real tiny model: factored fp32 states."""
    from transformers.optimization import Adafactor

    cfg = _llama_config(vocab=64, hidden=32, layers=1, heads=4, kv_heads=2, intermediate=48)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = Adafactor(model.parameters(), lr=1e-3, scale_parameter=False, relative_step=False)
    opt.step()
    real = sum(
        t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values() if torch.is_tensor(t)
    )
    inv = llama_like(vocab=64, hidden=32, layers=1, heads=4, kv_heads=2, intermediate=48)
    comps = _by_name(model_state_components(_spec(inv, "adafactor")))
    assert comps["optimizer.states"].at(Phase.FORWARD_END) == real


def test_bnb_8bit_adamw_states_match_bitsandbytes() -> None:
    """bitsandbytes AdamW8bit on CPU tensors: uint8 states + fp32 absmax; small tensors keep fp32 states."""
    bnb = pytest.importorskip("bitsandbytes")
    shapes = [(128, 64), (64, 32), (4096,), (300, 50), (100,)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = bnb.optim.AdamW8bit(params, lr=1e-3)
    try:
        opt.step()
    except Exception as exc:  # pragma: no cover - depends on the bnb CPU build
        pytest.skip(f"bitsandbytes 8-bit optimizer step unavailable on CPU: {exc}")
    real = 0
    qmaps: set[int] = set()
    for s in opt.state.values():
        for k, t in s.items():
            if not torch.is_tensor(t):
                continue
            if k.startswith("qmap"):
                qmaps.add(t.untyped_storage().data_ptr())
                continue
            real += t.untyped_storage().nbytes()
    real += len(qmaps) * 256 * 4
    groups = [TensorGroup(f"p{i}", s, Dtype.FLOAT32) for i, s in enumerate(shapes)]
    mem = optimizer_memory(OptimizerSpec("adamw_bnb_8bit"), groups)
    assert isinstance(mem, OptimizerMemory)
    assert mem.states == real


def test_bnb_4bit_bytes_match_real_quantize_4bit() -> None:
    """bitsandbytes.functional.quantize_4bit on a real CPU tensor: packed + absmax (+ nested state) bytes."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes.functional as bf

    for shape, dq, bs, storage in [
        ((256, 512), True, 64, torch.uint8),
        ((256, 512), False, 64, torch.uint8),
        ((200, 333), True, 128, torch.uint8),
        ((256, 512), True, 64, torch.bfloat16),
    ]:
        w = torch.randn(shape, dtype=torch.bfloat16)
        packed, qs = bf.quantize_4bit(
            w, blocksize=bs, compress_statistics=dq, quant_type="nf4", quant_storage=storage
        )
        real = packed.untyped_storage().nbytes()
        tensors = [qs.absmax, qs.code]
        if dq:
            tensors += [qs.offset, qs.state2.absmax, qs.state2.code]
        real_meta = sum(t.untyped_storage().nbytes() for t in tensors)
        spec = QuantSpec(
            double_quant=dq,
            blocksize=bs,
            quant_storage=Dtype.BFLOAT16 if storage is torch.bfloat16 else Dtype.UINT8,
        )
        qb = quantized_bytes(w.numel(), spec)
        assert (qb.data, qb.meta) == (real, real_meta), (shape, dq, bs, storage)


def test_peft_lora_all_linear_dora_modules_to_save_match_peft() -> None:
    """peft on a small bf16 Llama: adapter counts, fp32 adapters, DoRA magnitudes, bf16 modules_to_save
    copy."""
    peft = pytest.importorskip("peft")
    cfg = _llama_config(**SMALL)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    lcfg = peft.LoraConfig(r=8, target_modules="all-linear", use_dora=True, modules_to_save=["lm_head"])
    pm = peft.get_peft_model(model, lcfg)
    trainable = {n: p for n, p in pm.named_parameters() if p.requires_grad}
    adapters = {n: p for n, p in trainable.items() if "lora_" in n}
    saved = {n: p for n, p in trainable.items() if "modules_to_save" in n}
    assert {p.dtype for p in adapters.values()} == {torch.float32}
    assert {p.dtype for p in saved.values()} == {torch.bfloat16}
    inv = llama_like(**SMALL)
    spec = TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16),
        lora=LoraSpec(r=8, target_modules=("all-linear",), use_dora=True, modules_to_save=("lm_head",)),
    )
    plan = plan_lora(spec)
    assert plan.adapter_params == sum(p.numel() for p in adapters.values())
    assert plan.saved_params == sum(p.numel() for p in saved.values())
    comps = _by_name(model_state_components(spec))
    assert comps["adapters.lora"].at(Phase.FORWARD_END) == sum(p.numel() * 4 for p in adapters.values())
    assert comps["adapters.modules_to_save"].at(Phase.FORWARD_END) == sum(
        p.numel() * 2 for p in saved.values()
    )


def test_peft_mixtral_all_linear_param_wrapper_counts() -> None:
    """peft 0.21.2 on transformers-5 Mixtral: all-linear reaches fused experts and the router via
    ParamWrapper."""
    peft = pytest.importorskip("peft")
    dims = {
        "vocab": 64,
        "hidden": 32,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 48,
        "experts": 4,
    }
    cfg = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _check_inventory_matches(model, mixtral_like(**dims))
    with pytest.raises(ValueError, match="lora_dropout"):
        peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.05))
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0))
    real = sum(p.numel() for n, p in pm.named_parameters() if p.requires_grad)
    spec = TrainingSpec(model=mixtral_like(**dims), lora=LoraSpec(r=4, target_modules=("all-linear",)))
    plan = plan_lora(spec)
    assert plan.adapter_params == real
    bad = TrainingSpec(
        model=mixtral_like(**dims), lora=LoraSpec(r=4, dropout=0.05, target_modules=("all-linear",))
    )
    assert plan_lora(bad).problems


@pytest.mark.parametrize("dtype", [Dtype.BFLOAT16, Dtype.FLOAT32])
def test_adafactor_step_temporaries_measured(dtype: Dtype) -> None:
    """Adafactor's per-parameter fp32 temporaries (Trainer param groups), on a real CPU step, to the byte."""
    from transformers.optimization import Adafactor

    tdtype = torch.bfloat16 if dtype is Dtype.BFLOAT16 else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(_llama_config(**SMALL), dtype=tdtype)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = Adafactor(_trainer_groups(model), lr=1e-3, scale_parameter=False, relative_step=False)
    opt.step()
    # the tracer's recorder: pre-existing tensors tracked, so frees of replaced states (RMS) count too
    from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder

    rec = LiveTensorRecorder()
    rec.track([*model.parameters(), *(p.grad for p in model.parameters())])
    rec.track([v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])
    with rec:
        rec.enter_region("step")
        opt.step()
        rec.enter_region("done")
    spec = TrainingSpec(
        model=llama_like(**SMALL), precision=PrecisionSpec(dtype), optimizer=OptimizerSpec("adafactor")
    )
    predicted = _by_name(model_state_components(spec))["optimizer.step_temporaries"].at(Phase.OPTIMIZER_STEP)
    assert predicted == rec.regions["step"].peak - rec.regions["setup"].end
