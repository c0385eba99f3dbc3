#!/usr/bin/env bash
# The air-gapped build of docker/Dockerfile: no image registry, no PyTorch index, no pip in the
# build. What it needs comes from this host, cached between runs (never in the repository):
#
#   scripts/offline_images.sh base     Debian bookworm from the Debian mirror apt already uses
#                                      (debootstrap minbase + python3, venv, gcc), imported as
#                                      the image commhooks-base:bookworm
#   scripts/offline_images.sh wheels   a wheelhouse of every wheel the image installs (torch
#                                      2.13.0 CPU as this host's pip finds it), built with .venv's pip
#   scripts/offline_images.sh build    both of the above, then the images commhooks-sweep:offline
#                                      (docker/Dockerfile from the wheelhouse) and
#                                      commhooks-postgres:15 (docker/postgres.Dockerfile)
#
# Cache: ${COMMHOOKS_DOCKER_CACHE:-~/.cache/commhooks-docker}. Each step is a no-op when its
# result exists (delete the cache folder, or `docker image rm` the image, to redo it).
# docs/cluster.md ("The air-gapped build") explains the steps; tests/test_compose.py runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${COMMHOOKS_DOCKER_CACHE:-$HOME/.cache/commhooks-docker}
BASE=commhooks-base:bookworm
IMAGE=commhooks-sweep:offline  # compose.offline.yaml: IMAGE_TAG=offline
PG_IMAGE=commhooks-postgres:15
# Exactly the pins of the Dockerfile's install step (the torch and psycopg2 build args).
TORCH="torch==2.13.0"
PSYCOPG2="psycopg2-binary==2.9.13"
SETUPTOOLS="setuptools>=68"  # pyproject.toml's build backend: pip builds the project in the image
mkdir -p "$CACHE"

mirror() {  # the first Debian mirror of apt's own sources (deb822 or one-line format)
  local uri
  uri=$(grep -hoE '^URIs: *\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
  [ -n "$uri" ] || uri=$(grep -hoE '^deb +\S+' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

base() {
  if docker image inspect "$BASE" >/dev/null 2>&1; then return; fi
  local tarball=$CACHE/base-bookworm.tar
  if [ ! -f "$tarball" ]; then
    local dir
    dir=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    echo "offline_images: debootstrap bookworm from $(mirror) (a few minutes)" >&2
    debootstrap --variant=minbase --include=python3,python3-venv,gcc,libc6-dev,passwd \
      bookworm "$dir" "$(mirror)" >"$CACHE/debootstrap.log"
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -c . >"$tarball.part" && mv "$tarball.part" "$tarball"
    rm -rf "$dir"
  fi
  docker import "$tarball" "$BASE" >/dev/null
}

wheelhouse_dir() {  # one wheelhouse per set of pins: pyproject.toml's and the three above
  echo "$CACHE/wheels-$({ cat pyproject.toml; echo "$TORCH $PSYCOPG2 $SETUPTOOLS"; } | sha256sum | cut -c1-12)"
}

wheels() {
  local dir
  dir=$(wheelhouse_dir)
  if [ -f "$dir/.complete" ]; then return; fi
  echo "offline_images: building the wheelhouse $dir" >&2
  rm -rf "$CACHE"/wheels-*  # older pins' wheelhouses
  local had_build=false
  [ -e build ] && had_build=true
  .venv/bin/python -m pip wheel --quiet --wheel-dir "$dir" "$TORCH" ".[service,hf]" "$PSYCOPG2" "$SETUPTOOLS" \
    2> >(grep -v "^WARNING: Location" >&2)
  rm -f "$dir"/commhooks_sweep-*.whl  # the project itself is copied into the image, not a wheel
  $had_build || rm -rf build          # what building the project's wheel left in the checkout
  touch "$dir/.complete"
}

build() {
  base
  wheels
  # The wheelhouse, served on the host's loopback for the length of the build; the build's
  # containers share the host's network (--network host) to reach it, and pip trusts plain
  # HTTP from localhost only.
  # A fixed port: the URL is a build argument, and a new one would void the build's cache.
  port=${COMMHOOKS_WHEELHOUSE_PORT:-38471}
  python3 -m http.server --bind 127.0.0.1 --directory "$(wheelhouse_dir)" "$port" >/dev/null 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  sleep 1
  kill -0 $server 2>/dev/null || { echo "offline_images: cannot serve the wheelhouse on 127.0.0.1:$port (busy? set COMMHOOKS_WHEELHOUSE_PORT)" >&2; exit 1; }
  docker build --network host -f docker/Dockerfile --build-arg BASE_IMAGE="$BASE" \
    --build-arg WHEELHOUSE="http://127.0.0.1:$port/" -t "$IMAGE" .
  docker build -f docker/postgres.Dockerfile --build-arg BASE_IMAGE="$BASE" -t "$PG_IMAGE" docker
}

case "${1:-}" in
  base) base ;;
  wheels) wheels ;;
  build) build ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
