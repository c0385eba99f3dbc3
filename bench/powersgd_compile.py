"""PowerSGD compiled beside eager: is the loss gap the bucket layout or the hook's state?

    python bench/powersgd_compile.py            # char_lm, W = 2, 30 steps, powersgd and allreduce
    python bench/powersgd_compile.py --hooks powersgd --seeds 1  # seed 0 only: ~1 min less

A compiled trial runs DDP(torch.compile(module)) (service/train/compiled.py): DDP rebuilds its
buckets after its first step in the order the backward made gradients ready, and the compiled
backward (DDPOptimizer's pieces) hands them over in another order than eager's, so the rebuilt
buckets hold other parameters. PowerSGD (hooks/powersgd.py, torch's hook) keys its error memory
and its P and Q by bucket index and draws each bucket's first Q from one shared generator, so
other buckets mean other random projections. This bench tells that apart from a state bug.

Two gloo processes (torch.multiprocessing, no Ray) build char_lm as a trial does (seed 0, its
weights and batches: service.train.batches.GlobalBatches; the workload's default global batch
and lr for ``--optimizer``: sgd 0.5, a config's default, or adamw 0.003, tune_configs/compile.yaml's),
compile the module once with the service's own compile and warm-up (service/train/compiled.py)
and train it from the same weights, per hook and DDP setting, eager
(``torch.compiler.set_stance("force_eager")``) and compiled:

- ``rebuilt``: DDP as the service runs it (its bucket rebuild after step 1);
- ``same_buckets``: ``find_unused_parameters=True``, under which DDP never rebuilds: eager and
  compiled cut the gradient into the same buckets (the decisive check);
- ``one_bucket``: ``bucket_cap_mb=100``, the whole gradient one bucket, rebuilt after step 1 with
  its tensors in the order their gradients were ready;
- powersgd ``rebuilt`` again with PowerSGD's generator seeded 1, 2, ... (``--seeds``; torch seeds
  it 0), eager and compiled: how far the final loss moves over other legitimate random projections.

Per step it records the bucket indices the hook is called with (in call order), each bucket's
size and parameters, the mean loss over ranks, and per compressing call whether the hook's
state (error, P, Q) already held memory for that index, of the size its bucket needs. Prints each
run's bucket layouts (once, and again when they change), the per-step losses side by side, the
final losses with the compiled-over-eager gaps and the per-seed finals; writes
bench/results/powersgd_compile.json (the per-step records of every run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Rendezvous, join_group, load_average, machine, table, write_json  # noqa: E402

POWERSGD = {"rank": 2, "start_iter": 2}  # the sweep (error_feedback, warm_start: their defaults)
SETTINGS = {"rebuilt": {}, "same_buckets": {"find_unused_parameters": True},
            "one_bucket": {"bucket_cap_mb": 100}}
SEED = 0  # the trial's (weights, batches)


def _recording(hook, names: dict, steps: list):
    """The hook, appending to the current step's list (``steps[-1]``) one record per call: the
    bucket's index, size and parameter names, and (PowerSGD, compressing) whether its state held
    memory for that index before the call, and of which size."""
    def recorded(state, bucket):
        idx = bucket.index()
        rec = {"index": idx, "numel": bucket.buffer().numel(),
               "params": [names[id(p)] for p in bucket.parameters()]}
        ps = getattr(state, "powersgd", None)
        if ps is not None:
            rec["compressing"] = ps.iter >= ps.start_powerSGD_iter
            err = ps.error_dict.get(idx)
            rec["error_numel_before"] = None if err is None else err.numel()
            rec["q_before"] = idx in ps.q_memory_dict
        steps[-1].append(rec)
        return hook(state, bucket)
    return recorded


def _train(module, init, wl, wl_cfg, batches, hook_name: str, hook_params: dict, ddp_kwargs: dict,
           rng_seed: int = 0) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hooks
    from service.train.setup import make_optimizer

    with torch.no_grad():
        for p, v in zip(module.parameters(), init):
            p.copy_(v)
    ddp = DDP(module, **ddp_kwargs)
    state, hook = hooks.build(hook_name, **hook_params)
    if hook_name == "powersgd":
        state.powersgd.rng = np.random.RandomState(rng_seed)  # torch's PowerSGDState: random_seed=0
    names = {id(p): n for n, p in module.named_parameters()}
    calls: list[list[dict]] = []
    ddp.register_comm_hook(state, _recording(hook, names, calls))
    opt = make_optimizer(wl_cfg, module.parameters())
    losses = []
    world = dist.get_world_size()
    for step in range(1, wl_cfg.steps + 1):
        calls.append([])
        batch = wl.fetch(wl.train_set, batches.micro_batches(step)[0])
        opt.zero_grad(set_to_none=True)
        loss = wl.step_loss(ddp, batch)
        loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        opt.step()
    return {"loss": losses, "calls": calls, "bytes": state.stats()["wire_bytes"]}


def plan(settings: dict) -> list[dict]:
    """The runs, in order: per hook and DDP setting eager then compiled (PowerSGD's generator
    seeded 0, torch's), then powersgd rebuilt eager and compiled with seeds 1, 2, ..."""
    runs = [{"hook": h, "setting": s, "arm": a, "seed": 0}
            for h in settings["hooks"] for s in SETTINGS for a in ("eager", "compiled")]
    if "powersgd" in settings["hooks"]:
        runs += [{"hook": "powersgd", "setting": "rebuilt", "arm": a, "seed": seed}
                 for seed in range(1, settings["seeds"]) for a in ("eager", "compiled")]
    return runs


def _worker(rank: int, port: int, settings: dict, out: str) -> None:
    import torch
    import torch.distributed as dist

    from service.config.workload import WorkloadConfig
    from service.train.batches import GlobalBatches
    from service.train.compiled import compile_module, warm_up
    from service.train.training_options import Precision
    from service.workloads import build_workload

    torch.set_num_threads(1)
    join_group(port, rank, 2)
    wl_cfg = WorkloadConfig.model_validate(settings["workload"])
    torch.manual_seed(SEED)  # as a trial's set_up
    wl = build_workload(wl_cfg.name, SEED)
    module = wl.model
    init = [p.detach().clone() for p in module.parameters()]
    batches = GlobalBatches(len(wl.train_set), wl_cfg.global_batch_size, SEED, rank, 2, 1)
    compile_module(module, "default")  # the service's compilation and warm-up, once for every run
    warm_up(module, {}, wl, batches.micro_batches(1)[0], Precision("fp32", "cpu"))
    runs = []
    for spec in plan(settings):
        params = POWERSGD if spec["hook"] == "powersgd" else {}
        dist.barrier()
        with torch.compiler.set_stance("force_eager" if spec["arm"] == "eager" else "default"):
            run = _train(module, init, wl, wl_cfg, batches, spec["hook"], params, SETTINGS[spec["setting"]],
                         spec["seed"])
        runs.append({**spec, **run})
        if rank == 0:
            print(f"{spec['hook']:9s} {spec['setting']:12s} {spec['arm']:8s} PowerSGD seed {spec['seed']}: "
                  f"final loss {run['loss'][-1]:.4f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(runs))


def layouts(calls: list[list[dict]]) -> list[tuple[int, list[dict]]]:
    """(first step, buckets by index) each time the bucket layout changes."""
    seen, out = None, []
    for step, recs in enumerate(calls, start=1):
        layout = sorted(({"index": r["index"], "numel": r["numel"], "params": r["params"]} for r in recs),
                        key=lambda b: b["index"])
        if layout != seen:
            out.append((step, layout))
            seen = layout
    return out


def state_mismatches(calls: list[list[dict]]) -> list[str]:
    """Compressing calls whose index had PowerSGD memory of another size than its bucket (state
    kept for another bucket), or whose memory vanished after it was made: a state bug's marks."""
    bad, made = [], set()
    for step, recs in enumerate(calls, start=1):
        for r in recs:
            if not r.get("compressing"):
                continue
            if r["error_numel_before"] is not None and r["error_numel_before"] != r["numel"]:
                bad.append(f"step {step} bucket {r['index']}: error memory of {r['error_numel_before']} for {r['numel']}")
            if r["index"] in made and not r["q_before"]:
                bad.append(f"step {step} bucket {r['index']}: its Q was dropped")
            made.add(r["index"])
    return bad


def _short(params: list[str]) -> str:
    return ", ".join(params) if len(params) <= 6 else ", ".join(params[:3] + ["..."] + params[-2:])


def _gap(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.2f} %"


def report(runs: list[dict]) -> dict:
    """Prints the layouts, the per-step losses, the final losses; returns the JSON's summary."""
    by = {(r["hook"], r["setting"], r["arm"], r["seed"]): r for r in runs}
    summary = {"state_mismatches": [f"{r['hook']} {r['setting']} {r['arm']} seed {r['seed']}: {m}"
                                    for r in runs for m in state_mismatches(r["calls"])]}
    for r in runs:
        if r["seed"] != 0:
            continue
        orders = sorted({tuple(c["index"] for c in recs) for recs in r["calls"]})
        print(f"\n{r['hook']} {r['setting']} {r['arm']}: the hook's bucket indices per step, in call order: {orders}")
        for step, layout in layouts(r["calls"]):
            print(f"  from step {step}:")
            for b in layout:
                print(f"    bucket {b['index']}: {b['numel']:7d} values, {len(b['params']):2d} tensors: "
                      f"{_short(b['params'])}")
    print("\nPowerSGD's state: " + ("; ".join(summary["state_mismatches"]) or
                                   "every compressing call found its own bucket's memory (error, P, Q), "
                                   "of its bucket's size, in every run"))
    seed0 = [k for k in by if k[3] == 0]
    print("\nper-step loss (mean over ranks), PowerSGD's generator seeded 0")
    print(table(["step"] + [f"{h[:4]} {s} {a[0]}" for h, s, a, _ in seed0],
                [[i + 1] + [f'{by[k]["loss"][i]:.4f}' for k in seed0] for i in range(len(runs[0]["loss"]))]))
    rows = []
    for (hook, setting, arm, seed), r in by.items():
        if arm != "compiled" or seed != 0:
            continue
        e = by[hook, setting, "eager", 0]
        same = [lay for _, lay in layouts(e["calls"])] == [lay for _, lay in layouts(r["calls"])]
        worst = max(abs(c / x - 1) for c, x in zip(r["loss"], e["loss"]))
        rows.append([hook, setting, "yes" if same else "no", f'{e["loss"][-1]:.4f}', f'{r["loss"][-1]:.4f}',
                     _gap(r["loss"][-1], e["loss"][-1]), f"{100 * worst:.3f} %", "yes" if e["bytes"] == r["bytes"] else "no"])
        summary[f"{hook}.{setting}"] = {"same_layouts": same, "eager_final": e["loss"][-1], "compiled_final": r["loss"][-1],
                                        "final_gap": r["loss"][-1] / e["loss"][-1] - 1, "max_step_gap": worst,
                                        "same_bytes": e["bytes"] == r["bytes"]}
    print("\nfinal losses, eager and compiled (PowerSGD's generator seeded 0)")
    print(table(["hook", "DDP", "same buckets", "eager final", "compiled final", "final gap", "max step gap",
                 "same bytes"], rows))
    seeds = sorted({k[3] for k in by if k[0] == "powersgd" and k[1] == "rebuilt"})
    if len(seeds) > 1:
        finals = {arm: [by["powersgd", "rebuilt", arm, s]["loss"][-1] for s in seeds] for arm in ("eager", "compiled")}
        print("\npowersgd, DDP's buckets rebuilt: final loss per seed of PowerSGD's generator (its random projections)")
        print(table(["seed", "eager final", "compiled final", "compiled vs eager"],
                    [[s, f"{e:.4f}", f"{c:.4f}", _gap(c, e)] for s, e, c in zip(seeds, finals["eager"], finals["compiled"])]))
        stats = {arm: {"mean": statistics.fmean(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
                 for arm, v in finals.items()}
        print(table(["over the seeds", "mean", "median", "min", "max"],
                    [[arm, *(f"{v:.4f}" for v in stats[arm].values())] for arm in ("eager", "compiled")]))
        higher = sum(c > e for e, c in zip(finals["eager"], finals["compiled"]))
        print(f"compiled ended higher than eager for {higher} of {len(seeds)} seeds")
        summary["powersgd.rebuilt.seeds"] = {"seeds": seeds, **{f"{a}_final": v for a, v in finals.items()},
                                             **{f"{a}_stats": v for a, v in stats.items()}, "compiled_higher": higher}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    parser.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                        help="the workload's optimizer (default sgd, a config's default), at char_lm's lr for it "
                             "(sgd 0.5, adamw 0.003) and global batch size")
    parser.add_argument("--hooks", nargs="+", default=["powersgd", "allreduce"], choices=["powersgd", "allreduce"],
                        help="hooks to run (allreduce: how close eager and compiled are without compression)")
    parser.add_argument("--seeds", type=int, default=16,
                        help="seeds 0..N-1 of PowerSGD's generator, eager and compiled, DDP's buckets rebuilt "
                             "(the spread over legitimate random projections; default 16)")
    parser.add_argument("--out", help="JSON path (default bench/results/powersgd_compile.json)")
    args = parser.parse_args(argv)
    settings = {"steps": args.steps, "hooks": args.hooks, "seeds": max(args.seeds, 1), "world_size": 2,
                "workload": {"name": "char_lm", "steps": args.steps, "optimizer": args.optimizer, "warmup_steps": 0},
                "powersgd": POWERSGD, "ddp": SETTINGS}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch.multiprocessing as mp

    load_before = load_average()
    out = Path(tempfile.mkdtemp(prefix="bench-powersgd-compile-")) / "runs.json"
    meet = Rendezvous(2)
    mp.spawn(_worker, args=(meet.port, settings, str(out)), nprocs=2, join=True)
    runs = json.loads(out.read_text())
    summary = report(runs)
    load_after = load_average()
    path = write_json("powersgd_compile", {"settings": settings, "machine": machine(), "load_average_before": load_before,
                                           "load_average_after": load_after, "summary": summary, "runs": runs}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
