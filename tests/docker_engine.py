"""A real Docker engine for the tests that need one (tests/test_netem_docker.py, tests/test_compose.py):
the one running on the machine (scripts/setup.sh --test starts it), and the Compose CLI."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Iterator

import pytest


def compose_cli() -> list[str] | None:
    """Compose v2 (`docker compose`) where the plugin is installed, else v1 (`docker-compose`,
    what Debian bookworm packages: its archive has no v2 plugin); None without either."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def engine_answers() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0


@contextlib.contextmanager
def docker_engine() -> Iterator[None]:
    """Yield with a Docker engine answering. It is never started here: two test files running
    side by side (xdist) would stop each other's; `scripts/setup.sh --test` starts one (CI, `make
    test`), `scripts/setup.sh --start-docker` for a single file, `--stop-docker` afterwards."""
    if not engine_answers():
        if os.geteuid() != 0:
            pytest.skip("no Docker engine answers, and starting one needs root (CI runs as root)")
        pytest.fail("no Docker engine answers: run scripts/setup.sh --start-docker (scripts/setup.sh --test "
                    "installs Debian's docker.io and starts it)")
    yield
