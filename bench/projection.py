"""The step model (service/step_model/) held against cells it never saw: every hook on emulated hosts.

    sudo .venv/bin/python bench/projection.py              # W = 2, 4; 0.5, 1, 2.5 Gbit/s; every hook (~20 min)
    sudo .venv/bin/python bench/projection.py --quick      # W = 2, 1 Gbit/s, 3 hooks, few steps (smoke)
    .venv/bin/python bench/projection.py --summarise bench/results/projection.json   # a saved run
    .venv/bin/python bench/projection.py --summarise A.json B.json --band-out P      # B's world sizes A lacks added
    .venv/bin/python bench/projection.py --summarise service/step_model/projection_cells.json [--band-out P]
                                        # the committed cells: the bands re-derived (and rewritten)
    .venv/bin/python bench/projection.py --summarise COMMITTED_CELLS.json NEW_CELLS.json --band-out P
                                        # the hooks the committed cells lack added from a run of only them
    sudo .venv/bin/python bench/projection.py --hooks allreduce topk --world-sizes 4 --links 1
    sudo .venv/bin/python bench/projection.py --host-cpus 0.2 --world-sizes 2 4 8 --links 0.5 1 --repeats 3 \
        --steps 20 --error-feedback on off --quality-steps 0 --full --comm-apart
                                        # the emulated cluster (bench/_projection_cluster.py): the committed cluster bands
    sudo .venv/bin/python bench/projection.py --parallelism fsdp --hooks allreduce bf16_compress quantized_allreduce \
        --all-gather fp32 quantized_allreduce:uint8 --error-feedback off --host-cpus 0.2 --world-sizes 2 4 \
        --links 0.5 1 --repeats 3 --steps 20 --quality-steps 0 --full --comm-apart --out F.json --band-out P
                                        # the same under FSDP2: the fsdp rows the committed cluster bands carry
                                        # (merged with --summarise COMMITTED_CELLS.json NEW_CELLS.json --band-out P)

Needs root (network namespaces; service/network/netem.py). Workload: the quant preset's (char_lm, global
batch 64, AdamW, lr 0.003), a short trial (--steps, 5 warm-up steps, the step timeline sampled on
5 steps, one eval at the end), every registered hook (error feedback on where it has it, PowerSGD
compressing from step 3), trained by ``service.train.run_training`` (no Ray) in one process per
rank; the hooks one after another, rank 0 reshaping the links between barriers.

* basis: the trial on loopback at W = 2 (the default gloo group, unshaped) - its recorded step
  timeline (``TrialTimeline``) is the model's only input;
* measured cells: the same trial on W emulated hosts (one per rank) at each link; measured ms =
  the trial's ``step_time_ms_median`` (rank 0's median step over the steps after warm-up; a
  periodic hook's ``step_time_ms_mean``: its exchange every 4 steps amortized over them);
* projected ms: ``TrialTimeline.price(64, W, goodput, latency, transport, cores)`` of the basis,
  where goodput and latency are the cell's link as MEASURED with all W hosts sending at once
  (``service.network.link_measure.time_group``), not the nominal rate; ``transport`` the sweep's
  probe (service/train/transport_probe.py) run on loopback at each W before its trials, one fit
  over all of them (transport.json's form); ``cores`` this machine's: W ranks on C cores stretch
  every rank's CPU phases by W / C (the machine's shape: a cluster cell gives each rank a core).
  A cell whose hosts get less than 85% of the nominal rate together is not carried by this
  machine and not counted;
* error % = (projected - measured) / measured; per hook its band (min, max over counted cells)
  and median |error|. Arms (loopback and the links) alternate in every repeat, the basis trained
  again in each, so load changes hit them alike; figures are medians over repeats.

Counted cells (the rest are shown with the reason): held out (not the basis), W above the cores
included (the model is told the machine's shape);
the link carried (above); and only the quiet repeats: each trial records the cores the rest of
the machine kept busy meanwhile (/proc/stat busy time per second less the ranks' own CPU, ~0 on
a quiet machine), and a repeat over --quiet-cores is left out of the cell's and the basis's
medians (a test suite beside the bench doubles a step on 2 cores).

Time to target (--quality-steps, 0: skip): one longer loopback trial per hook at W = 2 (eval
every quarter); target = allreduce's final eval loss x 1.01; the crossing step from
``service.answer.recommend.time_to_target``; projected seconds at each cell = crossing step x
projected step.

Global batch 64 splits over W = 2, 4, 8 only (W = 3 and 6 are refused by the workload's check).
Writes bench/results/projection.json (every row, the load), the error bands per hook, error
feedback and W (--band-out; a --quick run writes one only when given --band-out), and beside
them the cells they come from (committed: --summarise re-derives the bands from them) and the
ratio bands of every pair (bench/projection_pairs.py): on this machine's shape
service/step_model/projection_error.json, projection_cells.json, projection_pairs.json.

--parallelism fsdp: the hooks run under FSDP2 (search.parallelism: fsdp; service/train/fsdp.py), in
their sharded forms (hooks/sharded.py); a hook without one is dropped, with a note. Each runs once
per parameter all-gather format of --all-gather (FORMAT: every hook; HOOK:FORMAT: that hook only;
default fp32, and uint8 for quantized_allreduce, as tune_configs/fsdp.yaml). Its rows, cells,
bands and pairs carry ``parallelism: fsdp`` and their ``all_gather`` format, kept apart from the
same hook's ddp ones (a row or band without them is ddp's: service/step_model/bands.py), and the
report takes an fsdp trial's band from them (``ErrorBands.for_cell``'s parallelism and all_gather).

--error-feedback on off: every hook that has error feedback runs once per setting (its rows and
bands keyed by it; the quality trials take the first setting). --host-cpus Q: the emulated
cluster instead of this machine's shape (bench/_projection_cluster.py): every host, the basis's
too, owns Q cores; the basis is W = 2 on such hosts, unshaped; the transport probed on the hosts
at every W; a held-out cell priced by the report's cluster path (cores None, W = 2's probe scaled
by the ring); each such cell is priced again with the transport probed on the hosts at its own W
(``probed_error_pct``, printed per W beside the first). Its files are the ones the report reads: projection_error_cluster.json,
projection_cells_cluster.json and projection_pairs_cluster.json (a hook they lack gets the
widest band measured).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _common import copies_to_fill, join_group, ROOT, load_average, machine, run_on_hosts, table, write_json  # noqa: F401  (ROOT: sys.path)

import _projection_cluster as cluster_mod  # noqa: E402
import _projection_rows as rows_mod  # noqa: E402
from service.network import link_measure  # noqa: E402
from service.network import host_cpu, netem  # noqa: E402
from pathlib import Path  # noqa: E402

from service.step_model.bands import ERROR_FILE, SHAPE_ERROR_FILE  # noqa: E402

GLOBAL_BATCH = 64
CARRIED_FRACTION = 0.85  # per-host goodput with W sending, of the nominal rate, for a cell to count
QUICK_HOOKS = ["allreduce", "fp16_compress", "quantized_allreduce"]
DDP, FSDP = "ddp", "fsdp"
FSDP_ALL_GATHER = ["fp32", "quantized_allreduce:uint8"]  # --parallelism fsdp's default: tune_configs/fsdp.yaml's
PERIODIC_PERIOD = 4
ERROR_FEEDBACK = ("on",)  # default: every hook that has error feedback runs with it on (its bands say so)
LOOPBACK = "loopback"
CLUSTER_ERROR_FILE = ERROR_FILE  # the report reads the cluster's


def hook_entries(names: list[str] | None, settings: tuple[bool, ...] = (True,), parallelism: str = DDP,
                 all_gather: list[str] | None = None, quiet: bool = True) -> list:
    """Every registered hook (or ``names``), as search.hooks entries: one per error-feedback
    setting where it has it, PowerSGD compressing from step 3 so that every measured step compresses,
    a periodic hook (post_local_sgd, diloco) exchanging every PERIODIC_PERIOD steps. Under fsdp
    (``parallelism``) the hooks that have a sharded form, each once per all-gather format
    ``all_gather`` gives it (:func:`gather_formats`); the others dropped, with a note (``quiet``: none)."""
    import hooks

    entries, dropped = [], []
    for name, spec in hooks.available().items():
        if names and name not in names:
            continue
        if parallelism == FSDP and spec.sharded is None:
            dropped.append(name)
            continue
        formats = gather_formats(name, all_gather) if parallelism == FSDP else [None]
        for ef in settings if "error_feedback" in spec.params else (None,):
            for fmt in formats:
                params = {} if ef is None else {"error_feedback": ef}
                if spec.periodic:  # an exchange every 4 steps: several in a short trial's measured steps
                    params["period"] = PERIODIC_PERIOD
                elif "start_iter" in spec.params:
                    params["start_iter"] = 2
                if fmt is not None:
                    params["all_gather"] = fmt
                entries.append({"name": name, **params} if params else name)
    if dropped and not quiet:
        print(f"note: no sharded form, not run under fsdp: {', '.join(dropped)}", flush=True)
    return entries


def gather_formats(hook: str, all_gather: list[str] | None) -> list[str]:
    """The all-gather formats ``hook`` runs with under fsdp: each FORMAT of ``all_gather`` and each
    HOOK:FORMAT naming it, in order (fp32 where none applies)."""
    out = [x.split(":", 1)[1] if ":" in x else x for x in (all_gather or FSDP_ALL_GATHER)
           if ":" not in x or x.split(":", 1)[0] == hook]
    return list(dict.fromkeys(out)) or ["fp32"]


def sweep_config(entries: list, world_size: int, steps: int, eval_every: int, timeline_steps: int = 5,
                 parallelism: str = DDP):
    from service.config import SweepConfig

    return SweepConfig.model_validate({
        "name": "projection",
        "search": {"hooks": entries, "world_size": [world_size], "seed": [0], "parallelism": [parallelism]},
        "workload": {"name": "char_lm", "steps": steps, "global_batch_size": GLOBAL_BATCH, "lr": 0.003,
                     "optimizer": "adamw", "eval_every": eval_every, "warmup_steps": 5 if steps > 10 else 2},
        "tracking": {"timeline_steps": timeline_steps}})


class EvalLog:
    """A stand-in for rank 0's MetricLogger: keeps the eval losses (time to target needs them)."""

    def __init__(self):
        self.evals: list[tuple[int, float]] = []

    def log(self, step: int, **metrics) -> None:
        if "eval_loss" in metrics:
            self.evals.append((step, metrics["eval_loss"]))

    def flush(self) -> None:
        pass

    def log_summary(self, **summary) -> None:
        pass

    def log_dict(self, data, name) -> None:
        pass

    def set_tags(self, **tags) -> None:
        pass

    def close(self) -> None:
        pass


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (every process and the kernel), /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, *rest = (int(x) for x in f.readline().split()[1:])
    return (user + nice + system + sum(rest[:3])) / os.sysconf("SC_CLK_TCK")  # + irq, softirq, steal


def _trial(trial, cfg, rank: int, world_size: int, group, logger=None) -> dict:
    """One trial on this rank; rank 0's figures. ``other_cores``: the cores the rest of the machine
    kept busy meanwhile (machine busy CPU per wall second less the ranks' own ``cpu_share``): on 2
    cores a test suite started beside the bench doubles a step, and this says which trials it hit."""
    from service.step_model.bands import error_feedback_of, sharding_fields
    from service.train import TrainingContext, run_training

    busy0, t0 = busy_cpu_s(), time.perf_counter()
    result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu", process_group=group,
                          logger=logger))
    wall = time.perf_counter() - t0
    return {"status": result.status, "step_ms": result.summary[measured_step(trial.hook)],
            "error_feedback": error_feedback_of(trial.hook, trial.hook_params),
            **sharding_fields(trial.parallelism, trial.hook_params.get("all_gather")),
            "final_eval_loss": result.summary.get("final_eval_loss"),
            "other_cores": (busy_cpu_s() - busy0) / wall - result.summary.get("cpu_share", 0.0),
            "timeline": result.timeline.to_json() if result.timeline else None}


def measured_step(hook: str) -> str:
    """The summary metric a cell's measured step is: the median step; a periodic hook's mean, its
    exchange every period steps in it (the step model amortizes it the same way)."""
    from service import hook_facts

    return "step_time_ms_mean" if hook_facts.periodic(hook) else "step_time_ms_median"


def _measure_links(rank: int, world_size: int, net, group, links: list[float]) -> dict:
    """Each link's aggregate goodput and latency with every host of this world sending."""
    import torch.distributed as dist

    out = {}
    for link in links:
        if rank == 0:
            net.reshape(link)
        dist.barrier()
        nbytes = max(link_measure.DEFAULT_BYTES, int(link * 1e9 / 8 * 0.1))
        gbps, latency_ms = link_measure.time_group(group, rank, world_size, nbytes)
        out[link] = {"gbps": gbps, "latency_ms": latency_ms}
    return out


def _arms(rank: int, world_size: int, net, args) -> dict:
    """One rank's whole run in one world: per repeat the links measured, then every hook on every
    arm (the order reversed on odd repeats); at W = 2 the basis is an arm (loopback, or the
    emulated cluster's unshaped hosts: ``BASIS_ARM``)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    group = netem.process_group_on_host(net.hosts[rank])
    if getattr(args, "comm_apart", False):  # re-checked before every trial
        host_cpu.gloo_threads_apart(group, net.hosts[rank].cgroup)
    cfg = sweep_config(entries(args), world_size, args.steps, args.steps, parallelism=parallelism(args))
    basis = cluster_mod.BASIS_ARM if args.host_cpus else LOOPBACK
    arms = ([basis] if world_size == 2 else []) + list(args.links)
    out = {"links": [], "runs": []}
    if args.host_cpus:  # on the hosts, their link unshaped (the network starts so): where the user trains
        out["transport_probe"] = cluster_mod.probe_on(group, net.hosts[rank].namespace)
    else:
        out["transport"] = _probe_loopback()
    for rep in range(args.repeats):
        out["links"].append(_measure_links(rank, world_size, net, group, args.links))
        order = arms if rep % 2 == 0 else arms[::-1]
        for trial in cfg.trials():
            for arm in order:
                if arm != LOOPBACK:
                    if rank == 0:
                        net.reshape(None if arm == cluster_mod.BASIS_ARM else arm)
                    dist.barrier()
                if getattr(args, "comm_apart", False):
                    host_cpu.threads_apart(net.hosts[rank].cgroup)
                run = _trial(trial, cfg, rank, world_size, None if arm == LOOPBACK else group)
                out["runs"].append({"hook": trial.hook, "label": trial.config_label, "arm": arm,
                                    "repeat": rep, **run})
        if rank == 0:
            print(f"W={world_size} repeat {rep + 1}/{args.repeats} done (load {load_average()})", flush=True)
    if world_size == 2 and args.quality_steps:
        out["quality"] = _quality(rank, world_size, args)
    return out


def _probe_loopback() -> list[dict]:
    """The sweep's transport probe (service/train/transport_probe.py) at this W on the default
    loopback group, before the trials: what the model prices this machine's collectives from."""
    from dataclasses import asdict

    from service.train.transport_probe import probe

    return [asdict(s) for s in probe()[0]]


def _quality(rank: int, world_size: int, args) -> dict:
    """Per hook, one longer loopback trial's eval losses (rank 0 logs them)."""
    steps = args.quality_steps
    cfg = sweep_config(entries(args, settings(args)[:1]), world_size, steps, max(steps // 4, 1),
                       timeline_steps=0, parallelism=parallelism(args))
    out = {}
    for trial in cfg.trials():
        log = EvalLog()
        run = _trial(trial, cfg, rank, world_size, None, log if rank == 0 else None)
        out[rows_mod.name(run | {"hook": trial.hook})] = {"evals": log.evals, "status": run["status"], "steps": steps}
    return out


def _rank_main(rank: int, world_size: int, port: int, net, args, queue) -> None:
    try:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d: "a namespace has no hostname"
        import torch.distributed as dist

        with cluster_mod.on_host(net.hosts[rank]):  # the whole rank in its host's share (--host-cpus)
            join_group(port, rank, world_size)
            out = _arms(rank, world_size, net, args)
        dist.destroy_process_group()
        queue.put((rank, out, None))
    except BaseException:  # noqa: BLE001 - the parent prints it
        import traceback

        queue.put((rank, None, traceback.format_exc()))


def run_world(world_size: int, args) -> dict:
    """Every arm of one world size: W processes, one per emulated host (rank 0's results); with
    --full, beside copies of them until the machine carries the largest W's hosts."""
    copies = copies_to_fill(world_size, args.world_sizes) if getattr(args, "full", False) else 1
    try:
        return run_on_hosts(_rank_main, world_size, args.host_cpus, (args,), timeout_s=3 * 3600, copies=copies)
    finally:
        if getattr(args, "comm_apart", False):
            cluster_mod.remove_apart(os.getpid())


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--links", type=float, nargs="+", default=[0.5, 1.0, 2.5], help="Gbit/s per host")
    parser.add_argument("--repeats", type=int, default=3, help="whole sweeps of the arms, alternated")
    parser.add_argument("--steps", type=int, default=40, help="steps per trial (5 warm-up)")
    parser.add_argument("--quality-steps", type=int, default=100,
                        help="the loopback quality trial per hook, eval every quarter (0: no time to target)")
    parser.add_argument("--quiet-cores", type=float, default=0.5, help="a repeat counts when other processes "
                        "kept at most this many cores busy during its trial (on average); with --host-cpus, what the W hosts leave "
                        "free instead (cores - W x Q)")
    parser.add_argument("--hooks", nargs="+", help="a subset of the hooks (allreduce is the target's baseline)")
    parser.add_argument("--parallelism", choices=[DDP, FSDP], default=DDP, help="fsdp: the hooks that have a sharded "
                        "form under FSDP2 (the others dropped, with a note); their rows and bands say so")
    parser.add_argument("--all-gather", nargs="+", metavar="[HOOK:]FORMAT", help="with --parallelism fsdp: the "
                        "parameter all-gather formats (fp32, bf16, uint8) each sharded hook runs with, or HOOK:FORMAT "
                        f"for one hook (default: {' '.join(FSDP_ALL_GATHER)})")
    parser.add_argument("--error-feedback", nargs="+", choices=["on", "off"], default=list(ERROR_FEEDBACK),
                        help="each hook that has error feedback runs once per setting")
    parser.add_argument("--host-cpus", type=float, metavar="Q", help="the emulated cluster: every host owns Q "
                        "cores, the basis too; cells priced by the report's cluster path (module doc)")
    parser.add_argument("--full", action="store_true", help="with --host-cpus: every W beside copies of its job on "
                        "hosts of their own, until the machine carries the largest W's hosts (a cgroup divides time, "
                        "not caches: alone, a W = 2 host computes faster than one of eight; docs/performance.md)")
    parser.add_argument("--comm-apart", action="store_true", help="with --host-cpus: every rank thread but the main "
                        "one (gloo's) in a cgroup without a quota: the rank's compute owns the share and its collectives "
                        "wait on no quota, as on a cluster host with cores beside its rank's (the committed cluster "
                        "bands are measured so; without it --host-cpus writes bands only to --band-out)")
    parser.add_argument("--quick", action="store_true", help="W=2, 1 Gbit/s, 3 hooks, 12 steps, 1 repeat")
    parser.add_argument("--summarise", metavar="JSON", nargs="+", help="print the table of saved runs (their raw runs "
                        "through the current model and rules) instead of measuring")
    parser.add_argument("--out", help="JSON path (default bench/results/projection.json)")
    parser.add_argument("--band-out", help="the error band's path (default service/step_model/projection_error.json)")
    args = parser.parse_args(argv)
    if args.all_gather and args.parallelism != FSDP:
        parser.error("--all-gather needs --parallelism fsdp (DDP gathers no parameters)")
    formats = {"fp32", "bf16", "uint8"}
    bad = [x for x in args.all_gather or [] if x.split(":", 1)[-1] not in formats]
    if bad:
        parser.error(f"--all-gather {bad[0]}: a format is one of {', '.join(sorted(formats))} (HOOK:FORMAT for one hook)")
    if args.full and not args.host_cpus:
        parser.error("--full needs --host-cpus (copies of a job fill hosts that own their CPU)")
    if args.comm_apart and not args.host_cpus:
        parser.error("--comm-apart needs --host-cpus (it moves threads off the hosts' quotas)")
    if args.comm_apart and getattr(host_cpu.hierarchy(), "version", None) != 1:
        parser.error("--comm-apart moves single threads between cgroups, which needs cgroup v1's cpu controller")
    if args.quick:
        args.world_sizes, args.links, args.repeats, args.steps, args.quality_steps = [2], [1.0], 1, 12, 20
        args.hooks = args.hooks or QUICK_HOOKS
    elif not args.band_out and not args.summarise and (args.comm_apart or not args.host_cpus):
        args.band_out = str(CLUSTER_ERROR_FILE if args.host_cpus else SHAPE_ERROR_FILE)
    return args


def parallelism(args) -> str:
    """ddp | fsdp (--parallelism; a saved run from before it: ddp)."""
    return getattr(args, "parallelism", None) or DDP


def entries(args, efs: tuple[bool, ...] | None = None, quiet: bool = True) -> list:
    """The search.hooks entries this run trains (:func:`hook_entries` of --hooks, the
    error-feedback settings and, under fsdp, --all-gather)."""
    return hook_entries(args.hooks, settings(args) if efs is None else efs, parallelism(args),
                        getattr(args, "all_gather", None), quiet)


def settings(args) -> tuple[bool, ...]:
    """The error-feedback settings to run, in the order given (--error-feedback on off)."""
    return tuple(dict.fromkeys(x == "on" for x in args.error_feedback))


def rules(args) -> dict:
    """What a counted cell needs (bench/_projection_rows.py): the cores and links it prices, a
    quiet machine. The emulated cluster (--host-cpus) prices a cluster cell: cores None, the
    transport W = 2's probe on the hosts."""
    cluster = getattr(args, "host_cpus", None)
    efs = settings(args)
    return {"global_batch": GLOBAL_BATCH, "carried": CARRIED_FRACTION,
            "cores": None if cluster else (os.cpu_count() or 1), "host_cpus": cluster, "machine_cores": os.cpu_count() or 1,
            "comm_apart": bool(getattr(args, "comm_apart", False)),
            "transport_w": cluster_mod.BASIS_W if cluster else None,
            "quiet": args.quiet_cores, "error_feedback": efs[0] if len(efs) == 1 else list(efs)}


def summarise_saved(args) -> int:
    import json

    saved = [json.loads(open(path).read()) for path in args.summarise]
    if "cell_rows" in saved[0]:  # a committed projection_cells.json: its bands again, rewritten with --band-out
        cells = rows_mod.with_added_hooks(saved[0], saved[1:])  # later cells files: the hooks it lacks added
        band = {**rows_mod.from_cells(cells), "raw": Path(args.summarise[0]).name}  # the cells it came from
        rows_mod.print_report({"rows": [], "bands": band})
        rows_mod.print_per_w(cells["cell_rows"], "error_pct")  # per W (and parallelism) over the cells
        if args.band_out:
            print(f"wrote {rows_mod.write_band(band, args.band_out)}")
            if len(saved) > 1:  # the merged cells beside the bands, and the pairs' ratio bands from them
                write_cells_and_pairs(cells, args)
        return 0
    worlds, links = {}, []
    for run in saved:  # a later run adds the world sizes the earlier ones lack (W = 2's basis: the first's)
        worlds.update({w: v for w, v in run["raw"].items() if w not in worlds})
        links += [x for x in run["settings"]["links"] if x not in links]
    args.world_sizes, args.links, args.steps = sorted(int(w) for w in worlds), links, saved[0]["settings"]["steps"]
    args.host_cpus = saved[0]["settings"].get("host_cpus")
    args.comm_apart = saved[0]["settings"].get("comm_apart", False)   # the band file's provenance says so
    args.parallelism = saved[0]["settings"].get("parallelism", DDP)
    args.error_feedback = saved[0]["settings"].get("error_feedback", list(ERROR_FEEDBACK))
    result = rows_mod.summarise(worlds, rules(args))
    rows_mod.print_report(result)
    for run, path in zip(saved, args.summarise):
        print(f"(saved run {path}, {run['finished_utc']}: load average before {run['load_average_before']}, "
              f"after {run['load_average_after']})")
    if args.band_out:
        load = [x for run in saved for x in (run["load_average_before"][0], run["load_average_after"][0])]
        write_bands(result, args, load, max(run["finished_utc"] for run in saved))  # when measured, not now
    return 0


def write_cells_and_pairs(cells: dict, args) -> None:
    """Merged cells beside --band-out, and the ratio bands of every pair from them."""
    import projection_pairs

    path = beside(args.band_out, "projection_cells.json")
    print(f"wrote {rows_mod.write_band(cells, str(path))}")
    pairs = beside(args.band_out, "projection_pairs.json")
    projection_pairs.main(["--cells", str(path), "--out", str(pairs), "--error-feedback",
                           *("on" if ef else "off" for ef in cells["error_feedback"])])


def write_bands(result: dict, args, load: list[float], measured: str | None = None) -> None:
    """The band file the report reads and, beside it, the cells it comes from (``measured``: when
    the runs ended, for saved ones; default now)."""
    band = rows_mod.band_file(result, args, rules(args), load, measured)
    cells = beside(args.band_out, "projection_cells.json")
    band["raw"] = cells.name
    print(f"wrote {rows_mod.write_band(band, args.band_out)}")
    print(f"wrote {rows_mod.write_band(rows_mod.cells_file(result, band), str(cells))}")
    import projection_pairs  # the ratio bands beside them, from the cells just written (every setting's pairs)

    pairs = beside(args.band_out, "projection_pairs.json")
    projection_pairs.main(["--cells", str(cells), "--out", str(pairs), "--error-feedback",
                           *("on" if ef else "off" for ef in settings(args))])


def beside(band_out: str, name: str) -> Path:
    """A file beside the band file: ``name`` (projection_cells.json, projection_pairs.json), or for
    a band file named projection_error<suffix>.json the same suffix (the cluster's: _cluster)."""
    out = Path(band_out)
    stem = out.stem
    if stem.startswith("projection_error"):
        name = name.replace(".json", f"{stem[len('projection_error'):]}.json")
    return out.with_name(name)


def main(argv=None) -> int:
    args = parse(argv)
    if args.summarise:
        return summarise_saved(args)
    if os.geteuid() != 0:
        print("error: bench/projection.py needs root (emulated hosts are network namespaces): run it with sudo",
              file=sys.stderr)
        return 2
    try:
        netem.preflight(min(args.links))
    except netem.NetemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    why = cluster_mod.preflight(args.host_cpus, args.world_sizes) if args.host_cpus else None
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if not entries(args, quiet=parallelism(args) == DDP):
        print(f"error: none of the hooks {args.hooks} runs under {parallelism(args)}", file=sys.stderr)
        return 2
    load_before, started = load_average(), time.time()
    print(f"load average at start {load_before}", flush=True)
    worlds = {}
    for w in args.world_sizes:
        worlds[w] = run_world(w, args)
        print(f"W={w} done, {time.time() - started:.0f} s (load {load_average()})", flush=True)
    load_after = load_average()
    result = rows_mod.summarise(worlds, rules(args))
    rows_mod.print_report(result)
    print(f"load average at start {load_before}, at end {load_after}; {time.time() - started:.0f} s")
    path = write_json("projection", {"machine": machine(), "load_average_before": load_before,
                                     "load_average_after": load_after, "settings": vars(args), **result,
                                     "raw": {str(w): v for w, v in worlds.items()}}, args.out)
    print(f"wrote {path}")
    if args.band_out:
        write_bands(result, args, [load_before[0], load_after[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
