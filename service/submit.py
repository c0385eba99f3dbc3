"""``python -m service.submit``: submit a sweep to a Ray cluster as a Ray Job (the command lives
in service/sweep/submit.py; this name is the public entry point, kept where users call it)."""

import sys

from service.sweep.submit import main

if __name__ == "__main__":
    sys.exit(main())
