"""Renderers: a report (and its advice) as a rich table, JSON, or a matplotlib figure. No estimating here.

- :mod:`.table`: the terminal report, suggestions and the compute line (rich);
- :mod:`.brief`: ``--brief``, at most 8 lines;
- :mod:`.json_out`: ``--json`` (field names are a contract: extend, don't rename);
- :mod:`.plot`: memory vs micro-batch / sequence length and the component stack (matplotlib, lazy).

Each name is imported from its module on first use (PEP 562 ``__getattr__``): ``--json`` does not import rich, and
a table does not import the JSON writer. (Measured by ``benchmarks/default_path_speed.py``: importing rich costs
about 0.08 s of CPU in a fresh process on the 2-core CI machine, a quarter of issue 20's 0.3 s for the formula
answer.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fitcheck.render.brief import brief_lines
    from fitcheck.render.json_out import advice_to_dict, report_to_dict
    from fitcheck.render.plot import plot_report
    from fitcheck.render.table import compute_line, make_console, print_report, suggestions_table

# name -> the module that defines it
_HOMES: dict[str, str] = {
    "advice_to_dict": "json_out",
    "brief_lines": "brief",
    "compute_line": "table",
    "make_console": "table",
    "plot_report": "plot",
    "print_report": "table",
    "report_to_dict": "json_out",
    "suggestions_table": "table",
}

__all__ = [
    "advice_to_dict",
    "brief_lines",
    "compute_line",
    "make_console",
    "plot_report",
    "print_report",
    "report_to_dict",
    "suggestions_table",
]


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fitcheck.render.{home}"), name)
    globals()[name] = value
    return value
