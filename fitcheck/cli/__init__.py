"""The ``fitcheck`` command: one module per subcommand (``estimate``, ``launch``, ``plot``), wired in :mod:`.main`.

Exit codes: 0 the run fits, 1 it does not, 2 bad input.
"""

__all__: list[str] = []
