"""A real Docker engine for the tests that need one (tests/test_netem_docker.py, tests/test_compose.py).

The engine that runs on the machine (scripts/setup.sh --test starts one), or else one that
the test module starts as root and stops again: only that dockerd, by its pid. Stopping it
leaves Docker's iptables chains and FORWARD policy behind, as any dockerd does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
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
    """Yield with a Docker engine answering; start (and afterwards stop) one if none does."""
    if engine_answers():
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("no Docker engine answers, and starting one needs root (CI runs as root)")
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.fail("no Docker engine: scripts/setup.sh --test installs Debian's docker.io and starts it")
    log = tempfile.NamedTemporaryFile(prefix="dockerd-test-", suffix=".log", delete=False)
    proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not engine_answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dockerd did not start (exit {proc.poll()}): see {log.name}")
            time.sleep(1)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)  # dockerd stops its containers and its containerd
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
