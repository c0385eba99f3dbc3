"""``python -m service.probe``: probe a Ray cluster's transport and write transport.json (the
command lives in service/sweep/probe_cli.py; this name is the public entry point)."""

import sys

from service.sweep.probe_cli import main

if __name__ == "__main__":
    sys.exit(main())
