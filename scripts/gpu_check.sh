#!/usr/bin/env bash
# GPU check: every hook, the quantize kernels and one use_gpu sweep trial on one CUDA device.
# A thin wrapper over bench/gpu_check.py (--help says what it checks; --dry-run runs it on CPU).
# Needs a CUDA build of torch 2.13.0 in the project's .venv (or PYTHON=...); exit 2 without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" bench/gpu_check.py "$@"
