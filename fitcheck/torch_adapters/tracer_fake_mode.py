"""Leaving torch's fake-tensor mode for a moment: shared by the 4-bit and 8-bit tracer paths (no circle)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def outside_fake_mode(fake: bool) -> Iterator[None]:
    """Run the block with real tensors when tracing on fake ones (bitsandbytes builds its packed weights there).

    Args:
        fake: Whether the caller is inside ``FakeTensorMode``; nothing changes when it is not.
    """
    if not fake:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield
