"""``python -m service.sweep``: the command line (service/sweep/cli.py)."""

import sys

from service.sweep.cli import main

sys.exit(main())
