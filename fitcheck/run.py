"""``python -m fitcheck.run script.py [args]``: run a training script with a FitcheckCallback in every Trainer.

A shim over :mod:`fitcheck.integrations.run` (the integration lives there).
"""

import sys

from fitcheck.integrations import run_main as main

if __name__ == "__main__":
    sys.exit(main())
