#!/usr/bin/env bash
# Creates .venv and installs the project with everything the sweep and the tests need.
# Idempotent: re-running after a change to pyproject.toml reinstalls; otherwise it is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing into .venv (first time: about 4 minutes)" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  # torch first, pinned: the CPU wheel this machine keeps on disk (installs in seconds).
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -e ".[service,dev]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
