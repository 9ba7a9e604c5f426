"""FSDP1's ``forward_prefetch`` and ``limit_all_gathers`` (readers/fsdp_config.py, core/states/fsdp1_prefetch.py,
core/states/sharding_findings.py): read as accelerate 1.15 / transformers 5.23 pass them, checked against a real FSDP1
Trainer run (recorded: benchmarks/data/accumulation_engines_cpu.json, engine ``fsdp1-2ranks-fwd``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fitcheck.core import estimate
from fitcheck.errors import ConfigError
from fitcheck.readers.fsdp_config import fsdp_from_config
from fitcheck.report import Location, Phase
from fitcheck.spec import DeviceType

ROOT = Path(__file__).parent.parent
ROWS = json.loads((ROOT / "benchmarks" / "data" / "accumulation_engines_cpu.json").read_text())["rows"]


@pytest.mark.parametrize(("cfg", "flavour", "want", "ignored"), [
    ({"fsdp_version": 1, "fsdp_forward_prefetch": True}, "accelerate", (True, True), False),
    ({"fsdp_version": 2, "fsdp_forward_prefetch": "true"}, "accelerate", (False, True), True),
    ({"fsdp_version": 1, "fsdp_limit_all_gathers": False}, "accelerate", (False, True), True),
    ({"version": 1, "limit_all_gathers": "false", "forward_prefetch": "true"}, "trainer", (True, False), False),
    ({"version": 2, "limit_all_gathers": False}, "trainer", (False, True), True),
])
def test_read_as_accelerate_and_transformers_pass_them(cfg: dict[str, object], flavour: str,
                                                       want: tuple[bool, bool], ignored: bool) -> None:
    read = fsdp_from_config(cfg, source="cfg", flavour=flavour)
    assert (read.spec.forward_prefetch, read.spec.limit_all_gathers) == want
    assert any(f.code == "fsdp-key-ignored" for f in read.findings) is ignored
    with pytest.raises(ConfigError):
        fsdp_from_config({**cfg, next(k for k in cfg if "prefetch" in k or "limit" in k): "maybe"}, source="cfg",
                         flavour=flavour)


def test_accelerate_applies_them_as_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate 1.15: FSDP_FORWARD_PREFETCH read for fsdp_version 1 only; ``accelerate launch`` exports no
    FSDP_LIMIT_ALL_GATHERS (an accelerate config's key never reaches the plugin)."""
    import inspect

    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils import launch as acc_launch

    monkeypatch.setenv("FSDP_FORWARD_PREFETCH", "true")
    assert FullyShardedDataParallelPlugin(fsdp_version=1).forward_prefetch is True
    assert FullyShardedDataParallelPlugin(fsdp_version=2).forward_prefetch is None
    assert FullyShardedDataParallelPlugin(fsdp_version=1).limit_all_gathers is True
    assert "LIMIT_ALL_GATHERS" not in inspect.getsource(acc_launch.prepare_multi_gpu_env)


def _totals(engine: str, seq: int, **fsdp: object) -> tuple[dict[Phase, int], list[str]]:
    from benchmarks.accumulation_engines_cpu import spec_of

    spec = spec_of(engine, seq)
    if fsdp:
        spec = replace(spec, sharding=replace(spec.sharding, fsdp=replace(spec.sharding.fsdp, **fsdp)))
    rep = estimate(spec)
    tot = {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}
    return tot, [f.code for f in rep.findings]


@pytest.mark.parametrize("seq", [32, 128])
def test_forward_prefetch_holds_nothing_at_the_estimated_moments(seq: int) -> None:
    """The real Trainer with ``forward_prefetch`` (FSDP1, 2 gloo ranks): forward, start-of-backward and head peaks
    equal the run without it to the byte; fitcheck's moments are unchanged and the answer unpinned (the moment
    inside forward, and one more unit at the top layer's backward at 32 tokens, are not modelled)."""
    fwd, base = ROWS[f"fsdp1-2ranks-fwd {seq}"]["micro2"], ROWS[f"fsdp1-2ranks {seq}"]["micro2"]
    for key in ("forward_peak", "start_peak", "head_peak"):
        assert fwd[key] == base[key]
    on, codes = _totals("fsdp1-2ranks-fwd", seq)
    off, base_codes = _totals("fsdp1-2ranks", seq)
    assert on == off and "not-modelled" in codes and "not-modelled" not in base_codes
    assert abs(on[Phase.BACKWARD_START] - fwd["start_peak"]) <= 0.01 * fwd["start_peak"]


def test_limit_all_gathers_false_unpins_on_cuda_only() -> None:
    on, codes = _totals("fsdp1-2ranks", 128)
    off, off_codes = _totals("fsdp1-2ranks", 128, limit_all_gathers=False)
    assert on == off and "not-modelled" not in codes and "not-modelled" not in off_codes  # CPU: no side streams
    from benchmarks.accumulation_engines_cpu import spec_of

    spec = spec_of("fsdp1-2ranks", 128)
    cuda = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))
    limited = estimate(cuda)
    free = estimate(replace(cuda, sharding=replace(cuda.sharding, fsdp=replace(cuda.sharding.fsdp,
                                                                                 limit_all_gathers=False))))
    assert not free.pinned
    assert [c for c in free.components] == [c for c in limited.components]
    assert any(f.code == "not-modelled" and "limit_all_gathers" in f.message for f in free.findings)
