"""Is a collective's time on a host of a fraction of a core work or waiting? (issue 39 item 2)

    sudo .venv/bin/python bench/probe_cpu.py                       # q = 0.2 cores per host, W = 2, 4, 8, 2 rounds
    sudo .venv/bin/python bench/probe_cpu.py --quick               # W = 2, 1 round (smoke test)
    sudo .venv/bin/python bench/probe_cpu.py --arms quota          # the first design's one arm (70 s)

No Ray: W spawned processes, each on its own emulated host (network namespace, its link unshaped,
service/network/netem.py) and inside its host's CPU cgroup of ``--q`` cores (what network.host_cpus
makes), run the sweep's transport probe (service/train/transport_probe.py) on the hosts' gloo group:
every collective kind at every size, its wall time (the slowest rank's) and the CPU time it cost a
rank's process (every thread; the ranks' mean), medians over the probe's repeats. Worlds run in
turn, their order reversed every round; within a world the arms alternate: **quota**, every
thread of a rank in its host's share (what a sweep does), and **apart**, every thread but the
rank's main one (gloo's workers and connection loop) moved to a cgroup without a quota, so that no
collective waits on a host's quota: what is left of the fixed cost's growth with W is then the
machine's own cores, not the emulated hosts' quotas.

Printed per W, kind and size: wall ms, CPU ms, the wall time that CPU needs at the share (CPU / q:
a host of 0.2 cores runs 1 ms of CPU in 5 ms once its quota is spent), and the rest, waiting (wall
less that; negative where a short collective ran on quota left in its 10 ms period). Then every
sample at W > 2 priced from W = 2's probe as a cluster cell is, from W = 2's wall times (what the
report does) and from its CPU times at the share, against the wall measured at W. And per W and
kind, the fixed cost per collective (the probe's 4 KiB sample: bytes are negligible there) split
the same way, against W = 2's scaled by the ring's rounds, which is what a cluster cell is priced
with. docs/performance.md, "The step model's error bands", has the cluster cells these explain. Results go to
bench/results/probe_cpu.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import join_group, load_average, machine, run_on_hosts, table, write_json  # noqa: E402

from hooks.wire import rounds  # noqa: E402
from service.network import netem  # noqa: E402

SMALL = 4 << 10  # the probe's smallest payload: its time is the fixed cost


def _rank_main(rank: int, world_size: int, port: int, net, comm_apart: bool, queue) -> None:
    try:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d: "a namespace has no hostname"
        import torch
        import torch.distributed as dist

        from _projection_cluster import on_host
        from service.train.transport_probe import probe

        torch.set_num_threads(1)
        with on_host(net.hosts[rank]):  # the whole rank, its gloo threads too, in its host's share
            join_group(port, rank, world_size)
            group = netem.process_group_on_host(net.hosts[rank])
            if comm_apart:
                from service.network.host_cpu import gloo_threads_apart

                gloo_threads_apart(group, net.hosts[rank].cgroup)
            samples, where = probe(group=group, host=net.hosts[rank].namespace)
            dist.destroy_process_group()
        queue.put((rank, {"samples": [asdict(s) for s in samples], "hosts": asdict(where)}, None))
    except BaseException:  # noqa: BLE001 - the parent prints it
        import traceback

        queue.put((rank, None, traceback.format_exc()))


ARMS = ("quota", "apart")


def run_world(world_size: int, q: float, comm_apart: bool = False) -> dict:
    """The probe on ``world_size`` hosts of ``q`` cores each (rank 0's result); ``comm_apart``:
    the ranks' threads but the main one outside their host's quota."""
    from _projection_cluster import remove_apart

    try:
        return run_on_hosts(_rank_main, world_size, q, (comm_apart,), timeout_s=1800)
    finally:
        if comm_apart:
            remove_apart(os.getpid())  # the comm cgroups; the hosts' went with the network


def rows_of(runs: list[dict], q: float) -> list[dict]:
    """Per (arm, W, kind, size): the medians over the rounds of wall and CPU ms, and the split."""
    by_cell: dict[tuple, list[dict]] = {}
    for run in runs:
        for s in run["samples"]:
            by_cell.setdefault((run.get("arm", "quota"), s["world_size"], s["kind"], s["nbytes"]), []).append(s)
    rows = []
    for (arm, w, kind, nbytes), cell in sorted(by_cell.items()):
        wall = statistics.median(s["ms"] for s in cell)
        cpu = statistics.median(s["cpu_ms"] for s in cell)
        rows.append({"arm": arm, "world_size": w, "kind": kind, "nbytes": nbytes, "wall_ms": round(wall, 3),
                     "cpu_ms": round(cpu, 3), "cpu_at_share_ms": round(cpu / q, 3),
                     "waiting_ms": round(wall - cpu / q, 3), "rounds": len(cell),
                     "wall_ms_each": [round(s["ms"], 3) for s in cell], "cpu_ms_each": [round(s["cpu_ms"], 3) for s in cell]})
    return rows


def fixed_costs(rows: list[dict], cores: float) -> list[list]:
    """Per W and kind, the 4 KiB collective's wall, CPU / q and waiting, against W = 2's scaled by
    the ring's rounds; and the wall the machine's ``cores`` need for every rank's CPU of it (W x
    CPU / cores: no collective on these emulated hosts can be faster, whatever their quotas)."""
    small = {(r["world_size"], r["kind"]): r for r in rows if r["nbytes"] == SMALL}
    out = []
    for (w, kind), r in sorted(small.items()):
        base = small.get((2, kind))
        scale = rounds(kind, w) / rounds(kind, 2) if base else None
        out.append([w, kind, r["wall_ms"], r["cpu_at_share_ms"], r["waiting_ms"],
                    round(base["wall_ms"] * scale, 3) if base else "-",
                    round(base["cpu_at_share_ms"] * scale, 3) if base else "-",
                    round(w * r["cpu_ms"] / cores, 3)])
    return out


def priced_from_w2(rows: list[dict], q: float) -> list[dict]:
    """Every sample at W > 2 priced from W = 2's probe as a cluster cell is (service/step_model/
    transport.py's fit, its fixed cost scaled by the ring's rounds): from its wall times (what the
    report does) and from its CPU times at the share (CPU / q), against the wall measured at W."""
    from service.step_model.transport import Sample, fit

    w2 = [r for r in rows if r["world_size"] == 2]
    if not w2:
        return []
    by_wall = fit([Sample(r["kind"], 2, r["nbytes"], r["wall_ms"], r["rounds"]) for r in w2], {})
    by_cpu = fit([Sample(r["kind"], 2, r["nbytes"], r["cpu_at_share_ms"], r["rounds"]) for r in w2], {})
    out = []
    for r in rows:
        if r["world_size"] > 2:
            wall = by_wall.kinds[r["kind"]][0].ms(r["kind"], r["nbytes"], r["world_size"])
            cpu = by_cpu.kinds[r["kind"]][0].ms(r["kind"], r["nbytes"], r["world_size"])
            out.append({**{k: r[k] for k in ("world_size", "kind", "nbytes", "wall_ms")},
                        "from_w2_wall_ms": round(wall, 3), "from_w2_wall_error_pct": round(100 * (wall / r["wall_ms"] - 1), 1),
                        "from_w2_cpu_ms": round(cpu, 3), "from_w2_cpu_error_pct": round(100 * (cpu / r["wall_ms"] - 1), 1)})
    return out


def report_arm(arm: str, rows: list[dict], args, cores: float) -> list[dict]:
    """One arm's tables, printed; its samples priced from W = 2 returned."""
    print(f"\n[{arm}] per collective on hosts of {args.q:g} cores (medians over {args.rounds} round(s) of the probe's medians):")
    print(table(["W", "kind", "KiB per rank", "wall ms", "CPU ms", "CPU / q ms", "waiting ms (wall - CPU / q)"],
                [[r["world_size"], r["kind"], r["nbytes"] // 1024, r["wall_ms"], r["cpu_ms"], r["cpu_at_share_ms"],
                  r["waiting_ms"]] for r in rows]))
    print(f"\n[{arm}] fixed cost per collective (4 KiB), against W = 2's scaled by the ring's rounds (the cluster "
          f"cell's price), and the wall all W ranks' CPU needs of the machine's {cores:g} cores:")
    print(table(["W", "kind", "wall ms", "CPU / q ms", "waiting ms", "W = 2's wall x rounds", "W = 2's CPU / q x rounds",
                 "W x CPU / cores ms"], fixed_costs(rows, cores)))
    priced = [{"arm": arm, **p} for p in priced_from_w2(rows, args.q)]
    if priced:
        print(f"\n[{arm}] every sample at W > 2 priced from W = 2's probe as a cluster cell is (its fit, fixed cost x rounds):"
              " from W = 2's wall, and from W = 2's CPU / q, against the wall measured at W:")
        print(table(["W", "kind", "KiB per rank", "measured wall ms", "from W=2 wall ms", "error %",
                     "from W=2 CPU / q ms", "error %"],
                    [[p["world_size"], p["kind"], p["nbytes"] // 1024, p["wall_ms"], p["from_w2_wall_ms"],
                      p["from_w2_wall_error_pct"], p["from_w2_cpu_ms"], p["from_w2_cpu_error_pct"]] for p in priced]))
        for source in ("wall", "cpu"):
            errors = sorted(abs(p[f"from_w2_{source}_error_pct"]) for p in priced)
            print(f"[{arm}] from W = 2's {source}: median |error| {statistics.median(errors):.1f} %, "
                  f"{sum(e <= 10 for e in errors)} of {len(errors)} within 10 %")
    return priced


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--q", type=float, default=0.2, help="cores per emulated host (default 0.2)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=2, help="each world's probe, order reversed every round")
    parser.add_argument("--period-us", type=int, help="the hosts' CFS period (default: host_cpu.PERIOD_US)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                        help="quota: every rank thread in its host's share (a sweep's); apart: every thread but the "
                             "main one (gloo's) in a cgroup without a quota (default: both, alternated)")
    parser.add_argument("--quick", action="store_true", help="W = 2, one round")
    parser.add_argument("--out", help="JSON path (default bench/results/probe_cpu.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.world_sizes, args.rounds = [2], 1
    if os.geteuid() != 0:
        parser.error("emulated hosts need root (network namespaces, cgroups)")
    from service.network import host_cpu

    if args.period_us:
        host_cpu.PERIOD_US = args.period_us  # the spawned ranks' hosts are made in this process
    cores = host_cpu.machine_cores(host_cpu.hierarchy())
    print(f"hosts of {args.q:g} cores, CFS period {host_cpu.PERIOD_US} us, arms {' '.join(args.arms)}, "
          f"the machine's {cores:g} cores", flush=True)
    try:
        host_cpu.preflight(args.q, max(args.world_sizes))
    except host_cpu.HostCpuError as exc:
        parser.error(str(exc))
    before = load_average()
    print(f"load average before: {before}", flush=True)
    runs = []
    for r in range(args.rounds):
        for w in (args.world_sizes if r % 2 == 0 else args.world_sizes[::-1]):
            for arm in (args.arms if r % 2 == 0 else args.arms[::-1]):
                runs.append({**run_world(w, args.q, arm == "apart"), "arm": arm})
                print(f"round {r + 1}: W = {w}, {arm} probed (load {load_average()})", flush=True)
    rows = rows_of(runs, args.q)
    priced = []
    for arm in args.arms:
        priced += report_arm(arm, [r for r in rows if r["arm"] == arm], args, cores)
    after = load_average()
    print(f"\nload average after: {after}")
    path = write_json("probe_cpu", {"machine": machine(), "settings": vars(args), "load_average_before": before,
                                    "load_average_after": after, "rows": rows, "priced_from_w2": priced,
                                    "hosts": [run["hosts"] for run in runs]}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
