"""The transport probe: on every rank of an initialised process group, time each collective kind
the hooks use (hooks/wire.py's KINDS: allreduce, allgather, all_to_all; and, asked for, FSDP's
SHARDED_KINDS: reduce_scatter, all_gather) at a few message sizes, repeated, and return the
samples service/step_model/transport.py fits. Plain torch.distributed: the sweep runs it once per
world size on Ray Train workers (service/sweep/transport.py), the sharded kinds only where the
sweep has fsdp trials.

Each repeat starts from a barrier; its time is the slowest rank's (a collective ends for all when
the last rank's part arrives), and a sample is the median over repeats, after one warm-up. Beside
it, the CPU time the repeat cost each rank's process (all its threads: gloo runs a collective on its
own), the ranks' mean: where the wall time is waiting (a neighbour not yet scheduled, the wire) and
where it is work on the host's cores.
"""

from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist

from hooks.wire import ALL_GATHER, ALL_KINDS, ALL_TO_ALL, ALLGATHER, ALLREDUCE, KINDS, REDUCE_SCATTER
from service.step_model.transport import ProbeHosts, Sample, medians

# Payload bytes per rank: a compressed bucket's few KiB (sign, top-k at 1 %) up to a full
# fp32 bucket (DDP's first bucket is 1 MiB, the rest up to its 25 MiB cap; 8 MiB keeps the
# probe's cost on 2 cores to seconds while the per-byte part dominates). The sharded kinds'
# payload is the unsharded size (the reduce-scatter's input, the all-gather's output, as
# hooks/wire.py counts them): FSDP's message is one sharded module's parameters or gradients,
# hundreds of KiB (a small layer) to tens of MiB (a transformer block), so the same sizes cover
# them (8 MiB standing in for the largest blocks as for DDP's largest buckets).
SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)
REPEATS = 11  # 5 left 64 KiB slower than 1 MiB at W = 2 (a wake-up in the median): the fit missed by 87 %


def _elements(nbytes: int, world_size: int) -> int:
    """fp32 elements for about ``nbytes``, a multiple of the world size (all_to_all, the
    reduce-scatter and the all-gather split it evenly)."""
    n = max(nbytes // 4, world_size)
    return n - n % world_size


def _collective(kind: str, n: int, world_size: int, group=None):
    """A callable running one collective of ``kind`` on ``n`` fp32 elements of payload per rank
    (``n`` a multiple of ``world_size``; the sharded kinds' ``n`` is the unsharded size, each rank's
    shard n / W)."""
    if kind == REDUCE_SCATTER:  # n in, this rank's n / W out, averaged as FSDP asks (hooks/sharded.py)
        full, shard = torch.ones(n, dtype=torch.float32), torch.empty(n // world_size, dtype=torch.float32)
        return lambda: dist.reduce_scatter_single(shard, full, op=dist.ReduceOp.AVG, group=group)
    if kind == ALL_GATHER:  # this rank's n / W in, the n of every rank's shards out
        shard, full = torch.ones(n // world_size, dtype=torch.float32), torch.empty(n, dtype=torch.float32)
        return lambda: dist.all_gather_single(full, shard, group=group)
    buf = torch.ones(n, dtype=torch.float32)
    if kind == ALLREDUCE:
        return lambda: dist.all_reduce(buf, group=group)
    if kind == ALLGATHER:
        out = torch.empty(n * world_size, dtype=torch.float32)
        return lambda: dist.all_gather_single(out, buf, group=group)
    if kind != ALL_TO_ALL:
        raise ValueError(f"the probe times no {kind!r}; it knows {', '.join(ALL_KINDS)}")
    out = torch.empty_like(buf)
    return lambda: dist.all_to_all_single(out, buf, group=group)


def _time(run, repeats: int, group=None) -> tuple[list[float], list[float]]:
    """ms of each repeat, the slowest rank's; and the CPU ms it cost a rank's process, the ranks' mean."""
    run()  # warm-up: gloo's first call on a size sets up its buffers
    times, cpu = [], []
    for _ in range(repeats):
        dist.barrier(group=group)
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        times.append(1000.0 * (time.perf_counter() - t0))
        cpu.append(1000.0 * (time.process_time() - c0))
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    spent = torch.tensor(cpu, dtype=torch.float64)
    dist.all_reduce(spent, op=dist.ReduceOp.SUM, group=group)
    return slowest.tolist(), (spent / dist.get_world_size(group)).tolist()


def probe(sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS, kinds: tuple[str, ...] = KINDS,
          group=None, host: str | None = None) -> tuple[list[Sample], ProbeHosts]:
    """Every kind in ``kinds`` (hooks/wire.py's KINDS by default; with SHARDED_KINDS for fsdp
    trials) at every size on ``group`` (None: the default group): one :class:`Sample` each, and
    the hosts they were measured on (every rank returns the same). A group over emulated hosts
    (netem.process_group_on_host) probes their links, not loopback; ``host`` then names this
    rank's (its namespace: the process itself stays in the machine's)."""
    w = dist.get_world_size(group)
    where = probe_hosts(group, host)
    shared = where.time_shared
    out = []
    for kind in kinds:
        for nbytes in sizes:
            n = _elements(nbytes, w)
            times, cpu = _time(_collective(kind, n, w, group), repeats, group)
            out.append(medians(kind, w, 4 * n, times, shared, cpu))
    return out, where


def probe_hosts(group=None, host: str | None = None) -> ProbeHosts:
    """The group's hosts as its ranks see them (one all_gather_object): how many, the most ranks
    on one, the fewest cores one gives its process, the CPU model. Ranks on different network
    namespaces of one machine (emulated hosts) count as hosts of their own: each sends over its
    own link. ``host``: this rank's host where the process cannot tell (default: its hostname and
    network namespace)."""
    ranks = [None] * dist.get_world_size(group)
    dist.all_gather_object(ranks, this_host(host), group=group)
    return ProbeHosts.of(ranks)


def this_host(host: str | None = None) -> tuple[str, float, str]:
    """This rank's (host, cores, CPU model) as :meth:`ProbeHosts.of` reads it."""
    return host or _host_id(), _cores(), _cpu_model()


def _host_id() -> str:
    """The hostname and this process's network namespace: emulated hosts share the first."""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()} {netns}"


def _cores() -> float:
    """CPUs this process may use: its affinity, capped by its cgroup's CPU quota where set (an
    emulated host's share, a container's limit)."""
    from service.network import host_cpu

    return host_cpu.machine_cores(host_cpu.hierarchy())


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine
