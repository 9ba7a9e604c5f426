"""``--help`` text without reStructuredText markup: docstrings are written for Sphinx (````x````,
``:mod:`x```), a terminal shows the words."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain(text: str | None) -> str | None:
    """``text`` with Sphinx roles (``:class:`X``` -> ``X``) and double-backtick literals (````x```` -> ``x``)
    reduced to their words."""
    if text is None:
        return None
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))
