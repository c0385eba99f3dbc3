"""The processes of a local Ray instance that this process started: found by descent from the
ones ``ray.init`` started (GCS, raylet, their workers: Tune trials, Train controllers and
workers), and stopped, every one of them, however the sweep ends.

``ray.shutdown()`` alone asks the raylet to end its workers; a worker that does not answer (a
Train controller seen here, reparented to init and still holding 450 MB an hour and a half
later) outlives it. So the tree is read *before* the shutdown, and what is still alive after a
grace period is killed. Linux /proc; elsewhere nothing is found and only ray.shutdown() runs.

Only a process the service started is ever signalled. A pid alone does not say that: once a
process ends, the kernel may give its pid to any other program. So every process is known by
its ``Proc`` identity, its pid *and* its start time, recorded when first seen and checked again
right before each signal; a process whose start time differs is someone else's and is left alone.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Proc:
    """One process: its pid and its start time (/proc/PID/stat field 22, clock ticks after boot).
    A later process that reuses the pid has a later start time, so the pair names one process."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> "Proc | None":
        """The process that has ``pid`` now (None: no such process, or a zombie)."""
        stat = _stat(pid)
        return None if stat is None or stat[0] == "Z" else cls(pid, stat[2])


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid`` from one read of /proc/PID/stat; None: no such pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state): field N is fields[N - 3]
    return fields[0], int(fields[1]), int(fields[19])


def _table() -> dict[Proc, int]:
    """Every live process (a zombie has ended: nothing to stop) -> its parent pid. Empty off Linux."""
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        stat = _stat(int(entry)) if entry.isdigit() else None
        if stat is not None and stat[0] != "Z":
            out[Proc(int(entry), stat[2])] = stat[1]
    return out


def children(pid: int | None = None) -> set[Proc]:
    """The direct children of ``pid`` (default: this process), as first seen now."""
    me = os.getpid() if pid is None else pid
    return {p for p, parent in _table().items() if parent == me}


def descendants(roots: Iterable[Proc]) -> set[Proc]:
    """Those of ``roots`` that are still the same processes, and every process below them."""
    return walk(_table(), roots)


def walk(table: dict[Proc, int], roots: Iterable[Proc]) -> set[Proc]:
    """``descendants`` in a ``table`` of processes -> parent pids. A process is taken as a child
    only if it started no earlier than its parent: /proc is read one process at a time, and one
    that started before is the child of an earlier holder of the parent's pid, not of ours."""
    found = frontier = {p for p in roots if p in table}
    while frontier:
        starts = {q.pid: q.start for q in frontier}
        frontier = {p for p, parent in table.items()
                    if parent in starts and p.start >= starts[parent] and p not in found}
        found = found | frontier
    return found


def alive(procs: Iterable[Proc]) -> set[Proc]:
    """Those of ``procs`` still running as the same processes (same pid, same start time)."""
    live = set()
    for p in procs:
        stat = _stat(p.pid)
        if stat is not None and stat[0] != "Z" and stat[2] == p.start:
            live.add(p)
    return live


def _signal(proc: Proc, sig: int) -> None:
    """``sig`` to ``proc`` if the pid is still that process. The pidfd holds on to the process the
    pid named when it was opened, so the start time checked after opening it is that process's,
    and the signal cannot reach a process that took the pid in between."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:  # ESRCH: gone
            return
        fd = None  # a kernel before 5.3: checked just before os.kill, a narrow window left open
    try:
        if not alive([proc]):
            return
        if fd is None:
            os.kill(proc.pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass  # it ended meanwhile
    finally:
        if fd is not None:
            os.close(fd)


def kill(procs: Iterable[Proc]) -> None:
    """SIGKILL each of ``procs`` that is still the same process."""
    for p in procs:
        _signal(p, signal.SIGKILL)


class LocalRay:
    """A local Ray instance this process started: ``roots``, the processes ray.init started, each
    recorded as first seen. ``stop()`` ends it once; a second call does nothing."""

    def __init__(self, roots: Iterable[Proc]):
        self.roots = frozenset(roots)
        self._lock = threading.Lock()
        self._stopped = False

    def stop(self, grace_s: float = 10.0) -> set[int]:
        """ray.shutdown(), then SIGKILL for whatever of the instance is alive ``grace_s`` later.
        Returns the pids still alive after that (empty: everything stopped, or stopped before)."""
        with self._lock:  # Ctrl-C's path and the sweep's end both stop it: the first one does
            if self._stopped:
                return set()
            self._stopped = True
        import ray

        tree = descendants(self.roots)  # before the shutdown: orphans lose their parent
        ray.shutdown()
        deadline = time.monotonic() + grace_s
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        tree |= descendants(alive(tree))  # and what a survivor started meanwhile
        kill(tree)
        deadline = time.monotonic() + 5.0
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        return {p.pid for p in alive(tree)}
