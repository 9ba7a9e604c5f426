"""``--seq_lengths``: the padded lengths of successive batches, replayed through the caching allocator.

The flag did not exist before issue 19's session 5: every CLI test here fails on that code (argparse refuses an
unknown flag). The replay itself is ``allocator_replay.replay_step`` (the real fake-tensor trace of the model's step
at each length) run through ``fitcheck/core/caching`` (torch's ``CUDACachingAllocator.cpp`` rules, read from
source, not measured on a GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.errors import ConfigError
from fitcheck.readers import check_seq_lengths, parse_seq_lengths


def test_comma_list_keeps_its_order() -> None:
    assert parse_seq_lengths("512,1024, 768 ,2048") == (512, 1024, 768, 2048)
    assert parse_seq_lengths("300") == (300,)


def test_range_is_evenly_spaced_shortest_first() -> None:
    assert parse_seq_lengths("256:1024") == (256, 512, 768, 1024)
    assert parse_seq_lengths("100:400:3") == (100, 256, 400)  # the middle one padded to a multiple of 8
    assert parse_seq_lengths("64:64:2") == (64, 64)


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("512,abc", "'abc' is not a whole number"),
    ("0,512", "at least 1"),
    ("1024:256", "write 256:1024"),
    ("1:2:3:4", "MIN:MAX"),
    ("256:1024:1", "STEPS must be 2 to 16"),
    (",".join(["64"] * 17), "at most 16"),
])
def test_bad_values_name_the_flag_and_the_fix(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_seq_lengths(text)
    assert "--seq_lengths" in str(err.value) and words in str(err.value)


def test_lengths_above_max_seq_length_are_refused() -> None:
    check_seq_lengths((512, 1024), 1024)
    with pytest.raises(ConfigError, match="--max_seq_length 2048"):
        check_seq_lengths((512, 2048), 1024)


pytest.importorskip("transformers")

from benchmarks.cpu_truth import LLAMA  # noqa: E402
from fitcheck.cli.main import main  # noqa: E402


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    code = main(["estimate", "--model_name_or_path", str(config), "--bf16", "--per_device_train_batch_size", "2",
                 "--gpu_memory", "2GiB", "--json", *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("extra, words", [
    (("--seq_lengths", "128,x"), "--seq_lengths '128,x': 'x' is not a whole number"),
    (("--seq_lengths", "128,512", "--max_seq_length", "256"), "pass --max_seq_length 512"),
    (("--seq_lengths", "128,256", "--no_trace"), "drop one of them"),
])
def test_cli_bad_values_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...],
                               words: str) -> None:
    code, _, err = _run(tmp_path, capsys, *extra)
    assert code == 2 and words in err and "Traceback" not in err


def test_cli_replays_lengths_that_vary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI replays the steps of --seq_lengths: the same allocated peak (the longest step), a reserved figure of
    its own (the replay of 64,128,192,256, not of one step at 256), and a finding saying what was replayed. That
    shorter steps first leave segments the longest cannot reuse is checked on the step's own tensors in
    test_allocator_replay (on this tiny model the two threads' cuBLAS workspaces, placed in whichever step runs
    first, are larger than that effect)."""
    code, out, _ = _run(tmp_path, capsys, "--max_seq_length", "256", "--trace")
    single = json.loads(out)
    assert code in (0, 1)
    code, out, _ = _run(tmp_path, capsys, "--seq_lengths", "64:256", "--trace")
    varied = json.loads(out)
    assert code in (0, 1)
    assert varied["peak_allocated_bytes"] == single["peak_allocated_bytes"]  # max_seq_length 256 from the flag
    assert varied["peak_reserved_bytes"] != single["peak_reserved_bytes"]
    said = [f["message"] for f in varied["findings"] if f["code"] == "seq-lengths-replayed"]
    assert said and "4 steps padded to 64,128,192,256 tokens" in said[0]
    assert any("the longest of --seq_lengths" in a for a in varied["assumptions"])


def test_the_replayed_gap_enters_the_reserved_figure() -> None:
    """The estimate's reserved bytes are allocated + the replay's gap fraction x the step's transient bytes
    (``core/allocator.py reserved_bytes``), with the fraction from the whole run over the given lengths
    (``replay_whole_lengths``: every layer, the optimizer)."""
    from dataclasses import replace

    from benchmarks.cpu_truth import Row, spec_for
    from fitcheck.core import estimate
    from fitcheck.spec import DeviceType
    from fitcheck.torch_adapters import PinnedPath, replay_whole_lengths

    spec = spec_for(Row("lengths", LLAMA, seq=256, batch=2, dtype="bfloat16", optim="adamw_torch"))
    spec = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))
    lengths = (64, 256, 128, 256)
    report = PinnedPath("always", seq_lengths=lengths)(spec)
    replayed = replay_whole_lengths(spec, lengths)[0]
    comps, _ = PinnedPath("always").activations(spec)
    expected = estimate(spec, activations=comps, gap_fraction=replayed.gap_fraction)
    assert report.peak_reserved_bytes == expected.peak_reserved_bytes
    assert report.peak_allocated_bytes == expected.peak_allocated_bytes
    said = [f.message for f in report.findings if f.code == "seq-lengths-replayed"]
    assert said and f"{replayed.gap_fraction:.0%} of the step's own tensors" in said[0]


def test_above_the_gpu_the_allocator_releases_its_cache_and_retries() -> None:
    """Between the sequence's figure and the longest step's own, the run fits: torch frees its unsplit cached
    segments when a cudaMalloc fails and retries (``release_cached_blocks``), so the verdict follows the longest
    step alone and a finding says so."""
    from dataclasses import replace

    from benchmarks.cpu_truth import Row, spec_for
    from fitcheck.core import estimate
    from fitcheck.spec import DeviceType
    from fitcheck.torch_adapters import PinnedPath, replay_whole_lengths

    spec = spec_for(Row("lengths", LLAMA, seq=256, batch=2, dtype="bfloat16", optim="adamw_torch"))
    spec = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA, gpu_memory_bytes=80 * 2**30))
    lengths = (64, 128, 192, 256)
    sequence, alone = replay_whole_lengths(spec, lengths)
    assert sequence.gap_fraction > alone.gap_fraction  # shortest first leaves segments the longest cannot reuse
    comps, _ = PinnedPath("always").activations(spec)
    high = estimate(spec, activations=comps, gap_fraction=sequence.gap_fraction).device_used_bytes
    low = estimate(spec, activations=comps, gap_fraction=alone.gap_fraction).device_used_bytes
    assert high > low
    tight = replace(spec, hardware=replace(spec.hardware, gpu_memory_bytes=(high + low) // 2))
    report = PinnedPath("always", seq_lengths=lengths)(tight)
    # the loading warm-up block is capped by the GPU's memory (replay_step_args.load_warmup): the tight GPU's own
    # replay of the longest step alone is the figure
    _, alone_tight = replay_whole_lengths(tight, lengths)
    low_tight = estimate(tight, activations=comps, gap_fraction=alone_tight.gap_fraction).device_used_bytes
    assert report.fits and report.device_used_bytes == low_tight < high
    said = [f.message for f in report.findings if f.code == "seq-lengths-replayed"]
    assert said and "release_cached_blocks" in said[0]


def test_allocated_returns_to_the_same_baseline_at_every_step_boundary() -> None:
    """Over alternating lengths the replay frees every step's own tensors: ``memory_allocated`` after each step
    equals the first step's (which creates the optimizer's states). The step here has what made the deepened traces
    leak before session 15 (``test_allocator_deepen``): fp32 LoRA adapters on q, k and v of one size under bf16
    autocast, checkpointed, eight layers built from one and two; on that code the boundaries differed by 7 KiB."""
    from dataclasses import replace

    from tiny_models import LLAMA_8_LAYERS

    from benchmarks.cpu_truth import Row, spec_for
    from fitcheck.spec import DeviceType, LoraSpec
    from fitcheck.torch_adapters import replay_whole_lengths

    config = {**LLAMA_8_LAYERS, "num_key_value_heads": LLAMA_8_LAYERS["num_attention_heads"]}
    lora = LoraSpec(r=8, alpha=32, dropout=0.05, target_modules=("q_proj", "k_proj", "v_proj"))
    spec = spec_for(Row("lengths", config, seq=64, batch=1, dtype="bfloat16", mp="bf16", ckpt=True, lora=lora))
    spec = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))
    sequence, _ = replay_whole_lengths(spec, (64, 32, 64, 32, 64))
    assert len(sequence.step_allocated) == 5
    assert set(sequence.step_allocated) == {sequence.step_allocated[0]}
