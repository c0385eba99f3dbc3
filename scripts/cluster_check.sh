#!/usr/bin/env bash
# The report's cluster path held out at W = 8 and 16 on emulated hosts that each own a core:
# every registered hook, error feedback on and off, two links (bench/projection.py --host-cpus
# --comm-apart: the rank's compute in its host's share, gloo's threads beside it, the emulation
# a sweep's network.host_cpus hosts run). Prints the held-out table and each W's median error.
# Needs root (network namespaces, cgroup v1) and at least 16 cores: on fewer, W = 16's ranks would
# time-share cores a cluster gives each host, which a model of a cluster must not price.
# The raw run lands in bench/results/cluster_check.json, its bands in cluster_check_bands.json.
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
if [ "$cores" -lt 16 ]; then
  echo "cluster_check: needs at least 16 cores (a core per emulated host at W = 16); this machine has $cores" >&2
  exit 2
fi
mkdir -p bench/results
exec "${PYTHON:-.venv/bin/python}" bench/projection.py --host-cpus 0.9 --comm-apart \
  --world-sizes 2 8 16 --links 0.5 1 --repeats 1 --steps 12 --quality-steps 0 --error-feedback on off \
  --out bench/results/cluster_check.json --band-out bench/results/cluster_check_bands.json "$@"
