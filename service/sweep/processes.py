"""The processes of a local Ray instance that this process started: found by descent from the
ones ``ray.init`` started (GCS, raylet, their workers: Tune trials, Train controllers and
workers), and stopped, every one of them, however the sweep ends.

``ray.shutdown()`` alone asks the raylet to end its workers; a worker that does not answer (a
Train controller seen here, reparented to init and still holding 450 MB an hour and a half
later) outlives it. So the tree is read *before* the shutdown, and what is still alive after a
grace period is killed. Linux /proc; elsewhere nothing is found and only ray.shutdown() runs.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process (Linux /proc; empty elsewhere)."""
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # a zombie has ended: nothing to stop
            out[int(entry)] = int(fields[1])
    return out


def child_pids(pid: int | None = None) -> set[int]:
    """Pids of ``pid``'s (default: this process's) direct children."""
    me = os.getpid() if pid is None else pid
    return {p for p, parent in _parents().items() if parent == me}


def descendants(roots: set[int]) -> set[int]:
    """The live processes among ``roots`` and everything below them."""
    parents = _parents()
    found, frontier = {p for p in roots if p in parents}, set(roots)
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def alive(pids: set[int]) -> set[int]:
    live = _parents()
    return {p for p in pids if p in live}


@dataclass(frozen=True)
class LocalRay:
    """A local Ray instance this process started: ``roots``, the processes ray.init started."""

    roots: frozenset[int]

    def stop(self, grace_s: float = 10.0) -> set[int]:
        """ray.shutdown(), then SIGKILL for whatever of the instance is alive ``grace_s`` later.
        Returns the pids still alive after that (empty: everything stopped)."""
        import ray

        tree = descendants(set(self.roots))  # before the shutdown: orphans lose their parent
        ray.shutdown()
        deadline = time.monotonic() + grace_s
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        kill(alive(tree))
        deadline = time.monotonic() + 5.0
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        return alive(tree)
