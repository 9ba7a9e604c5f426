"""fitcheck's on-disk cache of traces and allocator replays (issue 20: a traced answer asked again must not pay the
imports and the traces again): a hit answers the same bytes as a miss without importing torch; what the result
depends on is in the key; a bad entry is a miss; it can be turned off.

The module did not exist before session 11: every test here fails on that code (ImportError).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tiny_models import LLAMA_8_LAYERS

from fitcheck.report import Phase
from fitcheck.torch_adapters import TraceCache, cache_directory, trace_cache
from fitcheck.torch_adapters.allocator_replay import StepReplay
from fitcheck.torch_adapters.trace_cache import (
    SOURCE_DIRS,
    SOURCE_FILES,
    cached_lengths,
    cached_trace,
    fingerprint,
    source_hash,
)
from fitcheck.torch_adapters.trace_result import PhaseBreakdown, TraceResult, components_from_trace

HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "deepspeed")

# each argv of argv[1] answered by fitcheck's CLI in this one fresh process; then what it imported
_RUNNER = """
import contextlib, io, json, os, pathlib, sys
from fitcheck.cli.main import main
runs = []
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    entries = pathlib.Path(os.environ["FITCHECK_CACHE_DIR"], "traces")
    runs.append({"code": code, "out": out.getvalue(),
                 "entries": len(list(entries.glob("*.json"))) if entries.is_dir() else 0})
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print(json.dumps({"runs": runs, "heavy": heavy}))
"""


def _fresh(argvs: list[list[str]], cache: Path) -> dict[str, Any]:
    env = {**os.environ, "FITCHECK_CACHE_DIR": str(cache), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(argvs), json.dumps(HEAVY)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_a_hit_is_the_same_json_as_a_miss_and_imports_no_torch(tmp_path: Path) -> None:
    """Fresh processes: a miss with ``--no_cache`` (writes nothing), a miss that fills the cache, a hit. The tiny
    8-layer Llama at 32 tokens is outside the checked envelope, so the default path traces it (and replays its
    whole run through the caching allocator for the gap: ``--gpu_memory`` is a CUDA budget). Its ``rope_scaling``
    dict is one transformers writes into (the tracer builds from a copy: the key of every later trace holds the
    config, so a changed mapping made the largest micro-batch's traces miss in the warm process)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_8_LAYERS, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    argv = ["estimate", "--model_name_or_path", str(config), "--bf16", "--per_device_train_batch_size", "2",
            "--max_seq_length", "32", "--optim", "adamw_torch_fused", "--gpu_memory", "2GiB", "--json"]
    cache = tmp_path / "cache"
    cold = _fresh([[*argv, "--no_cache"], argv], cache)
    off, miss = cold["runs"]
    assert off["entries"] == 0  # --no_cache neither reads nor writes
    assert miss["entries"] > 0
    assert {"torch", "transformers"} <= set(cold["heavy"])  # it traced
    assert "activations.traced" in json.loads(miss["out"])["components"]
    warm = _fresh([argv], cache)
    (hit,) = warm["runs"]
    assert warm["heavy"] == []
    assert hit["entries"] == miss["entries"]  # nothing new to store
    assert hit["code"] == miss["code"] == off["code"]
    assert hit["out"] == miss["out"] == off["out"]


def _result(activations: int) -> TraceResult:
    phases = {Phase.FORWARD_END: PhaseBreakdown(activations + 100, {"activations": activations, "parameters": 100}),
              Phase.BACKWARD: PhaseBreakdown(300, {"gradients": 200, "parameters": 100})}
    return TraceResult(phases, 8, 200)


class _Compute:
    """A trace stand-in that counts how often the cache asked for it."""

    def __init__(self, activations: int = 1000) -> None:
        self.calls = 0
        self.activations = activations

    def __call__(self) -> TraceResult:
        self.calls += 1
        return _result(self.activations)


def test_a_hit_gives_back_what_the_components_read(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path)
    compute = _Compute()
    first = cached_trace(cache, "kind of step", LLAMA_8_LAYERS, 2, compute)
    again = cached_trace(TraceCache(tmp_path), "kind of step", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == 1
    assert components_from_trace(again) == components_from_trace(first)
    assert again.phases == first.phases and again.final_grads == first.final_grads


def test_a_changed_config_micro_batch_version_or_source_misses(tmp_path: Path) -> None:
    real = fingerprint()
    assert real["libraries"]["torch"] == importlib.metadata.version("torch")
    assert real["libraries"]["bitsandbytes"] == importlib.metadata.version("bitsandbytes")
    compute = _Compute()
    cached_trace(TraceCache(tmp_path, fingerprint_value=real), "k", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == 1
    cached_trace(TraceCache(tmp_path, fingerprint_value=real), "k", {**LLAMA_8_LAYERS, "rope_theta": 1.0}, 2, compute)
    assert compute.calls == 2
    cached_trace(TraceCache(tmp_path, fingerprint_value=real), "k", LLAMA_8_LAYERS, 3, compute)
    assert compute.calls == 3
    newer = {**real, "libraries": {**real["libraries"], "transformers": "5.24.0"}}
    cached_trace(TraceCache(tmp_path, fingerprint_value=newer), "k", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == 4
    # fitcheck's source: a copy hashes the same; one changed byte in the tracer's room does not
    package = Path(__file__).resolve().parent.parent / "fitcheck"
    copy = tmp_path / "src"
    for d in SOURCE_DIRS:
        shutil.copytree(package / d, copy / d, ignore=shutil.ignore_patterns("__pycache__"))
    for f in SOURCE_FILES:
        shutil.copy(package / f, copy / f)
    assert source_hash(copy) == real["source"]
    with (copy / "torch_adapters" / "trace_batch.py").open("a") as out:
        out.write("#")
    edited = {**real, "source": source_hash(copy)}
    assert edited["source"] != real["source"]
    cached_trace(TraceCache(tmp_path, fingerprint_value=edited), "k", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == 5
    cached_trace(TraceCache(tmp_path, fingerprint_value=real), "k", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == 5  # the first entry is still there


def test_the_kept_source_hash_is_read_again_after_an_edit(tmp_path: Path, monkeypatch: Any) -> None:
    """The source hash kept in the cache directory (``source_hash(index_dir=...)``, so a warm answer does not read
    all of fitcheck's source) answers only while no file is written, added or removed: the content's hash after
    each change, never the kept one."""
    package = Path(__file__).resolve().parent.parent / "fitcheck"
    copy, index = tmp_path / "src", tmp_path / "cache"
    for d in SOURCE_DIRS:
        shutil.copytree(package / d, copy / d, ignore=shutil.ignore_patterns("__pycache__"))
    for f in SOURCE_FILES:
        shutil.copy(package / f, copy / f)
    old = 1_000_000_000  # mtimes in 2001 (the ctimes stay now)
    for path in copy.rglob("*.py"):
        os.utime(path, ns=(old, old))
    real = source_hash(copy)
    assert source_hash(copy, index_dir=index) == real
    assert not list(index.glob("source-*.json"))  # files changed seconds ago: no index (racy timestamps)
    monkeypatch.setattr(trace_cache, "_RACY_NS", 0)
    assert source_hash(copy, index_dir=index) == real
    assert len(list(index.glob("source-*.json"))) == 1
    kept = next(index.glob("source-*.json"))
    kept.write_text(kept.read_text().replace(real, "the kept hash"))
    assert source_hash(copy, index_dir=index) == "the kept hash"  # read from the index, no file read
    edited = copy / "core" / "estimator.py"
    text = edited.read_text()
    edited.write_text(text.replace("def ", "def  ", 1)[:-1])  # same size, mtime put back: ctime still moves
    os.utime(edited, ns=(old, old))
    assert edited.stat().st_size == len(text.encode()) and source_hash(copy) != real
    assert source_hash(copy, index_dir=index) == source_hash(copy)
    (copy / "core" / "new_module.py").write_text("x = 1\n")
    assert source_hash(copy, index_dir=index) == source_hash(copy)


def test_a_bad_entry_is_a_miss_never_an_error(tmp_path: Path) -> None:
    fp = {"source": "s"}
    compute = _Compute()
    cached_trace(TraceCache(tmp_path, fingerprint_value=fp), "k", LLAMA_8_LAYERS, 2, compute)
    (entry,) = (tmp_path / "traces").glob("*.json")
    good = entry.read_text()
    stored = json.loads(good)
    bad_values: list[Any] = [
        {"phases": {"end of forward": {"total": 5, "by_category": {"activations": 4}}}, "num_layers": 8,
         "final_grads": 0},  # categories that do not sum to the total
        {"phases": {"no such phase": {"total": 1, "by_category": {"activations": 1}}}, "num_layers": 8,
         "final_grads": 0},
        {"phases": {}, "num_layers": 8, "final_grads": 0},
        {"phases": {"end of forward": {"total": "1", "by_category": {"activations": "1"}}}, "num_layers": 8,
         "final_grads": 0},
        [1, 2],
        None,
    ]
    corruptions = [
        "", "{", "\x00\xff garbage", good[: len(good) // 2], "[]", json.dumps({**stored, "key": "0" * 64}),
        json.dumps({**stored, "kind": "gap"}), *(json.dumps({**stored, "value": v}) for v in bad_values),
    ]
    for n, text in enumerate(corruptions, start=2):
        entry.write_text(text, encoding="utf-8", errors="surrogateescape")
        cache = TraceCache(tmp_path, fingerprint_value=fp)
        got = cached_trace(cache, "k", LLAMA_8_LAYERS, 2, compute)
        assert compute.calls == n, text[:80]
        assert components_from_trace(got) == components_from_trace(_result(1000))
        assert json.loads(entry.read_text()) == stored  # the miss wrote the entry again
    entry.write_bytes(b"\xff\xfe\x00")
    cached_trace(TraceCache(tmp_path, fingerprint_value=fp), "k", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == len(corruptions) + 2


def test_replays_round_trip(tmp_path: Path) -> None:
    """What ``--seq_lengths`` and ``--reserved_replay`` keep (the s11 near-budget replays use the same form)."""
    pair = (StepReplay(10, 16, 4, 6, 1.0, (512, 1024), (12, 16)), StepReplay(9, 12, 4, 5, 0.6, (1024,), (12,)))
    calls: list[int] = []

    def compute() -> tuple[StepReplay, StepReplay]:
        calls.append(1)
        return pair

    cache = TraceCache(tmp_path, fingerprint_value={})
    assert cached_lengths(cache, "a spec", (512, 1024), compute) == pair
    assert cached_lengths(TraceCache(tmp_path, fingerprint_value={}), "a spec", (512, 1024), compute) == pair
    assert cached_lengths(TraceCache(tmp_path, fingerprint_value={}), "a spec", (1024,), compute) == pair
    assert len(calls) == 2


def test_where_it_lives_and_the_off_switch(tmp_path: Path) -> None:
    assert cache_directory({"FITCHECK_CACHE_DIR": "off"}) is None
    assert cache_directory({"FITCHECK_CACHE_DIR": " OFF ", "XDG_CACHE_HOME": "/x"}) is None
    assert cache_directory({"FITCHECK_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_directory({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/fitcheck")
    assert cache_directory({"XDG_CACHE_HOME": "relative", "HOME": "/h"}) == Path("/h/.cache/fitcheck")
    assert cache_directory({"HOME": "/h"}) == Path("/h/.cache/fitcheck")
    # tests/conftest.py: never the real home
    here = os.environ["FITCHECK_CACHE_DIR"]
    assert Path(here).is_relative_to(tempfile.gettempdir()) and not Path(here).is_relative_to(Path.home())


def test_writes_are_atomic_bounded_and_never_fail(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path, max_bytes=8_000, fingerprint_value={})
    for n in range(40):
        cached_trace(cache, f"kind {n}", LLAMA_8_LAYERS, 2, _Compute(n))
    files = list((tmp_path / "traces").iterdir())
    assert all(f.suffix == ".json" and not f.name.startswith(".tmp-") for f in files)
    assert sum(f.stat().st_size for f in files) <= 8_000
    compute = _Compute(39)
    cached_trace(TraceCache(tmp_path, fingerprint_value={}), "kind 39", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == 0  # the newest entries are kept
    blocked = tmp_path / "a file"
    blocked.write_text("")
    compute = _Compute()
    cached_trace(TraceCache(blocked, fingerprint_value={}), "k", LLAMA_8_LAYERS, 2, compute)
    cached_trace(TraceCache(blocked, fingerprint_value={}), "k", LLAMA_8_LAYERS, 2, compute)
    assert compute.calls == 2  # not writable: every answer computed, none failed


def test_concurrent_writers_and_readers_see_whole_entries(tmp_path: Path) -> None:
    """Writers of one key and readers at the same time (threads here; processes rename the same way): a reader
    gets nothing or one whole entry, never a torn one or an error."""
    import threading

    seen: list[Any] = []
    errors: list[BaseException] = []

    def write(n: int) -> None:
        cache = TraceCache(tmp_path, fingerprint_value={})
        for i in range(40):
            cache.store("trace", ["k"], {"writer": n, "i": i, "pad": "x" * 4096})

    def read() -> None:
        cache = TraceCache(tmp_path, fingerprint_value={})
        for _ in range(200):
            try:
                seen.append(cache.load("trace", ["k"]))
            except BaseException as exc:  # the test is that nothing escapes
                errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(3)] + [threading.Thread(target=read)
                                                                             for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    whole = [v for v in seen if v is not None]
    assert whole and all(v["pad"] == "x" * 4096 and set(v) == {"writer", "i", "pad"} for v in whole)
    assert len(list((tmp_path / "traces").iterdir())) == 1  # one entry, no temporary file left
