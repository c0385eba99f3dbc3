#!/usr/bin/env bash
# Creates .venv and installs the project with everything the sweep and the tests need.
# Idempotent: re-running after a change to pyproject.toml reinstalls; otherwise it is a no-op.
#   scripts/setup.sh            the sweep's environment (.venv)
#   scripts/setup.sh --test     also the optional .[hf] extra (transformers, for the hf_gpt2
#                               workload), the system packages the tests use (Chromium, Docker's
#                               engine and Compose, debootstrap), and a Docker engine: when none
#                               answers, it starts dockerd (as root) and leaves it running
#   scripts/setup.sh --start-docker  only that: dockerd, when no Docker engine answers (root)
#   scripts/setup.sh --stop-docker   stops the dockerd that setup.sh started, and nothing else,
#                               and puts back the iptables rules from before it (`make test`
#                               calls it after the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKERD_PID=/run/commhooks-sweep-dockerd.pid        # the dockerd this script started, if any
FIREWALL_BEFORE=/run/commhooks-sweep-iptables.before # iptables-save from before it started
start_docker() {  # a Docker engine for the docker tests (tests/docker_engine.py), when none answers
  if [ "$(id -u)" != 0 ] || ! command -v dockerd >/dev/null 2>&1 || docker info >/dev/null 2>&1; then
    return 0
  fi
  echo "setup: starting dockerd for the docker tests (log /var/log/commhooks-sweep-dockerd.log)" >&2
  iptables-save >"$FIREWALL_BEFORE" 2>/dev/null || true
  cat /proc/sys/net/ipv4/ip_forward >"$FIREWALL_BEFORE.ip_forward"  # dockerd turns it on
  setsid dockerd </dev/null >/var/log/commhooks-sweep-dockerd.log 2>&1 &
  echo $! >"$DOCKERD_PID"
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start: see /var/log/commhooks-sweep-dockerd.log" >&2; exit 1; }
}
stop_docker() {  # that dockerd only; then the host's firewall and IP forwarding as they were
                 # before it (dockerd leaves its chains, a FORWARD DROP and forwarding on behind)
  [ -f "$DOCKERD_PID" ] || return 0
  local pid
  pid=$(cat "$DOCKERD_PID")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
    echo "setup: stopping the dockerd that setup.sh started (pid $pid)" >&2
    kill "$pid"
    for _ in $(seq 60); do [ -d "/proc/$pid" ] || break; sleep 1; done
  fi
  if grep -q "^\*" "$FIREWALL_BEFORE" 2>/dev/null; then
    iptables-restore <"$FIREWALL_BEFORE"
  elif [ -f "$FIREWALL_BEFORE" ]; then  # no rules before: empty tables, ACCEPT policies
    for table in $(iptables-save | sed -n 's/^\*//p'); do
      iptables -t "$table" -F && iptables -t "$table" -X
      for chain in $(iptables -t "$table" -S | awk '$1 == "-P" {print $2}'); do iptables -t "$table" -P "$chain" ACCEPT; done
    done
  fi
  if [ -f "$FIREWALL_BEFORE.ip_forward" ]; then
    cat "$FIREWALL_BEFORE.ip_forward" >/proc/sys/net/ipv4/ip_forward
  fi
  rm -f "$DOCKERD_PID" "$FIREWALL_BEFORE" "$FIREWALL_BEFORE.ip_forward"
}
case "${1:-}" in
  --start-docker) start_docker; exit 0 ;;
  --stop-docker) stop_docker; exit 0 ;;
esac
# The interpreter .venv is built on: PYTHON when set; otherwise the distribution's build of the
# python3 on PATH (same version, so the same wheels), when it has venv. A pyenv build, as python3 is
# on this machine, has neither PGO nor LTO and loads libpython as a shared library; Debian's
# /usr/bin/python3.11 has both and links it in: pure Python 1.65x as fast, a sweep's trial start-up
# 26 % shorter and its CPU 18 % less, measured side by side (docs/performance.md, "The main job and the suite").
choose_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  local version
  version=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ -x "/usr/bin/python$version" ] && "/usr/bin/python$version" -c "import ensurepip, venv" 2>/dev/null; then
    echo "/usr/bin/python$version"
  else
    echo python3
  fi
}
PY=$(choose_python)
base() { "$1" -c 'import os, sys; print(os.path.realpath(sys._base_executable))'; }
PY_EXE=$(base "$PY")
if [ -x .venv/bin/python ] && [ "$(base .venv/bin/python 2>/dev/null)" != "$PY_EXE" ]; then
  echo "setup: .venv was made with another Python: remaking it on $PY_EXE" >&2
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# (this machine's pip config names find-links folders that may not exist: drop that noise only)
# setuptools' editable build warns "Editable installation ... Please be careful with folders in your
# working directory with the same name as your package" on every `pip install -e`, a banner about
# nothing wrong here, which pip relays as a BuildBackendWarning: that one message is filtered (in
# the build backend's process and in pip's, both read PYTHONWARNINGS); every other warning shows.
pipq() {
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --quiet "$@" \
    2> >(grep -v "^WARNING: Location" >&2)
}
# The packages go in with uv when it installs (pip fetches it in ~2 s): the same versions pip
# resolves, in a quarter of pip's time (a fresh .venv with the tests' extra: ~40 s against ~90 s,
# docs/performance.md, "The main job and the suite"), which every fresh clone's `make sweep` and CI pay. uv reads
# neither pip's config nor PIP_FIND_LINKS, so pip's find-links (where torch's CPU wheel lies) are
# passed on. Byte-compiled as pip does: without .pyc every Ray worker would compile torch on import.
# pip does it all when uv cannot be had (no index reachable) or fails.
find_links() {
  .venv/bin/python -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" \
    | tr ' ' '\n' | sort -u | while read -r dir; do [ -d "$dir" ] && printf -- '--find-links\n%s\n' "$dir"; done
}
install() {  # install SPEC...: the project's packages into .venv
  if [ -x .venv/bin/uv ] || pipq uv 2>/dev/null; then
    local links=()
    mapfile -t links < <(find_links)
    if PYTHONWARNINGS="ignore:Editable installation" .venv/bin/uv pip install --quiet \
        --python .venv/bin/python --compile-bytecode "${links[@]}" --upgrade-package pip pip "$@"; then
      return 0
    fi
    echo "setup: uv could not install; pip will" >&2
  fi
  pipq --upgrade pip
  pipq "$@"
}
# The tests (--test) train the hf_gpt2 workload too: its optional extra (pinned in pyproject.toml),
# installed in the same pass (each pass byte-compiles the whole environment again).
digest=$(sha256sum pyproject.toml | cut -c1-16)
stamp=.venv/.installed-$digest hf_stamp=.venv/.installed-hf-$digest
extras=service,dev
[ "${1:-}" = "--test" ] && extras=service,dev,hf
if [ ! -f "$stamp" ] || { [ "$extras" = service,dev,hf ] && [ ! -f "$hf_stamp" ]; }; then
  echo "setup: installing .[$extras] into .venv (first time: under a minute with uv, about 2 with pip)" >&2
  # torch pinned: the CPU wheel this machine keeps on disk (an unpinned torch is a multi-GB CUDA build).
  install "torch==2.13.0" -e ".[$extras]"
  .venv/bin/python -c "import torch, ray, mlflow, hooks" # fail loudly if the install did not take
  rm -f .venv/.installed-*
  touch "$stamp"
  if [ "$extras" = service,dev,hf ]; then
    .venv/bin/python -c "import transformers"
    touch "$hf_stamp"
  fi
fi
# iproute2's `ip` and `tc` build the emulated hosts and links of a config's network: section
# (service/network/netem.py); minimal images lack them. Only root can use them, so only root installs.
if ! command -v tc >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's iproute2 (ip, tc) for emulated links" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
  else
    echo "setup: no ip/tc: sweeps with a network: section need iproute2 (apt-get install iproute2) and root" >&2
  fi
fi
if [ "${1:-}" = "--test" ]; then
  # System tools the tests use for real: headless Chromium renders report.html; Debian's Docker
  # engine (docker.io, with iptables) and Compose v1 (docker-compose: bookworm has no v2 plugin)
  # build docker/ and run the stack; debootstrap makes the air-gapped base image
  # (scripts/offline_images.sh).
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing Debian's ${missing[*]} for the tests" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "setup: missing ${missing[*]}: install them (e.g. apt-get install ${missing[*]}) for the tests" >&2
    fi
  fi
  start_docker  # left running for the tests; `make test` runs --stop-docker after them
fi
