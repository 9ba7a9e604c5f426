"""fitcheck's own on-disk cache of what the default path traces and replays, so a spec traced before is not traced
again: a fresh process answering it imports no torch, transformers, peft or bitsandbytes.

Measured on the 2-core development machine (``benchmarks/default_path_speed.py``,
``benchmarks/data/default_path_speed.json``): a fresh process answering a traced Qwen3-8B QLoRA run spends ~8 s
importing torch, transformers and (through peft) bitsandbytes before it traces anything, and each trace takes
~0.4 s after the imports; the imports, not the traces, are what a second answer of the same run would pay. What
``PinnedPath`` keeps in memory per process is kept here across processes:

- ``trace``: the full-depth trace result of one kind of step (``PinnedPath._cache_key`` and the model's
  config.json) at one micro-batch: the phases' breakdowns and the final gradients, all that
  ``trace_result.components_from_trace`` reads (``trace_batch.BatchTraces.result``);
- ``gap``: the traced step's caching-allocator gap (``PinnedPath._traced_gap``), with the whole-run replay it came
  from or why that could not run, per spec (the replay runs the spec's optimizer, sharding and allocator
  settings, so the whole spec is its key);
- ``whole-run`` / ``lengths``: the allocator replays ``--reserved_replay`` and ``--seq_lengths`` ask for
  (``PinnedPath._whole_run``, ``PinnedPath._lengths_replayed``), per spec.

Every key also holds the versions of the libraries a trace runs (read with ``importlib.metadata``, nothing is
imported), a hash of fitcheck's own source that computes traces, replays and estimates (``torch_adapters``,
``core``, ``spec``, ``report.py``, ``units.py``: a code change misses) and this format's number. Entries are JSON
(never pickle: nothing loaded from the cache can run code), written to a temporary file and renamed into place
(``os.replace`` is atomic on POSIX and Windows, so a concurrent reader sees the old entry or the new one); an entry
that cannot be read, parsed or validated is a miss, never an error, and a write that fails is skipped. The
directory is kept under ``max_bytes`` by removing the least recently used entries (a hit touches its file).

Where it lives: ``$FITCHECK_CACHE_DIR``, else ``$XDG_CACHE_HOME/fitcheck``, else ``~/.cache/fitcheck``;
``FITCHECK_CACHE_DIR=off`` (or ``fitcheck estimate --no_cache``) turns it off. The environment is read by
:func:`cache_from_environment`, which the CLI calls; ``PinnedPath`` caches only when given a cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fitcheck.report import Phase

T = TypeVar("T")

ENV_VAR = "FITCHECK_CACHE_DIR"
OFF = "off"
FORMAT = 1  # raise when an entry's JSON layout changes
DEFAULT_MAX_BYTES = 64 * 2**20  # ~1 KiB per trace entry: tens of thousands of answers
# fitcheck's own code that computes a cached value, relative to the package
SOURCE_DIRS = ("torch_adapters", "core", "spec")
SOURCE_FILES = ("report.py", "units.py")
_SUBDIR = "traces"


def cache_directory(environ: Mapping[str, str]) -> Path | None:
    """Where the cache lives for an environment, or None when it is turned off.

    Args:
        environ: The process environment (the CLI passes ``os.environ``).

    Returns:
        ``$FITCHECK_CACHE_DIR`` (None for ``off``), else ``$XDG_CACHE_HOME/fitcheck`` (an absolute path, as the XDG
        base directory specification requires of it), else ``~/.cache/fitcheck`` (None without a home).
    """
    given = environ.get(ENV_VAR, "").strip()
    if given.lower() == OFF:
        return None
    if given:
        return Path(given).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "fitcheck"
    home = environ.get("HOME", "").strip()
    if not home:
        try:
            home = str(Path.home())
        except (RuntimeError, KeyError):  # no home directory to be found: no cache, never an error
            return None
    return Path(home) / ".cache" / "fitcheck"


def cache_from_environment(environ: Mapping[str, str]) -> TraceCache | None:
    """The cache an environment names (:func:`cache_directory`), or None when it is off."""
    directory = cache_directory(environ)
    return None if directory is None else TraceCache(directory)


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries whose code a trace or a replay runs (``readers.versions.installed_stack``:
    the packages the estimate is modelled on, read from their dist-info without importing them); None: absent."""
    from fitcheck.readers import installed_stack
    from fitcheck.spec import MODELLED_VERSIONS

    found = dict(installed_stack().versions)
    return {name: found.get(name) for name in MODELLED_VERSIONS}


def _source_files(base: Path) -> list[str]:
    """fitcheck's source files that compute cached values (``SOURCE_DIRS``' ``*.py`` files, at any depth, without
    entering linked directories, and ``SOURCE_FILES``), relative to ``base``, in sorted order."""
    found = list(SOURCE_FILES)
    stack = list(SOURCE_DIRS)
    while stack:
        rel = stack.pop()
        with os.scandir(base / rel) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(f"{rel}/{entry.name}")
                elif entry.name.endswith(".py"):
                    found.append(f"{rel}/{entry.name}")
    return sorted(found)


def _content_hash(base: Path, files: list[str]) -> str:
    import hashlib  # on first use only: a --no_trace answer never hashes (~5 ms of CPU to import)

    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update((base / rel).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _stats(base: Path, files: list[str]) -> list[list[Any]]:
    """Each file's (path, size, mtime_ns, ctime_ns): a write changes mtime, and ``os.utime`` (which can put an old
    mtime back) changes ctime, which no call can set."""
    rows: list[list[Any]] = []
    for rel in files:
        st = os.stat(base / rel)
        rows.append([rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return rows


# A file changed within this many ns of the index's writing could change again within the file system's timestamp
# granularity (FAT: 2 s) with the same size and times: the index is not written then, so its content is read again.
_RACY_NS = 3 * 10**9


def source_hash(root: Path | None = None, index_dir: Path | None = None) -> str:
    """sha256 of fitcheck's source that computes the cached values (``SOURCE_DIRS``, ``SOURCE_FILES``).

    With ``index_dir`` (the cache's directory), the hash is kept there with every file's size, mtime and ctime
    (``source-<path hash>.json``, one per checkout): while no file is added, removed or written (each changes the
    stat rows), the kept hash is the answer, without reading the ~150 files (~1.5 ms of ``stat`` vs ~13 ms of
    reading and hashing at load 3 on the 2-core development machine). A file written in the last ``_RACY_NS``
    keeps the index from being written (racy timestamps, as git's index treats them). An unreadable index is a miss.
    """
    base = Path(__file__).resolve().parent.parent if root is None else root
    files = _source_files(base)
    if index_dir is None:
        return _content_hash(base, files)
    import hashlib

    index = Path(index_dir) / f"source-{hashlib.sha256(str(base).encode()).hexdigest()[:16]}.json"
    stats = _stats(base, files)
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
        kept = json.loads(index.read_text(encoding="utf-8"))
        if isinstance(kept, dict) and kept.get("files") == stats and isinstance(kept.get("hash"), str):
            return str(kept["hash"])
    value = _content_hash(base, files)
    now = time.time_ns()
    if _stats(base, files) == stats and all(now - max(r[2], r[3]) > _RACY_NS for r in stats):
        with contextlib.suppress(OSError):
            _write_atomic(index, json.dumps({"base": str(base), "files": stats, "hash": value}))
    return value


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place (``os.replace`` is atomic: a
    concurrent reader sees the old file or the new one); the directory is created. Raises ``OSError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fingerprint(index_dir: Path | None = None) -> dict[str, Any]:
    """What every entry's key holds besides its own parts: libraries, fitcheck's source (its hash kept in
    ``index_dir`` when given: :func:`source_hash`), Python, the format."""
    return {"format": FORMAT, "python": list(sys.version_info[:2]), "libraries": library_versions(),
            "source": source_hash(index_dir=index_dir)}


class TraceCache:
    """A directory of JSON entries, each a value under a key (a kind and JSON-ready parts).

    Attributes:
        directory: Where the entries are (``<directory>/traces``).
        max_bytes: Size the directory is kept under.
        hits: Entries read this process.
        misses: Entries looked for and not found (or not valid).
    """

    def __init__(self, directory: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 fingerprint_value: Mapping[str, Any] | None = None) -> None:
        """Args:
        directory: The cache directory (created on the first write).
        max_bytes: Size the directory is kept under (least recently used entries removed first).
        fingerprint_value: The key part shared by every entry (default: :func:`fingerprint`, computed on
            first use: ~15 ms, ~2 ms with the source hash kept in the directory: :func:`source_hash`).
        """
        self.directory = Path(directory) / _SUBDIR
        self.max_bytes = max_bytes
        self._fingerprint = None if fingerprint_value is None else dict(fingerprint_value)
        self._size: int | None = None  # the directory's bytes as of the last prune, plus what this process wrote
        self.hits = 0
        self.misses = 0

    def _digest(self, kind: str, parts: Any) -> str:
        import hashlib

        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.directory.parent)
        text = json.dumps([self._fingerprint, kind, parts], sort_keys=True, default=repr, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def load(self, kind: str, parts: Any) -> Any | None:
        """The value stored under (kind, parts), or None: absent, unreadable, not JSON, or not this entry."""
        return self._load(kind, self._digest(kind, parts))

    def _load(self, kind: str, digest: str) -> Any | None:
        path = self.directory / f"{digest}.json"
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(entry, dict) or entry.get("key") != digest or entry.get("kind") != kind:
                raise ValueError("not this entry")
            os.utime(path)  # least recently used goes first (prune)
        except (OSError, ValueError, UnicodeDecodeError):
            self.misses += 1
            return None
        self.hits += 1
        return entry.get("value")

    def store(self, kind: str, parts: Any, value: Any) -> None:
        """Write a JSON-ready value under (kind, parts) atomically; a write that fails is skipped."""
        self._store(kind, self._digest(kind, parts), value)

    def _store(self, kind: str, digest: str, value: Any) -> None:
        try:
            text = json.dumps({"key": digest, "kind": kind, "value": value}, sort_keys=True)
            _write_atomic(self.directory / f"{digest}.json", text)
        except (OSError, TypeError, ValueError):
            return
        self._size = None if self._size is None else self._size + len(text)
        if self._size is None or self._size > self.max_bytes:  # the first write of a process, or over the bound
            self._size = self.prune()

    def prune(self) -> int:
        """Remove the least recently used entries until the directory is under 3/4 of ``max_bytes`` (when it is
        over ``max_bytes``).

        Returns:
            The directory's bytes afterwards.
        """
        entries = []
        with contextlib.suppress(OSError):
            for path in self.directory.iterdir():
                with contextlib.suppress(OSError):
                    st = path.stat()
                    entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return total
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size
            if total <= self.max_bytes * 3 // 4:
                break
        return total

    def remember(self, kind: str, parts: Any, compute: Callable[[], T], encode: Callable[[T], Any],
                 decode: Callable[[Any], T]) -> T:
        """The stored value decoded, else ``compute()`` stored (encoded) and returned.

        A stored value that ``decode`` rejects (any exception) is a miss. What ``compute`` raises propagates and
        nothing is stored. The key is taken before ``compute`` runs (a trace may add keys to the config mapping
        it reads).
        """
        digest = self._digest(kind, parts)
        stored = self._load(kind, digest)
        if stored is not None:
            try:
                return decode(stored)
            except Exception:  # a malformed entry is a miss
                self.hits -= 1
                self.misses += 1
        value = compute()
        self._store(kind, digest, encode(value))
        return value


def result_to_json(result: Any) -> dict[str, Any]:
    """What ``components_from_trace`` reads of a ``trace_result.TraceResult``, JSON-ready."""
    return {"phases": {p.value: {"total": b.total, "by_category": dict(b.by_category)}
                       for p, b in result.phases.items()},
            "num_layers": result.num_layers, "final_grads": result.final_grads}


def result_from_json(value: Mapping[str, Any]) -> Any:
    """A ``trace_result.TraceResult`` (phases, depth, final gradients) from :func:`result_to_json`'s form.

    Raises:
        ValueError, KeyError, TypeError: Not that form.
    """
    from fitcheck.torch_adapters.trace_result import PhaseBreakdown, TraceResult

    phases = {}
    for name, b in value["phases"].items():
        cats = {str(c): _int(n) for c, n in b["by_category"].items()}
        if _int(b["total"]) != sum(cats.values()):
            raise ValueError("a phase's categories do not sum to its total")
        phases[Phase(name)] = PhaseBreakdown(total=_int(b["total"]), by_category=cats)
    if not phases:
        raise ValueError("no phases")
    return TraceResult(phases, _int(value["num_layers"]), _int(value["final_grads"]))


def replay_to_json(replay: Any) -> dict[str, Any]:
    """An ``allocator_replay.StepReplay`` as JSON."""
    return {"peak_allocated": replay.peak_allocated, "peak_reserved": replay.peak_reserved,
            "persistent": replay.persistent, "transient": replay.transient, "gap_fraction": replay.gap_fraction,
            "lengths": list(replay.lengths), "step_reserved": list(replay.step_reserved),
            "step_allocated": list(replay.step_allocated)}


def replay_from_json(value: Mapping[str, Any]) -> Any:
    """An ``allocator_replay.StepReplay`` from :func:`replay_to_json`'s form (raises on any other)."""
    from fitcheck.torch_adapters.allocator_replay import StepReplay

    gap = value["gap_fraction"]
    if not isinstance(gap, (int, float)) or isinstance(gap, bool):
        raise TypeError("gap_fraction is not a number")
    return StepReplay(_int(value["peak_allocated"]), _int(value["peak_reserved"]), _int(value["persistent"]),
                      _int(value["transient"]), float(gap), tuple(_int(n) for n in value["lengths"]),
                      tuple(_int(n) for n in value["step_reserved"]), tuple(_int(n) for n in value["step_allocated"]))


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}"[:80])
    return value


def cached_trace(cache: TraceCache | None, key: str, config: Mapping[str, Any], micro_batch: int,
                 compute: Callable[[], Any]) -> Any:
    """The full-depth ``TraceResult`` of one kind of step (``PinnedPath._cache_key``, the config.json mapping) at
    ``micro_batch``: stored, else ``compute()`` (``BatchTraces.result``) stored. A stored one has no series and no
    allocation events (``components_from_trace`` reads neither)."""
    if cache is None:
        return compute()
    return cache.remember("trace", [key, config, micro_batch], compute, result_to_json, result_from_json)


def cached_gap(cache: TraceCache | None, key: str, spec: Any, seq_lengths: tuple[int, ...],
               compute: Callable[[], float], whole: dict[str, Any], whole_failed: dict[str, str]) -> float:
    """The traced step's allocator gap (``PinnedPath._traced_gap``: ``compute``), stored with what it leaves in
    ``whole`` / ``whole_failed`` under ``key`` (the whole run replayed, or why it could not be), which a hit puts
    back. Keyed by the whole spec (the replay runs its optimizer, sharding and allocator settings) and
    ``seq_lengths`` (with them the cheap two-group gap is taken)."""
    if cache is None:
        return compute()

    def encode(gap: float) -> dict[str, Any]:
        replay = whole.get(key)
        return {"gap": gap, "whole": None if replay is None else replay_to_json(replay),
                "whole_failed": whole_failed.get(key)}

    def decode(value: Mapping[str, Any]) -> float:
        gap, replay, failed = value["gap"], value["whole"], value["whole_failed"]
        if not isinstance(gap, (int, float)) or isinstance(gap, bool):
            raise TypeError("gap is not a number")
        if failed is not None and not isinstance(failed, str):
            raise TypeError("whole_failed is not a string")
        if replay is not None:
            whole[key] = replay_from_json(replay)
        if failed is not None:
            whole_failed[key] = failed
        return float(gap)

    return cache.remember("gap", [repr(spec), list(seq_lengths)], compute, encode, decode)


def cached_replay(cache: TraceCache | None, kind: str, spec: Any, compute: Callable[[], Any]) -> Any:
    """An ``allocator_replay.StepReplay`` computed from a whole spec (``whole-run``: ``PinnedPath._whole_run``):
    stored, else ``compute()`` stored."""
    if cache is None:
        return compute()
    return cache.remember(kind, [repr(spec)], compute, replay_to_json, replay_from_json)


def cached_lengths(cache: TraceCache | None, spec: Any, lengths: tuple[int, ...],
                   compute: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """The ``--seq_lengths`` replay of a spec (the sequence, the longest alone: ``PinnedPath._lengths_replayed``):
    stored, else ``compute()`` stored."""
    if cache is None:
        return compute()

    def decode(value: Any) -> tuple[Any, Any]:
        sequence, alone = value
        return replay_from_json(sequence), replay_from_json(alone)

    return cache.remember("lengths", [repr(spec), list(lengths)], compute,
                          lambda pair: [replay_to_json(pair[0]), replay_to_json(pair[1])], decode)
