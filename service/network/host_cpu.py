"""Emulated hosts that own their CPU: one cgroup per host with a CPU quota (config
``network.host_cpus``, cores per host).

Without it every rank of a trial time-shares the machine's cores with the others, and with
their gloo threads: W = 8 on 2 cores is not a cluster of 8 hosts (docs/performance.md). With it
each host ``chs-{owner pid}-{token}-h{i}`` (the name of its network namespace, from
service/network/names.py) also gets a CPU cgroup of that name:

* cgroup v1's ``cpu`` controller where it is mounted (``cpu.cfs_quota_us`` over a 10 ms
  ``cpu.cfs_period_us``: PERIOD_US says why not 100), else cgroup v2's ``cpu.max`` where the
  unified hierarchy has the cpu controller;
* made inside the cgroup of the process that creates it (the sweep's trial process, in the
  driver's cgroup), so a container's or a slice's own limit still holds over every host (v2 lets a
  cgroup with processes of its own have none with the cpu controller: there the preflight says so);
* a rank's process joins its host with :func:`joined` (its pid into ``cgroup.procs``: the whole
  process) and goes back where it came from after the trial; once its gloo group is made,
  :func:`gloo_threads_apart` moves every thread but the rank's own (gloo's workers and connection
  loop, Ray's) to the host's *comm* cgroup (:func:`comm_cgroup`), which has no quota: the rank's
  compute (forward, backward, the hooks' encoding) runs in the host's share and its collectives
  beside it, as on a cluster host with cores to spare for them. This is the one emulation the
  committed cluster bands were measured on (bench/projection.py) and the one a sweep runs
  (cgroup v1 only: v2 moves single threads only in threaded subtrees, so there the whole process
  stays in the share);
  :func:`remove` first moves any process still inside (a rank killed before it could leave)
  to the parent, then removes the cgroup.

The quota is a ceiling (CFS bandwidth control), not a reservation: the hosts' shares must fit in
the machine's cores with room left for what runs outside every host (Ray's own processes, the
links' softirq): :func:`preflight` refuses a share that does not, in one line.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from service.network.names import host_name, owner_of, pid_alive

# The quota's period: 10 ms, not CFS's default 100 ms. A host's quota is spent in bursts at full
# core speed, then throttled to the period's end; after an idle wait (a collective on the wire)
# a compute block starts with a whole period's quota in hand, so with 100 ms periods a 150 ms-CPU
# block ran at 0.21-0.22 cores on hosts of 0.2, and shorter blocks faster still; with 10 ms it
# runs at 0.195-0.198 (bench/host_cpus.py, docs/performance.md "Hosts that own their CPU").
PERIOD_US = 10_000
MIN_CPUS = 0.1  # 1 ms per period: the kernel's smallest quota
# Cores left outside every host: Ray's own processes (raylet, GCS, the trial's controller and
# actors) and the links' softirq; measured in docs/performance.md ("Hosts that own their CPU").
HEADROOM_CORES = 0.4
CGROUP_ROOT = "/sys/fs/cgroup"


class HostCpuError(Exception):
    """Hosts with their own CPU cannot be made here; str() is one line saying what and how to fix it."""


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1: the v1 cpu controller; 2: the unified hierarchy
    mount: str    # where it is mounted


def hierarchy(mounts: str = "/proc/self/mounts") -> Hierarchy | None:
    """The cgroup hierarchy with the cpu controller: v1's when mounted (on hybrid machines the
    unified one lacks it), else the unified one at /sys/fs/cgroup with cpu listed; None."""
    try:
        with open(mounts) as f:
            lines = [line.split() for line in f]
    except OSError:
        return None
    for _, point, fstype, options, *_ in lines:
        if fstype == "cgroup" and "cpu" in options.split(","):
            return Hierarchy(1, point)
    for _, point, fstype, *_ in lines:
        if fstype == "cgroup2" and point == CGROUP_ROOT and "cpu" in _read(f"{point}/cgroup.controllers").split():
            return Hierarchy(2, point)
    return None


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def own_cgroup(h: Hierarchy, pid: int | str = "self") -> str:
    """The directory of ``pid``'s cgroup in ``h``."""
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if (h.version == 2 and controllers == "") or (h.version == 1 and "cpu" in controllers.split(",")):
            return os.path.normpath(os.path.join(h.mount, path.lstrip("/")))
    return h.mount


# ----------------------------------------------------------------------------- the machine's cores


def machine_cores(h: Hierarchy | None) -> float:
    """Cores the calling thread may use: its CPU affinity, capped by its own cgroup's quota (a
    container's, an emulated host's). The thread's, not the process's: on a host whose gloo
    threads were moved beside its share (:func:`threads_apart`), the process's main thread may be
    one of them, and the rank's own thread is the one in the share."""
    cores = float(len(os.sched_getaffinity(0)))
    if h is None:
        return cores
    here = own_cgroup(h, "thread-self")
    if h.version == 1:
        quota, period = _read(f"{here}/cpu.cfs_quota_us", "-1"), _read(f"{here}/cpu.cfs_period_us", "100000")
    else:
        quota, _, period = _read(f"{here}/cpu.max", "max").partition(" ")
    if quota not in ("-1", "max", ""):
        cores = min(cores, int(quota) / int(period or PERIOD_US))
    return cores


def auto_share(hosts: int, cores: float) -> float:
    """``network.host_cpus: auto``: what every one of ``hosts`` hosts can have, the headroom kept
    (rounded down to a hundredth of a core)."""
    return math.floor(100 * (cores - HEADROOM_CORES) / hosts) / 100


def preflight(host_cpus: float | str, hosts: int) -> float:
    """The share each of ``hosts`` hosts gets (``auto`` resolved), checked: it fits in the
    machine's cores with the headroom kept, and a cgroup with that quota can be made and removed
    here. Raises HostCpuError (one line) if not; leaves nothing behind either way."""
    h = hierarchy()
    if h is None:
        raise HostCpuError("network.host_cpus needs the kernel's cpu cgroup controller (cgroup v1 `cpu`, or v2 "
                           "with cpu in /sys/fs/cgroup/cgroup.controllers), which this machine does not "
                           "mount: remove network.host_cpus (the ranks then share the machine's cores)")
    cores = machine_cores(h)
    share = auto_share(hosts, cores) if host_cpus == "auto" else float(host_cpus)
    if share < MIN_CPUS or share * hosts > cores - HEADROOM_CORES + 1e-9:
        fits = auto_share(hosts, cores)
        raise HostCpuError(f"network.host_cpus {host_cpus} x {hosts} hosts (the sweep's largest world size on a "
                           f"link) needs {share * hosts:g} cores, and this machine gives {cores:g} of which "
                           f"{HEADROOM_CORES:g} stay for Ray's own processes and the links: "
                           + (f"set network.host_cpus to at most {fits:g}" if fits >= MIN_CPUS else
                              f"run at most {int((cores - HEADROOM_CORES) / MIN_CPUS)} hosts")
                           + " (or auto)")
    probe = create(host_name(os.getpid(), secrets.token_hex(3), 0), share)
    try:
        with joined(probe):
            pass
    except OSError as exc:
        raise HostCpuError(f"network.host_cpus: a process cannot join a CPU cgroup under {os.path.dirname(probe)} "
                           f"({exc.strerror}): run the sweep as root, or remove network.host_cpus") from None
    finally:
        remove(probe)
    return share


# ----------------------------------------------------------------------------- a host's cgroup


def create(name: str, cpus: float, h: Hierarchy | None = None) -> str:
    """A cgroup ``name`` inside this process's own, limited to ``cpus`` cores; its directory."""
    h = h or hierarchy()
    if h is None:
        raise HostCpuError("network.host_cpus: this machine mounts no cgroup hierarchy with the cpu controller")
    base = own_cgroup(h)
    path = os.path.join(base, name)
    quota = max(int(round(cpus * PERIOD_US)), int(MIN_CPUS * PERIOD_US))
    try:
        if h.version == 2 and "cpu" not in _read(f"{base}/cgroup.subtree_control").split():
            _write(f"{base}/cgroup.subtree_control", "+cpu")
        os.mkdir(path)
    except OSError as exc:
        raise HostCpuError(f"network.host_cpus: cannot create a CPU cgroup in {base} ({exc.strerror}): run the "
                           f"sweep as root with cgroups writable (a container: a writable /sys/fs/cgroup), "
                           f"or remove network.host_cpus") from None
    try:
        if h.version == 1:
            _write(f"{path}/cpu.cfs_period_us", str(PERIOD_US))
            _write(f"{path}/cpu.cfs_quota_us", str(quota))
        else:
            _write(f"{path}/cpu.max", f"{quota} {PERIOD_US}")
    except OSError as exc:
        remove(path)
        raise HostCpuError(f"network.host_cpus {cpus:g}: the kernel refused a quota of {quota} us per "
                           f"{PERIOD_US} us in {path} ({exc.strerror})") from None
    return path


@contextlib.contextmanager
def joined(path: str) -> Iterator[None]:
    """This whole process (every thread) runs in the host cgroup ``path`` inside the block, and
    goes back to the cgroup it came from on the way out."""
    h = hierarchy()
    home = own_cgroup(h) if h else None
    _write(f"{path}/cgroup.procs", str(os.getpid()))
    try:
        yield
    finally:
        if home and os.path.isdir(home):
            with contextlib.suppress(OSError):  # the cgroup was removed under us: nothing to leave
                _write(f"{home}/cgroup.procs", str(os.getpid()))


COMM_INDEX = 10_000  # a comm cgroup's host index, past any network's hosts


def comm_cgroup(cgroup: str) -> str:
    """The sibling of host ``cgroup`` for its communication threads: named as a host of the same
    owner (so :func:`remove_leftovers` finds it too) with an index no host has; no quota."""
    from service.network.names import HOST_RE

    owner, token, index = HOST_RE.match(os.path.basename(cgroup)).groups()
    return os.path.join(os.path.dirname(cgroup), host_name(int(owner), token, COMM_INDEX + int(index)))


def threads_apart(cgroup: str) -> bool:
    """Every thread of this process but the calling one into :func:`comm_cgroup` of its host
    ``cgroup``: the host's collectives then wait on no quota, while the calling thread (the
    rank's compute) keeps the host's share. Idempotent: call it again after new threads may have
    started. False where it cannot (no cgroup, or cgroup v2: the whole process stays in the share)."""
    if not cgroup or not os.path.exists(os.path.join(os.path.dirname(cgroup), "tasks")):
        return False
    apart = comm_cgroup(cgroup)
    os.makedirs(apart, exist_ok=True)
    if not _read(f"{apart}/cpu.cfs_quota_us"):
        raise HostCpuError(f"{apart}: no cpu controller to move gloo's threads to")
    there = set(_read(f"{apart}/tasks").split())
    mine = str(threading.get_native_id())  # under Ray Train V2 not necessarily the main thread
    for tid in os.listdir("/proc/self/task"):
        if tid != mine and tid not in there:
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                _write(f"{apart}/tasks", tid)  # cgroup v1: a thread by itself
    return True


def gloo_threads_apart(group, cgroup: str) -> bool:
    """A rank's gloo threads made (three collectives on ``group``: its workers and connection loop
    start with the first; every rank of the group calls it), then moved off the host's quota
    (:func:`threads_apart`)."""
    import torch
    import torch.distributed as dist

    for _ in range(3):
        dist.all_reduce(torch.zeros(1 << 16), group=group)
    return threads_apart(cgroup)


def remove(path: str, wait_s: float = 5.0) -> None:
    """Remove a host cgroup: processes still in it (a rank killed before it left) are moved to
    its parent first; a dying process can hold it a moment, so removal is retried until ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while os.path.isdir(path):
        for pid in _read(f"{path}/cgroup.procs").split():
            with contextlib.suppress(OSError):  # exited meanwhile
                _write(f"{os.path.dirname(path)}/cgroup.procs", pid)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # left for remove_leftovers; never a failed trial over a lingering process
            time.sleep(0.05)


def usage_s(pid: int) -> float:
    """CPU seconds ``pid`` has used (user + system, all its threads), from /proc/PID/stat."""
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- leftovers


def list_cgroups() -> list[str]:
    """Our host cgroups on this machine (any owner): where ours are made (inside this process's
    own cgroup) and at the hierarchy's top."""
    h = hierarchy()
    if h is None:
        return []
    out = []
    for base in sorted({h.mount, own_cgroup(h)}):
        with contextlib.suppress(OSError):
            out += [os.path.join(base, n) for n in sorted(os.listdir(base)) if owner_of(n) is not None]
    return out


def remove_where(owned: Callable[[int], bool]) -> list[str]:
    """Remove our host cgroups whose owner pid satisfies ``owned``; returns their paths."""
    removed = []
    for path in list_cgroups():
        if owned(owner_of(os.path.basename(path))):
            remove(path)
            removed.append(path)
    return removed


def remove_leftovers() -> list[str]:
    """The host cgroups of owners no longer alive, removed."""
    return remove_where(lambda pid: not pid_alive(pid))
