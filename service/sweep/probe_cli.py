"""Probe the transport of the cluster you will train on, and write its ``transport.json``.

    python -m service.probe --address HEAD:6379 --world-size 8 [--out transport.json]

What a collective costs besides the wire (a fixed cost per collective, the CPU work per byte a
rank sends) belongs to the hosts that run it, not to the model or the link. A sweep measures it
where its trials run (on one machine: loopback); this runs the same probe
(service/train/transport_probe.py) as one short job on a Ray cluster, on ``--world-size`` Ray
Train workers, and writes the fit (service/step_model/transport.py) with the hosts it ran on.
Every kind by default: DDP's hooks' (allreduce, allgather, all_to_all) and FSDP's (reduce_scatter,
all_gather); ``--ddp-only`` leaves FSDP's out, for a cluster that will train no fsdp trial.
Give it to the report as ``report.cluster.transport: PATH``: the cluster answer, the decision map
and the per-bucket plan are then priced with that cluster's transport.

Exit status: 0 written; 2 nothing written (bad option, no cluster at the address, the probe failed);
130 interrupted (Ctrl-C), nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from service.text import one_line


class ProbeError(Exception):
    """Nothing was written; str() is one line saying why."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m service.probe",
        description="Time every collective kind the hooks use on a Ray cluster's hosts (DDP's allreduce, "
                    "allgather and all_to_all; FSDP's reduce_scatter and all_gather), at each --world-size, "
                    "and write transport.json for report.cluster.transport.",
        epilog="On a cluster spanning several hosts, --storage-path must be a directory every node "
               "mounts (the probe's rank 0 hands its samples back through it), as for service.submit. "
               "See docs/cluster.md.")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                   help="the cluster's Ray address as ray.init takes it: HEAD:6379, ray://HEAD:10001 or auto "
                        "(default: $RAY_ADDRESS)")
    p.add_argument("--world-size", type=int, nargs="+", required=True, metavar="W",
                   help="ranks to probe with, one Ray Train worker each (2 or more; several: one probe each)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0,
                   help="CPUs each worker reserves (default 1: a core per rank, as a cluster cell is priced)")
    p.add_argument("--storage-path", default=None,
                   help="Ray Train's storage_path for the probe (default: a temporary directory here)")
    p.add_argument("--link-gbps", type=float, default=None, metavar="G",
                   help="the link between the cluster's hosts, Gbit/s: its wire time is inside what the probe "
                        "measures, and the report takes it out where transport and wire add up (allgather, "
                        "all_to_all) before adding each cell's own; without it a probe across hosts counts that "
                        "wire twice for those kinds (default: none, as on one host)")
    p.add_argument("--ddp-only", action="store_true",
                   help="probe DDP's kinds only (allreduce, allgather, all_to_all), leaving out FSDP's "
                        "reduce_scatter and all_gather (a shorter probe), for a cluster that will "
                        "train no fsdp trial (its fsdp trials' collectives are then not priced from this file)")
    p.add_argument("--out", default="transport.json", help="where to write the fit (default: ./transport.json)")
    return p.parse_args(argv)


def run(args: argparse.Namespace, out=sys.stdout):
    """Probe each world size on the cluster; the fit (service.step_model.transport.TransportFit)."""
    import ray

    from service.config.limits import MAX_LINK_GBPS
    from service.sweep.signals import signals_raise_keyboard_interrupt

    if not args.address:
        raise ProbeError("no cluster to probe: give --address HEAD:6379 (or set RAY_ADDRESS)")
    bad = [w for w in args.world_size if w < 2]
    if bad:
        raise ProbeError(f"--world-size {bad[0]}: a collective needs 2 or more ranks")
    if args.link_gbps is not None and not 0 < args.link_gbps <= MAX_LINK_GBPS:
        raise ProbeError(f"--link-gbps {args.link_gbps:g}: a link rate is above 0 and at most {MAX_LINK_GBPS:g} Gbit/s")
    try:
        ray.init(address=args.address, log_to_driver=False)
    except Exception as exc:  # ray raises ConnectionError, ValueError or a bare Exception
        raise ProbeError(f"cannot reach a Ray cluster at {args.address} ({one_line(exc)})") from None
    storage = args.storage_path or tempfile.mkdtemp(prefix="commhooks-probe-")
    # the sweep's own signal path, installed after ray.init: Ctrl-C (or SIGTERM) is a
    # KeyboardInterrupt here whatever handler connecting to the cluster left behind
    with signals_raise_keyboard_interrupt():
        return _probe_all(args, storage, out)


def _probe_all(args: argparse.Namespace, storage: str, out):
    """Each world size in turn, on the main thread's watch (``off_the_main_thread``)."""
    import ray

    from hooks.wire import ALL_KINDS, KINDS
    from service.step_model.transport import fit
    from service.sweep.transport import off_the_main_thread, probe_on_ray

    kinds = KINDS if args.ddp_only else ALL_KINDS
    samples, cost, hosts, interrupted = [], {}, [], False
    try:
        for w in sorted(set(args.world_size)):
            print(f"W = {w}: probing (Ray Train starts {w} workers on the cluster) ...", file=out, flush=True)
            # off the main thread, where Ray Train's fit would take Ctrl-C for its own
            measured, seconds, where = off_the_main_thread(probe_on_ray, w, storage, args.cpus_per_worker,
                                                           None, True, kinds)
            samples, hosts = samples + measured, hosts + [where]
            cost[w] = round(seconds, 1)
            print(f"W = {w}: probed {where.describe()} in {seconds:.1f} s", file=out, flush=True)
    except KeyboardInterrupt:
        interrupted = True  # the probe's thread is still inside Ray Train: Ray stays up under it
        raise
    except Exception as exc:
        raise ProbeError(f"the probe failed ({one_line(exc)})") from None
    finally:
        if not interrupted:
            ray.shutdown()
    return replace(fit(samples, cost, tuple(hosts)), link_gbps=args.link_gbps)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except ProbeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # this driver's exit ends the probe's actors on the cluster
        print(f"interrupted: nothing written to {args.out}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # at once, not by returning: the interpreter's exit (or ray.shutdown()) with the probe's
        # daemon thread still inside Ray's core worker crashed the process under load (SIGSEGV,
        # exit -11 in place of 130: tests/test_cluster.py's interrupted probe)
        os._exit(130)
    path = Path(args.out)
    path.write_text(json.dumps(result.to_json(), indent=1))
    print(f"wrote {path} (give it to the report as report.cluster.transport: {path.resolve()})")
    return 0
