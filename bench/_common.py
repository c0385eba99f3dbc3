"""Shared helpers of the bench scripts: side-by-side alternation, machine load, tables, JSON.

Every figure on this machine is noisy (2 cores shared with other work), so the scripts
measure the things they compare in one invocation, alternating them, and report medians
and ratios; the load average before and after each run goes into the JSON.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

if str(ROOT) not in sys.path:  # `python bench/x.py` from anywhere finds hooks/ and service/
    sys.path.insert(0, str(ROOT))


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (how shared the CPUs were)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return []


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "host": socket.gethostname()}


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


class Rendezvous:
    """Where a run's ranks meet: a c10d store listening on 127.0.0.1 in this (the parent) process
    from before they start until this object goes. A port picked free and bound later by rank 0
    can be taken in between by another process (the suite failed so in CI, 2026-12-05)."""

    def __init__(self, world_size: int, timeout_s: float = 300.0):
        import datetime

        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self.port = self._store.port


def join_group(port: int, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 300.0,
               **group_kwargs) -> None:
    """A rank's half of ``Rendezvous``: the default process group, met at the parent's store."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                            **group_kwargs)


def run_on_hosts(target, world_size: int, host_cpus, extra: tuple, timeout_s: float, copies: int = 1) -> dict:
    """``target(rank, world_size, port, net, *extra, queue)`` in ``world_size`` spawned processes,
    one per emulated host (service/network/netem.py, links unshaped; each host a CPU cgroup of
    ``host_cpus`` cores where given); each puts (rank, result, traceback or None) on the queue.
    Rank 0's result; a rank's traceback is raised.

    ``copies`` > 1: as many copies of the job, each its own group on hosts of its own, run beside
    it (their output muted; ``net`` for them a :class:`CopyHosts`, which reshapes nothing: the
    first copy's rank 0 reshapes every host's link). A cgroup divides time, not caches: with the
    copies every world size runs on a machine as busy as the largest's (docs/performance.md,
    "Hosts that own their CPU")."""
    import multiprocessing as mp

    from service.network import netem
    from service.sweep.signals import signals_raise_keyboard_interrupt

    ctx = mp.get_context("spawn")
    # SIGTERM as Ctrl-C: by default it ended this process with no cleanup, leaving the ranks
    # running and every host's namespace, link and cgroup behind
    with signals_raise_keyboard_interrupt(), netem.Network(world_size * copies, None, host_cpus=host_cpus) as net:
        queues, meets = [ctx.Queue() for _ in range(copies)], [Rendezvous(world_size) for _ in range(copies)]
        procs = []
        for c in range(copies):
            hosts = net if c == 0 else CopyHosts(net.hosts[c * world_size:(c + 1) * world_size])
            for r in range(world_size):
                args = (r, world_size, meets[c].port, hosts, *extra, queues[c])
                run, run_args = (target, args) if c == 0 else (_muted, (target, *args))
                procs.append(ctx.Process(target=run, args=run_args, daemon=True))
        for p in procs:
            p.start()
        out = {}
        try:
            for c, queue in enumerate(queues):
                for _ in range(world_size):
                    rank, result, err = queue.get(timeout=timeout_s)
                    if err:
                        raise RuntimeError(f"W={world_size} rank {rank}{f' (copy {c})' if c else ''} failed:\n{err}")
                    if c == 0:
                        out[rank] = result
        except BaseException:  # interrupted, or a rank failed: the others would wait on it
            for p in procs:
                p.kill()
            raise
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    return out[0]


def copies_to_fill(world_size: int, world_sizes: list[int]) -> int:
    """How many copies of a ``world_size`` job fill the hosts of the largest of ``world_sizes``
    (:func:`run_on_hosts`' ``copies``; 1 for the largest itself)."""
    return max(max(world_sizes) // world_size, 1)


class CopyHosts:
    """A copy's view of the network (:func:`run_on_hosts`): its own hosts; reshaping is the first
    copy's (every host's link at once)."""

    def __init__(self, hosts: list):
        self.hosts = hosts

    def reshape(self, *_args, **_kwargs) -> None:
        pass


def _muted(target, *args) -> None:
    """``target(*args)`` with stdout to /dev/null: a copy's progress lines are the first copy's again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(1, "w", closefd=False)
    target(*args)


class TreeCpu:
    """CPU seconds (user + system) that this process and every process below it use between
    ``start()`` and ``stop()``, short-lived children included.

    On a machine shared with other work, wall time mostly measures the others; the CPU time a
    launch makes the machine do is the figure that holds still. Exited processes cannot be read
    afterwards, and Ray's raylet reaps its workers without accounting (their time is not in its
    cutime), so a thread samples /proc every ``interval`` seconds and keeps each process's last
    value; a process's CPU after its last sample (< ``interval``) is missed. The sampler's own
    CPU is not counted. Linux /proc only.
    """

    def __init__(self, interval: float = 0.2):
        import threading

        self.interval = interval
        self._tick = os.sysconf("SC_CLK_TCK")
        self._root = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._first: dict[tuple[int, int], float] = {}
        self._last: dict[tuple[int, int], float] = {}
        self._sampler_cpu = 0.0

    def _scan(self) -> dict[tuple[int, int], float]:
        parent: dict[int, int] = {}
        own: dict[int, tuple[int, float]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:  # exited meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
            pid = int(entry)
            parent[pid] = int(fields[1])
            own[pid] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / self._tick)  # starttime, utime+stime
        out = {}
        for pid, (started, cpu) in own.items():
            p, hops = pid, 0
            while p in parent and p != self._root and hops < 64:
                p, hops = parent[p], hops + 1
            if p == self._root and pid != self._root:
                out[(pid, started)] = cpu
        return out

    def _run(self) -> None:
        import time as _t

        while not self._stop.wait(self.interval):
            t0 = _t.thread_time()
            self._last.update(self._scan())
            self._sampler_cpu += _t.thread_time() - t0

    def start(self) -> "TreeCpu":
        import time as _t

        self._first = self._scan()
        self._last = dict(self._first)
        self._root_cpu0 = _t.process_time()
        self._thread.start()
        return self

    def stop(self) -> float:
        """CPU seconds used since start() by this process (less the sampler) and its descendants."""
        import time as _t

        self._stop.set()
        self._thread.join()
        self._last.update(self._scan())
        children = sum(cpu - self._first.get(key, 0.0) for key, cpu in self._last.items())
        return children + (_t.process_time() - self._root_cpu0 - self._sampler_cpu)


def time_collective(kind: str, x, group, world_size: int, repeats: int) -> float:
    """Median seconds (max over ranks) of one ``kind`` collective (allreduce, allgather,
    all_to_all, or FSDP's reduce_scatter and all_gather) of ``x`` on ``group``, timed alone between
    barriers; one untimed warm-up call. The timing's own max-reduction goes over the default group.
    FSDP's kinds take ``x`` as the unsharded tensor (its numel a multiple of ``world_size``, as
    hooks/wire.py counts them): reduce_scatter's input (the mean in fp32, as FSDP's own; the sum
    in 16 bits, as hooks/sharded.py's cast forms), all_gather's output, gathered from x's first
    n / W values as this rank's shard (their buffers allocated before the timing)."""
    import torch
    import torch.distributed as dist

    # allgather's and all_to_all's outputs allocated inside the timing, as they always were here
    if kind == "allreduce":
        run = lambda: dist.all_reduce(x, group=group)  # noqa: E731
    elif kind == "allgather":
        run = lambda: dist.all_gather_single(torch.empty(world_size * x.numel(), dtype=x.dtype), x, group=group)  # noqa: E731
    elif kind == "reduce_scatter":
        op = dist.ReduceOp.AVG if x.dtype == torch.float32 else dist.ReduceOp.SUM
        shard = torch.empty(x.numel() // world_size, dtype=x.dtype)
        run = lambda: dist.reduce_scatter_single(shard, x, op=op, group=group)  # noqa: E731
    elif kind == "all_gather":
        shard, full = x[:x.numel() // world_size].clone(), torch.empty_like(x)
        run = lambda: dist.all_gather_single(full, shard, group=group)  # noqa: E731
    else:
        run = lambda: dist.all_to_all_single(torch.empty_like(x), x, group=group)  # noqa: E731
    times = []
    for rep in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        run()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rep:
            times.append(t.item())
    return statistics.median(times)


def write_json(name: str, payload: dict[str, Any], out: str | None = None) -> Path:
    """Write ``payload`` (plus when and how loaded the machine was) to bench/results/NAME.json
    or to ``out``; returns the path."""
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"bench": name, "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "argv": sys.argv[1:], **payload}
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain text table: numbers right-aligned, text left-aligned."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) for i in range(len(headers))]

    def line(row):
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
