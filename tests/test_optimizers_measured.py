"""Optimizer-step temporaries: the formulas against real CPU steps of small transformers models.

Each case builds the model from config.json the way the tracer does, the optimizer the way the HF Trainer does
(two param groups, ``Trainer.get_decay_parameter_names``; ``fitcheck.torch_adapters.tracer``), runs one step
to create the states and records the second with the tracer's live-storage recorder: the transient peak above
what was alive when ``step()`` began must equal the model's ``step_temporary`` to the byte.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_models import family_config  # noqa: E402

from fitcheck.core.optimizers.by_name import optimizer_memory  # noqa: E402
from fitcheck.core.optimizers.step_tensors import TensorGroup, step_runs, trainer_decays  # noqa: E402
from fitcheck.core.states.layout import all_trainable, build_layout, optimizer_for  # noqa: E402
from fitcheck.readers.model_config import inventory_from_config  # noqa: E402
from fitcheck.spec import (  # noqa: E402
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    OptimizerSpec,
    PrecisionSpec,
    TrainingSpec,
)
from fitcheck.torch_adapters.tracer_build import build_model  # noqa: E402
from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder  # noqa: E402
from fitcheck.torch_adapters.tracer_trainer_optim import make_trainer_optimizer, trainer_param_groups  # noqa: E402

LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 640,
    "tie_word_embeddings": False,
}  # fmt: skip
QWEN2 = family_config("qwen2", LLAMA, tie_word_embeddings=True)
MIXTRAL: dict[str, Any] = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 320,
    "num_local_experts": 4, "num_experts_per_tok": 2,
}  # fmt: skip
PHI3: dict[str, Any] = {
    "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "intermediate_size": 176,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 640,
    "pad_token_id": 0,
}  # fmt: skip
GPT2: dict[str, Any] = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "n_layer": 2,
    "vocab_size": 640, "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
ALL_LINEAR = LoraSpec(r=4, target_modules=("all-linear",))
_DTYPES = {Dtype.BFLOAT16: "bfloat16", Dtype.FLOAT32: "float32"}


def _spec(cfg: dict[str, Any], dtype: Dtype, optim: str, *, cuda: bool, lora: LoraSpec | None = None) -> TrainingSpec:
    return TrainingSpec(
        model=inventory_from_config(cfg, "test", "tests/test_optimizers_measured.py"),
        precision=PrecisionSpec(dtype),
        optimizer=OptimizerSpec(optim),
        hardware=HardwareSpec(device_type=DeviceType.CUDA if cuda else DeviceType.CPU),
        lora=lora,
    )


def _predicted(spec: TrainingSpec) -> int:
    return optimizer_for(spec, all_trainable(build_layout(spec))).step_temporary


def _model(cfg: dict[str, Any], dtype: Dtype, lora: LoraSpec | None = None) -> Any:
    torch.manual_seed(0)
    return build_model(
        cfg, dtype=getattr(torch, _DTYPES[dtype]), attn_implementation="sdpa", checkpointing=False, lora=lora,
        fake=False,
    )  # fmt: skip


def _recorded_step_peak(opt: Any, rec: Any) -> int:
    """Bytes ``rec`` sees allocated above the starting point during one more ``opt.step()`` (states exist)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    rec.track(params)
    rec.track([p.grad for p in params])
    rec.track([v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)])
    with rec:
        rec.enter_region("step")
        opt.step()
        rec.enter_region("done")
    return int(rec.regions["step"].peak - rec.regions["setup"].end)


def _step_peak(opt: Any) -> int:
    """Bytes allocated above the step's starting point during a steady-state ``opt.step()``."""
    for g in opt.param_groups:
        for p in g["params"]:
            p.grad = torch.randn_like(p)
    opt.step()  # step 1 creates the states
    return _recorded_step_peak(opt, LiveTensorRecorder())


@pytest.mark.parametrize(
    ("cfg", "dtype", "lora"),
    [
        (LLAMA, Dtype.BFLOAT16, None),
        (LLAMA, Dtype.FLOAT32, None),
        (QWEN2, Dtype.BFLOAT16, None),  # q/k/v biases: no-decay group members inside the layers
        (MIXTRAL, Dtype.BFLOAT16, None),  # 3-D fused experts
        (PHI3, Dtype.FLOAT32, None),
        (GPT2, Dtype.FLOAT32, None),  # nn.LayerNorm ln_1/ln_2/ln_f, Conv1D biases
        (LLAMA, Dtype.BFLOAT16, ALL_LINEAR),  # fp32 adapters on a bf16 base
        (LLAMA, Dtype.BFLOAT16, LoraSpec(r=4, target_modules=("q_proj", "v_proj"), modules_to_save=("lm_head",))),
    ],
    ids=["llama-bf16", "llama-fp32", "qwen2-bias", "mixtral", "phi3-fp32", "gpt2", "lora", "lora-saved-head"],
)
def test_adamw_single_tensor_and_foreach_exact(cfg: dict[str, Any], dtype: Dtype, lora: LoraSpec | None) -> None:
    """CPU single-tensor loop: max(bytes[i-1] + 2 bytes[i]) per group; foreach: max(S[k-1] + S[k]) per group."""
    model = _model(cfg, dtype, lora)
    single = _step_peak(make_trainer_optimizer("adamw_torch", model))  # the CPU default: _single_tensor_adam
    assert single == _predicted(_spec(cfg, dtype, "adamw_torch", cuda=False, lora=lora))
    foreach = _step_peak(torch.optim.AdamW(trainer_param_groups(model), lr=1e-3, foreach=True))
    assert foreach == _predicted(_spec(cfg, dtype, "adamw_torch", cuda=True, lora=lora))
    assert _step_peak(make_trainer_optimizer("adamw_torch_fused", model)) == 0  # _fused_adamw_ on CPU: in place
    assert _predicted(_spec(cfg, dtype, "adamw_torch_fused", cuda=True, lora=lora)) == 0


def test_foreach_splits_a_group_by_dtype() -> None:
    """_group_tensors_by_device_and_dtype: the previous dtype's sqrt copy is still bound (S[0] + S[1])."""
    a32 = TensorGroup("a", (1000, 100), Dtype.FLOAT32)
    b16 = TensorGroup("b", (300, 100), Dtype.BFLOAT16)
    c16 = TensorGroup("c", (1000, 100), Dtype.BFLOAT16)
    params = [torch.nn.Parameter(torch.zeros(t.shape, dtype=getattr(torch, _DTYPES[t.dtype]))) for t in (a32, b16, c16)]
    measured = _step_peak(torch.optim.AdamW(params, lr=1e-3, foreach=True))
    predicted = optimizer_memory(OptimizerSpec("adamw_torch"), [a32, b16, c16], cuda=True).step_temporary
    assert measured == predicted == 400_000 + 260_000
    single = _step_peak(torch.optim.AdamW(params, lr=1e-3, foreach=False))
    assert single == optimizer_memory(OptimizerSpec("adamw_torch"), [a32, b16, c16], cuda=False).step_temporary
    assert single == 2 * 400_000  # a first (nothing before it): 2 x; then 400k + 2 x 60k, 60k + 2 x 200k


@pytest.mark.parametrize("dtype", [Dtype.BFLOAT16, Dtype.FLOAT32])
@pytest.mark.parametrize("cfg", [LLAMA, MIXTRAL], ids=["llama", "mixtral"])
def test_adafactor_exact(cfg: dict[str, Any], dtype: Dtype) -> None:
    """transformers Adafactor as the Trainer builds it: per-tensor fp32 copies + the previous `update`."""
    model = _model(cfg, dtype)
    measured = _step_peak(make_trainer_optimizer("adafactor", model))
    assert measured == _predicted(_spec(cfg, dtype, "adafactor", cuda=True))


@pytest.mark.parametrize("foreach", [False, True])
def test_sgd_rmsprop_adagrad_exact(foreach: bool) -> None:
    """SGD (no momentum / nesterov), RMSprop and Adagrad: single-tensor and foreach temporaries."""
    shapes = [
        ((40, 100), Dtype.BFLOAT16),
        ((300, 100), Dtype.BFLOAT16),
        ((64,), Dtype.FLOAT32),
        ((50, 30), Dtype.FLOAT32),
    ]
    groups = [TensorGroup(f"p{i}", s, d) for i, (s, d) in enumerate(shapes)]

    def params() -> list[Any]:
        return [torch.nn.Parameter(torch.zeros(s, dtype=getattr(torch, _DTYPES[d]))) for s, d in shapes]

    cases: list[tuple[OptimizerSpec, Any]] = [
        (OptimizerSpec("sgd"), lambda: torch.optim.SGD(params(), lr=1e-3, foreach=foreach)),
        (
            OptimizerSpec("sgd", {"momentum": "0.9", "nesterov": "true"}),
            lambda: torch.optim.SGD(params(), lr=1e-3, momentum=0.9, nesterov=True, foreach=foreach),
        ),
        (OptimizerSpec("rmsprop"), lambda: torch.optim.RMSprop(params(), lr=1e-3, foreach=foreach)),
        (
            OptimizerSpec("rmsprop", {"centered": "true", "momentum": "0.9"}),
            lambda: torch.optim.RMSprop(params(), lr=1e-3, centered=True, momentum=0.9, foreach=foreach),
        ),
        (OptimizerSpec("adagrad"), lambda: torch.optim.Adagrad(params(), lr=1e-3, foreach=foreach)),
    ]
    for spec, make in cases:
        predicted = optimizer_memory(spec, groups, cuda=foreach).step_temporary
        assert _step_peak(make()) == predicted, spec


def test_trainer_decay_rule_matches_transformers() -> None:
    """The name rule the estimate uses equals Trainer.get_decay_parameter_names on real models."""
    for cfg in (LLAMA, QWEN2, GPT2, PHI3):
        model = _model(cfg, Dtype.FLOAT32)
        real = set(transformers.Trainer.get_decay_parameter_names(None, model))
        layer_norms = {
            f"{m}.{n}" if m else n
            for m, mod in model.named_modules()
            if isinstance(mod, torch.nn.LayerNorm)
            for n, _ in mod.named_parameters(recurse=False)
        }
        for name, _ in model.named_parameters():
            assert trainer_decays(name, layer_norm=name in layer_norms) == (name in real), name


def test_step_runs_rebuild_layer_order() -> None:
    """Per-layer entries interleave layer by layer; non-layer names keep their place."""
    emb = TensorGroup("model.embed_tokens.weight", (10, 4), Dtype.FLOAT32)
    q = TensorGroup("model.layers.*.q.weight", (4, 4), Dtype.FLOAT32, repeat=3)
    moe = TensorGroup("model.layers.*.moe.weight", (8, 4), Dtype.FLOAT32, repeat=2)
    head = TensorGroup("lm_head.weight", (10, 4), Dtype.FLOAT32)
    runs = step_runs([emb, q, moe, head])
    flat = [t.name for r in runs for _ in range(r.count) for t in r.tensors]
    assert flat == [emb.name, q.name, moe.name, q.name, moe.name, q.name, head.name]
    # single-tensor AdamW: the largest pair is moe (128 B) -> q (64 B)? no: q -> moe = 64 + 2*128 = 320 B;
    # emb first = 2*160; q (64) after emb (160) = 288; head (160) after q = 64 + 320 = 384.
    mem = optimizer_memory(OptimizerSpec("adamw_torch"), [emb, q, moe, head], cuda=False)
    assert mem.step_temporary == 384


class _NestedRecorder(LiveTensorRecorder):  # type: ignore[no-untyped-call]
    """Also records inside bitsandbytes ops: their CPU kernels are Python functions of torch ops, which a
    dispatch mode otherwise sees as one opaque call."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace != "bitsandbytes":
            return super().__torch_dispatch__(func, types, args, kwargs)
        with self:
            out = func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out


@pytest.mark.parametrize("dtype", [Dtype.FLOAT32, Dtype.BFLOAT16])
@pytest.mark.parametrize("optim", ["adamw_bnb_8bit", "paged_adamw_32bit"])
def test_bnb_adamw_cpu_reference_update_exact(optim: str, dtype: Dtype) -> None:
    """bitsandbytes' CPU AdamW update (fp32 working set per tensor); the CUDA kernels allocate nothing."""
    bnb = pytest.importorskip("bitsandbytes")
    shapes = [(512, 64), (1024, 64), (100,)]  # the (100,) tensor keeps 32-bit states under 8-bit
    params = [torch.nn.Parameter(torch.randn(s, dtype=getattr(torch, _DTYPES[dtype]))) for s in shapes]
    cls = bnb.optim.AdamW8bit if "8bit" in optim else bnb.optim.PagedAdamW32bit
    opt = cls(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    try:
        opt.step()
    except Exception as exc:  # pragma: no cover - depends on the bnb CPU build
        pytest.skip(f"bitsandbytes optimizer step unavailable on CPU: {exc}")
    measured = _recorded_step_peak(opt, _NestedRecorder())
    groups = [TensorGroup(f"p{i}", s, dtype) for i, s in enumerate(shapes)]
    assert measured == optimizer_memory(OptimizerSpec(optim), groups, cuda=False).step_temporary > 0
    assert optimizer_memory(OptimizerSpec(optim), groups, cuda=True).step_temporary == 0
