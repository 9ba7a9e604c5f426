"""``--reserved_replay``: the headline's allocator gap from its whole run replayed, not from two layer groups.

Why: the reserved-minus-allocated gap does not scale linearly in depth, so the gap fraction of two replayed layer
groups is -12 % .. +13 % off the H100's ``max_memory_reserved``, and the whole run replayed -0.7 % .. -0.1 %
(``benchmarks/reserved_replay.py``, ``benchmarks/data/reserved_replay_nvidia_h100_80gb_hbm3.json``). The flag did
not exist before session 7: the CLI tests here fail on that code (argparse refuses an unknown flag).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import LLAMA_8_LAYERS

from benchmarks.cpu_truth import Row, spec_for
from fitcheck.cli.main import main
from fitcheck.core import estimate
from fitcheck.spec import DeviceType, TrainingSpec
from fitcheck.torch_adapters import PinnedPath, replay_steady_state

# eight layers of one group each: the whole run is built from the one- and two-layer traces (allocator_deepen)
CONFIG = LLAMA_8_LAYERS


def _spec(ckpt: bool) -> TrainingSpec:
    spec = spec_for(Row("replay", CONFIG, seq=32, batch=2, dtype="bfloat16", optim="adamw_torch_fused", ckpt=ckpt))
    return replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))


@pytest.mark.parametrize("ckpt", [False, True], ids=["bf16", "checkpointing"])
def test_headline_reserved_is_the_whole_run_replayed(ckpt: bool) -> None:
    """The headline's reserved bytes are the estimate with the gap of the REAL full-depth trace's replay
    (``replay_steady_state``, no deepening): the deepened sequence the path replays gives the same gap."""
    spec = _spec(ckpt)
    path = PinnedPath("always", reserved_replay=True)
    report = path(spec)
    whole = replay_steady_state(spec)
    comps, _ = PinnedPath("always").activations(spec)
    expected = estimate(spec, activations=comps, gap_fraction=whole.gap_fraction)
    assert report.peak_reserved_bytes == expected.peak_reserved_bytes
    assert report.peak_allocated_bytes == expected.peak_allocated_bytes
    fast = PinnedPath("always")(spec)
    assert fast.peak_allocated_bytes == report.peak_allocated_bytes
    assert fast.peak_reserved_bytes != report.peak_reserved_bytes  # the two-group gap is not the whole run's
    said = [f.message for f in report.findings if f.code == "reserved-replayed"]
    assert said and f"{whole.gap_fraction:.0%} of the step's own tensors" in said[0]
    # the numbers around the headline keep the fast gap: one whole-run replay per answer
    follow = path.following(report)
    assert not follow.reserved_replay
    bigger = replace(spec, batch=replace(spec.batch, micro_batch=4))
    assert not any(f.code == "reserved-replayed" for f in follow(bigger).findings)


def _cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    code = main(["estimate", "--model_name_or_path", str(config), "--bf16", "--per_device_train_batch_size", "2",
                 "--max_seq_length", "32", "--optim", "adamw_torch_fused", "--gpu_memory", "2GiB", "--json",
                 *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_flag_enters_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(tmp_path, capsys, "--gradient_checkpointing", "--reserved_replay")
    assert code in (0, 1)
    data = json.loads(out)
    assert any(f["code"] == "reserved-replayed" for f in data["findings"])


@pytest.mark.parametrize("extra, words", [
    (("--reserved_replay", "--no_trace"), "cannot be combined with --no_trace"),
    (("--reserved_replay", "--seq_lengths", "16,32"), "cannot be combined with --seq_lengths"),
])
def test_cli_contradictions_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...],
                                   words: str) -> None:
    code, _, err = _cli(tmp_path, capsys, *extra)
    assert code == 2 and words in err and "Traceback" not in err
