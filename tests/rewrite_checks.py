"""What the tests of a rewritten whole run (DeepSpeed's, FSDP2's) check of a traced answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def takes_the_replay(spec: Any, whole_run: Callable[..., Any]) -> Any:
    """A traced answer of ``spec`` (``PinnedPath("always")``): no ``reserved-published-gap`` INFO, and its reserved
    is the estimate with the gap of the rewritten run's replay (``whole_run``: ``deepspeed_run_events.whole_run``,
    ``fsdp2_run_events.whole_run``). Returns (the path, the report, the replay)."""
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import PinnedPath
    from fitcheck.torch_adapters.pinned_path import _cache_key

    path = PinnedPath("always")
    report = path(spec)
    assert "reserved-published-gap" not in {f.code for f in report.findings}
    replay = whole_run(path, spec, _cache_key(spec))
    traced = tuple(c for c in report.components if c.name.endswith(".traced"))
    assert report.peak_reserved_bytes == estimate(spec, activations=traced,
                                                  gap_fraction=replay.gap_fraction).peak_reserved_bytes
    return path, report, replay
