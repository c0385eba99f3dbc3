"""The cost model held against a measured step: every hook on emulated shaped links.

    .venv/bin/python bench/network.py                       # W = 2, 4; links 1, 2.5 Gbit/s (~10 min)
    .venv/bin/python bench/network.py --quick               # W = 2, 1 Gbit/s, 3 hooks (a smoke run)
    .venv/bin/python bench/network.py --world-sizes 2 --links 1

Needs root (network namespaces; service/netem.py). For each world size W, W processes each join
their own emulated host (a gloo group whose sockets live in the host's namespace, over a veth
into a bridge, the host's egress shaped by tc tbf) and train mlp_digits' MLP (8.5 M parameters,
34 MB of gradients a step) under DDP with each hook. Arms, alternated in every repeat so that
load changes hit them alike: the links unshaped (veth speed) and shaped to each asked rate
(``tc`` changes the qdisc in place between arms; the connections stay up).

Per (hook, W, link), medians over repeats of the per-step figures (max over ranks):

* step ms: the whole optimizer step (forward, backward with the hook, SGD);
* comm ms: the communication window of the step: from the first bucket's hook entry to the
  last bucket's future completion (compression kernels included, as they are on the path);
* compute ms: step - comm on the *unshaped* link (what the step costs besides communicating);
* model comm ms: hooks.cost.projected_comm_seconds of the measured buckets (calls, bytes) at the
  link's measured goodput (service/link_measure.py) and latency;
* compute + model ms = compute + model comm (kernels priced at zero, no overlap);
* model step ms, the projection held against the target: the *unshaped* step re-priced on the
  shaped link by hooks.cost.projected_step_from_measured: its window's serial work kept as
  measured, its transport (the hook's bytes at the per-kind cost of moving bytes measured alone
  on the unshaped link, ``_transport_probe``) overlapping the shaped link's model wire time;
  no-overlap ms = the same without the overlap (unshaped step - unshaped wire + shaped wire);
* error % = (projected - measured) / measured.

Prints the table and the error band, writes bench/results/network.json with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _common import ROOT, load_average, machine, table, time_collective, write_json  # noqa: F401  (ROOT: sys.path)

import hooks  # noqa: E402
from service import link_measure, netem  # noqa: E402

HOOKS = [
    ("allreduce", {}),
    ("allgather_then_aggregate", {}),
    ("fp16_compress", {}),
    ("quantization_pertensor", {}),
    ("quantization_perchannel", {"chunk_size": 512}),
    ("quantized_allreduce", {"chunk_size": 512}),
    ("powersgd", {"rank": 1, "start_iter": 2}),  # compressing from the third step: all measured steps are
]


def _timed(hook):
    """Wrap ``hook``: record each call's entry and its future's completion (the value is read,
    so a failed collective re-raises)."""
    marks = {"entry": [], "done": []}

    def timed(state, bucket):
        marks["entry"].append(time.perf_counter())
        fut = hook(state, bucket)

        def done(f):
            value = f.value()
            marks["done"].append(time.perf_counter())
            return value[0] if isinstance(value, list) else value

        return fut.then(done)

    return timed, marks


BUCKET_ELEMS = 4_273_157  # mlp_digits' mean DDP bucket (8.5 M gradients in 2 buckets)


def _transport_probe(group, world_size: int, repeats: int = 3) -> dict[str, float]:
    """Seconds per byte one rank sends, per collective kind, on the link as it is now (the
    unshaped veth): one bucket-sized allreduce (fp32) and allgather (uint8) timed alone, max
    over ranks, median of repeats. What moving bytes costs this machine's CPUs at this W."""
    import torch

    out = {}
    for kind, x in (("allreduce", torch.ones(BUCKET_ELEMS)), ("allgather", torch.ones(BUCKET_ELEMS, dtype=torch.uint8))):
        out[kind] = time_collective(kind, x, group, world_size, repeats) / hooks.cost.wire_bytes(kind, x.numel() * x.element_size(), world_size)
    return out


def _rank(rank: int, world_size: int, port: int, net: netem.Network, arms: list, repeats: int,
          warmup: int, steps: int, hook_list: list, queue) -> None:
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        from service.workloads import build_workload, fetch_batch

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        group = netem.process_group_on_host(net.hosts[rank])
        results = [{"transport_s_per_byte": _transport_probe(group, world_size)}]  # the network starts unshaped
        for rep in range(repeats):
            order = arms if rep % 2 == 0 else arms[::-1]  # alternate which arm goes first
            for name, params in hook_list:
                for link in order:
                    if rank == 0:
                        net.reshape(link)
                    dist.barrier()
                    wl = build_workload("mlp_digits", 0)
                    model = DDP(wl.model, process_group=group)
                    state, hook = hooks.build(name, process_group=group, **params)
                    timed, marks = _timed(hook)
                    model.register_comm_hook(state, timed)
                    opt = torch.optim.SGD(model.parameters(), lr=0.05)
                    g = torch.Generator().manual_seed(rank)
                    per_step, base = [], None
                    for step in range(warmup + steps):
                        if step == warmup:
                            base = dict(state.stats())
                        idx = torch.randint(len(wl.train_set), (64 // world_size,), generator=g)
                        x, y = fetch_batch(wl.train_set, idx)
                        marks["entry"].clear()
                        marks["done"].clear()
                        t0 = time.perf_counter()
                        opt.zero_grad(set_to_none=True)
                        wl.loss_fn(model(x), y).backward()
                        opt.step()
                        t1 = time.perf_counter()
                        comm = max(marks["done"]) - min(marks["entry"]) if marks["entry"] else 0.0
                        worst = torch.tensor([t1 - t0, comm], dtype=torch.float64)
                        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # default group: loopback
                        if step >= warmup:
                            per_step.append(worst.tolist())
                    now = state.stats()
                    delta = {k: now.get(k, 0) - base.get(k, 0) for k in now}
                    results.append({"hook": name, "params": params, "link": link, "repeat": rep,
                                    "step_ms": 1000 * statistics.median(s for s, _ in per_step),
                                    "comm_ms": 1000 * statistics.median(c for _, c in per_step),
                                    "stats": delta, "steps": steps})
                    del model
        dist.destroy_process_group()
        queue.put((rank, results, None))
    except BaseException as exc:  # noqa: BLE001
        import traceback

        queue.put((rank, None, traceback.format_exc()))


def run_world(world_size: int, links: list[float], repeats: int, warmup: int, steps: int, hook_list) -> list[dict]:
    import multiprocessing as mp

    from _common import free_port

    ctx = mp.get_context("spawn")
    with netem.Network(world_size, None) as net:
        queue = ctx.Queue()
        port = free_port()
        arms = [None, *links]
        procs = [ctx.Process(target=_rank, args=(r, world_size, port, net, arms, repeats, warmup, steps,
                                                 hook_list, queue), daemon=True) for r in range(world_size)]
        for p in procs:
            p.start()
        out = {}
        for _ in procs:
            rank, results, err = queue.get(timeout=3600)
            if err:
                raise RuntimeError(f"rank {rank} failed:\n{err}")
            out[rank] = results
        for p in procs:
            p.join(timeout=30)
    return out[0]


def summarise(raw: list[dict], world_size: int, measured: dict[float, link_measure.LinkMeasurement]) -> list[dict]:
    rows = []
    transport = next((r["transport_s_per_byte"] for r in raw if "transport_s_per_byte" in r), None)
    if transport is None:
        raise SystemExit("error: this saved run predates the transport probe (bench/network.py of issue 15 "
                         "item 4); run the bench again")
    raw = [r for r in raw if "hook" in r]
    keys = sorted({(r["hook"], r["link"] or 0.0) for r in raw}, key=lambda k: (k[1], [h for h, _ in HOOKS].index(k[0])))
    for hook_name, link in keys:
        if not link:
            continue
        mine = [r for r in raw if r["hook"] == hook_name and r["link"] == link]
        bare = [r for r in raw if r["hook"] == hook_name and r["link"] is None]
        step = statistics.median(r["step_ms"] for r in mine)
        comm = statistics.median(r["comm_ms"] for r in mine)
        compute = statistics.median(r["step_ms"] - r["comm_ms"] for r in bare)
        m = measured[link]
        params = dict(mine[0]["params"])
        if hook_name == "powersgd":
            params = {}  # projected_comm_seconds takes PowerSGD's measured compressed fraction
        stats, steps = mine[-1]["stats"], mine[-1]["steps"]
        model = {}
        for label, gbps in (("goodput", m.measured_gbps), ("nominal", link)):
            model[label] = 1000 * hooks.cost.projected_comm_seconds(
                hook_name, stats, steps, world_size, gbps, latency_s=m.measured_latency_ms / 1000, **params)
        projected = compute + model["goodput"]
        # the same projection from the unshaped step, compression kernels and all: the step
        # measured on the veth link, less the model's wire time there, plus the model's wire
        # time on the shaped link
        m0 = measured[None]
        bare_step = statistics.median(r["step_ms"] for r in bare)
        bare_model = 1000 * hooks.cost.projected_comm_seconds(
            hook_name, bare[-1]["stats"], steps, world_size, m0.measured_gbps,
            latency_s=m0.measured_latency_ms / 1000, **params)
        from_bare = bare_step - bare_model + model["goodput"]  # the old re-pricing: no overlap
        # the model: the unshaped step re-priced on the shaped link (hooks.cost.projected_step_from_measured):
        # allreduce's transport (its bytes at what an allreduce alone cost per byte unshaped,
        # _transport_probe) overlapping the shaped wire, the other kinds' unshaped time kept
        bare_window = statistics.median(r["comm_ms"] for r in bare)
        spb = transport["allreduce"]
        moved = hooks.cost.wire_bytes("allreduce", bare[-1]["stats"].get("allreduce_bytes", 0), world_size) / steps
        transport_ms = 1000 * max(moved * spb, hooks.cost.wire_seconds_by_kind(
            bare[-1]["stats"], steps, world_size, m0.measured_gbps, m0.measured_latency_ms / 1000)["allreduce"])
        overlap = 1000 * hooks.cost.projected_step_from_measured(
            bare_step / 1000, bare[-1]["stats"], steps, world_size, m0.measured_gbps, m0.measured_latency_ms / 1000,
            m.measured_gbps, m.measured_latency_ms / 1000, spb)
        rows.append({
            "hook": hook_name, "world_size": world_size, "link_gbps": link,
            "link_measured_gbps": m.measured_gbps, "latency_ms": m.measured_latency_ms,
            "step_ms": step, "comm_ms": comm, "compute_ms": compute,
            "model_comm_ms": model["goodput"], "model_comm_nominal_ms": model["nominal"],
            "projected_step_ms": projected,
            "step_error_pct": 100 * (projected - step) / step,
            "unshaped_step_ms": bare_step, "projected_from_unshaped_ms": from_bare,
            "from_unshaped_error_pct": 100 * (from_bare - step) / step,
            "unshaped_comm_ms": bare_window, "unshaped_transport_ms": transport_ms,
            "model_step_ms": overlap, "model_step_error_pct": 100 * (overlap - step) / step,
            "comm_error_pct": 100 * (model["goodput"] - comm) / comm if comm else float("nan"),
            "comm_error_nominal_pct": 100 * (model["nominal"] - comm) / comm if comm else float("nan"),
            "calls_per_step": stats.get("calls", 0) / steps,
            "wire_bytes_per_step": stats.get("wire_bytes", 0) / steps,
        })
    return rows


def _print_table(rows: list[dict], links: list[float]) -> None:
    headers = ["hook", "W", "Gbit/s", "step ms", "comm ms", "model comm ms", "comm err %",
               "compute + model ms (err %)", "unshaped step ms", "unshaped comm ms", "unshaped transport ms",
               "no-overlap ms (err %)", "model step ms", "model err %"]
    print(table(headers, [[r["hook"], r["world_size"], r["link_gbps"], round(r["step_ms"], 1),
                           round(r["comm_ms"], 1), round(r["model_comm_ms"], 1), round(r["comm_error_pct"], 1),
                           f"{r['projected_step_ms']:.1f} ({r['step_error_pct']:+.1f})",
                           round(r["unshaped_step_ms"], 1), round(r["unshaped_comm_ms"], 1),
                           round(r["unshaped_transport_ms"], 1),
                           f"{r['projected_from_unshaped_ms']:.1f} ({r['from_unshaped_error_pct']:+.1f})",
                           round(r["model_step_ms"], 1), round(r["model_step_error_pct"], 1)] for r in rows]))
    for link in links:
        def band(key):
            errs = [r[key] for r in rows if r["link_gbps"] == link]
            return f"{min(errs):+.1f}% .. {max(errs):+.1f}%"
        print(f"error band at {link:g} Gbit/s: model step {band('model_step_error_pct')}; for reference: "
              f"without overlap {band('from_unshaped_error_pct')}, compute + wire model (kernels at zero) "
              f"{band('step_error_pct')}, wire model vs comm window {band('comm_error_pct')}")


def _print_saved(path: str) -> int:
    import json

    saved = json.loads(open(path).read())
    measured = {None if k == "None" else float(k): link_measure.LinkMeasurement(**v) for k, v in saved["links"].items()}
    rows = [row for w, raw in saved["raw"].items() for row in summarise(raw, int(w), measured)]
    _print_table(rows, sorted({r["link_gbps"] for r in rows}))
    before, after = (saved.get(f"load_average_{when}", saved.get(f"load_{when}")) for when in ("before", "after"))
    print(f"(saved run: load average before {before}, after {after})")  # load_*: runs before 2026-12-01 15:10
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--links", type=float, nargs="+", default=[1.0, 2.5], help="Gbit/s per host")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3, help="steps not measured (DDP's bucket rebuild, PowerSGD's start)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per arm and repeat")
    parser.add_argument("--hooks", nargs="+", help="a subset of the hooks")
    parser.add_argument("--quick", action="store_true", help="W=2, 1 Gbit/s, allreduce/fp16/quantized_allreduce, 1 repeat")
    parser.add_argument("--out", help="JSON path (default bench/results/network.json)")
    parser.add_argument("--summarise", metavar="JSON", help="print the table of a saved run (its raw "
                        "measurements through the current model) instead of measuring")
    args = parser.parse_args(argv)
    if args.summarise:
        return _print_saved(args.summarise)
    hook_list = HOOKS
    if args.quick:
        args.world_sizes, args.links, args.repeats, args.steps = [2], [1.0], 1, 3
        hook_list = [h for h in HOOKS if h[0] in ("allreduce", "fp16_compress", "quantized_allreduce")]
    if args.hooks:
        hook_list = [h for h in HOOKS if h[0] in args.hooks]
    try:
        netem.preflight(min(args.links))
    except netem.NetemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    load_before = load_average()
    started = time.time()
    measured = {None: link_measure.measure(None)}  # the veth links unshaped: what the bare arm ran on
    print(f"unshaped: measured {measured[None].measured_gbps:.3f} Gbit/s, "
          f"{measured[None].measured_latency_ms:.3f} ms one way", flush=True)
    for link in args.links:
        measured[link] = link_measure.measure(link)
        print(f"link {link:g} Gbit/s: measured {measured[link].measured_gbps:.3f} Gbit/s, "
              f"{measured[link].measured_latency_ms:.3f} ms one way (load {load_average()})", flush=True)
    rows, raw_all = [], {}
    for w in args.world_sizes:
        raw = run_world(w, args.links, args.repeats, args.warmup, args.steps, hook_list)
        raw_all[w] = raw
        rows += summarise(raw, w, measured)
        print(f"W={w} done (load {load_average()})", flush=True)
    load_after = load_average()
    _print_table(rows, args.links)
    print(f"load average before {load_before}, after {load_after}; {time.time() - started:.0f} s")
    path = write_json("network", {"machine": machine(), "load_average_before": load_before,
                                  "load_average_after": load_after, "settings": vars(args),
                                  "links": {str(k): vars(v) for k, v in measured.items()}, "rows": rows,
                                  "raw": raw_all}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
