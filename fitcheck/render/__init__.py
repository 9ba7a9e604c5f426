"""Renderers: a report (and its advice) as a rich table, JSON, or a matplotlib figure. No estimating here.

- :mod:`.table`: the terminal report, suggestions and the compute line (rich);
- :mod:`.brief`: ``--brief``, at most 8 lines;
- :mod:`.json_out`: ``--json`` (field names are a contract: extend, don't rename);
- :mod:`.plot`: memory vs micro-batch / sequence length and the component stack (matplotlib, lazy).
"""

from fitcheck.render.brief import brief_lines
from fitcheck.render.json_out import advice_to_dict, report_to_dict
from fitcheck.render.plot import plot_report
from fitcheck.render.table import compute_line, make_console, print_report, suggestions_table

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
