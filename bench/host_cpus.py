"""Do emulated hosts own their CPU? (network.host_cpus, service/network/host_cpu.py)

    python bench/host_cpus.py                  # q = 0.2 cores per host, W = 2, 4, 8; 2 rounds
    python bench/host_cpus.py --quick          # W = 2, 1 round, few steps (smoke test)

No Ray: W forked processes, each on its own emulated host (a network namespace and a shaped
link, service/network/netem.py), train mlp_digits' model on a fixed batch: each step a timed
forward/backward, then a gloo allreduce of the flattened gradient (34 MB) over the links; then
``--link-rounds`` allreduces of 8 MB, timed, for what the links carry. Two arms per W, alternated
(the order reversed every round):

- hosts:  every process inside its host's CPU cgroup of ``--q`` cores (what network.host_cpus makes);
- shared: the same processes without cgroups, time-sharing the machine's cores (the sweep before);
- full:   as hosts, beside copies of the same W-rank job on hosts of their own (each copy its own
          group), until the machine carries the largest W's hosts: every W then runs on a machine as
          busy as W = 8's. A cgroup divides time, not caches: a rank on a host of 0.2 cores shares
          its core's caches with as many other hosts as the machine runs, so without the copies a
          sample's CPU work grows with W (docs/performance.md, "Hosts that own their CPU").

Printed per arm: one rank's compute per sample (the forward/backward's wall time over the samples,
all steps after the warm-up, the median rank), the ranks' CPU (cores, each), what the 8 MB allreduce
carried as a fraction of the link (ring: 2 (W-1)/W of the buffer leaves every host), the links'
softirq (cores, from /proc/stat) and everything the machine did outside the ranks (cores: Ray is
not running, so that is this bench's parent, the kernel and whatever else shares the machine);
then the load average. Last, an idle local Ray for ``--ray-s`` seconds: what Ray's own processes take
before any trial (the floor of the headroom; bench/_common.TreeCpu). Results go to
bench/results/host_cpus.json.

The claim measured: at share q, one rank's compute per sample is the same at W = 2, 4
and 8 within 5 %, and the link is carried at W = 8. docs/performance.md, "Hosts that own their CPU".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import copies_to_fill, Rendezvous, join_group, load_average, machine, TreeCpu, write_json  # noqa: E402

LINK_MB = 8  # the link phase's buffer


def _rank(rank: int, world: int, port: int, host: dict, args, queue) -> None:
    """One emulated host's rank: joins its cgroup (if any), trains, allreduces; puts its figures."""
    import contextlib

    import torch
    import torch.distributed as dist

    from service.network import host_cpu, netem
    from service.workloads import build_workload

    torch.set_num_threads(1)
    with host_cpu.joined(host["cgroup"]) if host["cgroup"] else contextlib.nullcontext():
        join_group(port, rank, world)
        group = netem.process_group_on_host(host)
        wl = build_workload("mlp_digits", 0)
        x, y = (torch.stack([wl.train_set[i][k] for i in range(args.batch)]) for k in (0, 1))
        params = list(wl.model.parameters())
        compute = comm = compute_cpu = cpu0 = 0.0
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                dist.barrier(group)
                compute = comm = compute_cpu = 0.0
                cpu0, wall0 = host_cpu.usage_s(os.getpid()), time.perf_counter()
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(args.batches_per_step):  # one block, long beside the quota's period
                wl.model.zero_grad(set_to_none=True)
                wl.loss_fn(wl.model(x), y).backward()
            t1, compute_cpu = time.perf_counter(), compute_cpu + time.thread_time() - c0
            dist.all_reduce(torch.cat([p.grad.reshape(-1) for p in params]), group=group)
            compute, comm = compute + t1 - t0, comm + time.perf_counter() - t1
        cpu = (host_cpu.usage_s(os.getpid()) - cpu0) / (time.perf_counter() - wall0)
        buf = torch.ones(LINK_MB * 250_000)
        dist.barrier(group)
        t0 = time.perf_counter()
        for _ in range(args.link_rounds):
            dist.all_reduce(buf, group=group)
        link_s = (time.perf_counter() - t0) / args.link_rounds
        dist.destroy_process_group()
    samples = args.steps * args.batches_per_step * args.batch
    queue.put({"rank": rank, "compute_ms_per_sample": 1000 * compute / samples,
               "compute_cpu_ms_per_sample": 1000 * compute_cpu / samples,
               "comm_ms_per_step": 1000 * comm / args.steps, "cpu_cores": cpu, "link_s": link_s})


def _stat() -> tuple[int, int, int]:
    """(busy, softirq, total) jiffies over all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, fields[6], sum(fields)


ARMS = ("hosts", "shared", "full")


def run_arm(world: int, arm: str, args) -> dict:
    """One arm: ``world`` hosts, with or without their CPU cgroups (and, ``full``, beside copies of
    the job on hosts of their own); the figures of its ranks, every copy's."""
    import multiprocessing as mp

    from service.network import netem

    ctx = mp.get_context("fork")  # the parent's imports are the ranks' (no torch import per rank)
    copies = copies_to_fill(world, args.world_sizes) if arm == "full" else 1
    with netem.Network(world * copies, link_gbps=args.link_gbps, host_cpus=None if arm == "shared" else args.q) as net:
        queue, meets = ctx.Queue(), [Rendezvous(world) for _ in range(copies)]
        procs = [ctx.Process(target=_rank, args=(i % world, world, meets[i // world].port, vars(h), args, queue))
                 for i, h in enumerate(net.hosts)]
        before, wall0 = _stat(), time.monotonic()
        for p in procs:
            p.start()
        try:
            every = [queue.get(timeout=600) for _ in procs]
        except BaseException:  # interrupted (SIGTERM too: main), or a rank never answered
            for p in procs:
                p.kill()
            raise
        after, wall = _stat(), time.monotonic() - wall0
        for p in procs:
            p.join()
    results = sorted(every, key=lambda r: r["rank"])  # every copy's ranks: each copy is the same job
    ticks = os.sysconf("SC_CLK_TCK")
    ranks_cores = sum(r["cpu_cores"] for r in results)
    wire_s = 2 * (world - 1) / world * LINK_MB * 8e6 / (args.link_gbps * 1e9)
    return {"world_size": world, "arm": arm, "copies": copies,
            "compute_ms_per_sample": statistics.median(r["compute_ms_per_sample"] for r in results),
            "compute_cpu_ms_per_sample": statistics.median(r["compute_cpu_ms_per_sample"] for r in results),
            "compute_spread": max(r["compute_ms_per_sample"] for r in results) / min(r["compute_ms_per_sample"] for r in results),
            "comm_ms_per_step": statistics.median(r["comm_ms_per_step"] for r in results),
            "rank_cpu_cores": statistics.median(r["cpu_cores"] for r in results),
            "link_carried": wire_s / max(r["link_s"] for r in results),
            "softirq_cores": (after[1] - before[1]) / ticks / wall,
            "outside_cores": (after[0] - before[0]) / ticks / wall - ranks_cores, "wall_s": wall,
            "load_average": load_average()}


def idle_ray(seconds: float) -> float:
    """Cores an idle local Ray (started as ray.init starts it) uses over ``seconds``."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        time.sleep(3)  # past its start-up
        meter = TreeCpu()
        meter.start()
        time.sleep(seconds)
        return meter.stop() / seconds
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--q", type=float, default=0.2, help="cores per host (the hosts arm)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                        help="hosts: each rank in its host's cgroup; shared: no cgroups; full: hosts, beside copies of "
                             "the job until the machine carries the largest W's hosts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches-per-step", type=int, default=4,
                        help="forward/backwards per step, timed as one block: a block of one batch (~46 ms of CPU, "
                             "~230 ms at 0.2 cores) is timed mostly by where in the quota's 100 ms period it starts")
    parser.add_argument("--period-us", type=int, default=None,
                        help="the hosts' CFS period (default: service/network/host_cpu.py's PERIOD_US)")
    parser.add_argument("--link-gbps", type=float, default=1.0)
    parser.add_argument("--link-rounds", type=int, default=3)
    parser.add_argument("--ray-s", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="the JSON's path (default bench/results/host_cpus.json)")
    args = parser.parse_args()
    if args.quick:
        args.world_sizes, args.rounds, args.steps, args.link_rounds, args.ray_s = [2], 1, 2, 1, 0
        args.batches_per_step = 1
    if args.period_us:
        from service.network import host_cpu

        host_cpu.PERIOD_US = args.period_us  # the forked ranks' hosts are made in this process
    import torch  # noqa: F401 - imported once here; the forked ranks share it

    from service.network import host_cpu
    from service.sweep.signals import signals_raise_keyboard_interrupt

    print(f"hosts of {args.q:g} cores (CFS period {host_cpu.PERIOD_US} us), {args.link_gbps:g} Gbit/s links; "
          f"load average {load_average()}", flush=True)
    arms = [(w, a) for w in args.world_sizes for a in args.arms]
    rows = []
    for round_ in range(args.rounds):
        for world, arm in arms if round_ % 2 == 0 else arms[::-1]:
            # SIGTERM as Ctrl-C: the ranks stopped and the hosts removed, not left behind
            with signals_raise_keyboard_interrupt():
                row = run_arm(world, arm, args)
            rows.append(row)
            print(f"W={world} {row['arm']:6s} x{row['copies']} compute {row['compute_ms_per_sample']:.3f} ms/sample "
                  f"({row['compute_cpu_ms_per_sample']:.3f} of CPU) "
                  f"(ranks x{row['compute_spread']:.2f}), comm {row['comm_ms_per_step']:.0f} ms/step, "
                  f"rank CPU {row['rank_cpu_cores']:.2f} cores, link carried {100 * row['link_carried']:.0f} %, "
                  f"softirq {row['softirq_cores']:.3f} cores, outside the ranks {row['outside_cores']:.2f} cores, "
                  f"load {row['load_average']}", flush=True)
    ray_cores = idle_ray(args.ray_s) if args.ray_s else None
    if ray_cores is not None:
        print(f"idle local Ray: {ray_cores:.3f} cores over {args.ray_s:g} s; load average {load_average()}")
    path = write_json("host_cpus", {"machine": machine(), "args": vars(args), "rows": rows, "idle_ray_cores": ray_cores},
                      args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
