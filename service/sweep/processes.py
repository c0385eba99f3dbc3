"""The processes of a local Ray instance that this process started: found by descent from the
ones ``ray.init`` started (GCS, raylet, their workers: Tune trials, Train controllers and
workers), and stopped, every one of them, however the sweep ends.

The instance is the sweep's to stop, not a signal's: its processes take no SIGTERM
(ray_runtime.init_local), so the sweep's own SIGTERM handler can still reach its GCS after a
scheduler signalled the whole process group. Ray's ``ray.shutdown()`` would end them with SIGTERM
and a second's wait each; here the driver only disconnects, and the tree, read before that and
frozen (SIGSTOP) so no process can start another unseen, is killed. ``ray.shutdown()`` alone
would not do either: a worker that does not answer the raylet (a Train controller seen here,
reparented to init and still holding 450 MB an hour and a half later) outlives it. Linux /proc;
elsewhere nothing is found and only ray.shutdown() runs.

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

    def stop(self, disconnect: bool = True) -> set[int]:
        """The driver disconnected (``_disconnect``; not with ``disconnect`` False: a thread of this
        process is still inside Ray, and the process leaves by os._exit), then every process of the
        instance killed. Returns the pids still alive after that (empty: everything stopped, or
        stopped before)."""
        with self._lock:  # Ctrl-C's path and the sweep's end both stop it: the first one does
            if self._stopped:
                return set()
            self._stopped = True
        tree = descendants(self.roots)  # before the disconnect: orphans lose their parent
        if disconnect:
            _disconnect()
        tree = _frozen(tree)
        kill(tree)
        deadline = time.monotonic() + 5.0
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        return {p.pid for p in alive(tree)}


def _disconnect() -> None:
    """This driver off its Ray instance, leaving the instance's processes to ``LocalRay.stop``:
    ray.shutdown() without the node ray.init started, whose processes it would otherwise end one
    by one with SIGTERM, which they do not take, and a second's wait each. Where Ray has no such
    node (no Ray started, or a later Ray without ``_global_node``) it is a plain ray.shutdown()."""
    import ray
    from ray._private import worker

    if getattr(worker, "_global_node", None) is not None:
        worker._global_node = None
    ray.shutdown()


def _frozen(tree: set[Proc]) -> set[Proc]:
    """``tree`` and every process below it, each stopped (SIGSTOP, which no process can block or
    ignore): a process stopped cannot start another, so the set returned is the whole tree."""
    while True:
        for p in tree:
            _signal(p, signal.SIGSTOP)
        below = descendants(alive(tree))
        if below <= tree:
            return tree
        tree = tree | below
