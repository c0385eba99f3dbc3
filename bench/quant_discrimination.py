"""Which workload tells the quantizers apart? Final eval loss per hook per seed, side by side.

    .venv/bin/python bench/quant_discrimination.py                        # the defaults below
    .venv/bin/python bench/quant_discrimination.py --workload char_lm --optimizer adamw \
        --lr 0.003 --steps 200 --batch 64 --world-sizes 2 --seeds 0 1 \
        --hooks allreduce bf16_compress quantization_pertensor quantization_perchannel:512

Runs ``service.train.run_training`` (the service's own training loop, no Ray) in a real gloo
group of each ``--world-sizes`` ranks (spawned processes, one thread each). For every seed the
hooks run one after the other (seed-major, so the hooks alternate in time and the machine's
load falls on all of them alike), with the same seed, data order and steps. A hook is
``name`` or ``name:chunk_size``. Prints, per world size, final eval loss per hook per seed, each
hook's mean and seed-to-seed spread (max − min), its gap to ``allreduce`` per seed (paired: the
same seed), and the training wall time of one run (what a sweep trial spends in its loop, Ray's
start-up not included); writes bench/results/quant_discrimination.json. The figures and their
reading: docs/hooks.md, "Which workload tells the quantizers apart".
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import load_average, machine, write_json  # also puts the repository root on sys.path


def _parse_hook(spec: str) -> tuple[str, dict]:
    name, _, chunk = spec.partition(":")
    return name, ({"chunk_size": int(chunk)} if chunk else {})


def _label(spec: str) -> str:
    name, params = _parse_hook(spec)
    return name + (f" c{params['chunk_size']}" if params else "")


def _cfg(args, spec: str, seed: int, world_size: int):
    from service.config import SweepConfig

    hook, params = _parse_hook(spec)
    return SweepConfig.model_validate({
        "name": "bench-quant-discrimination",
        "workload": {"name": args.workload, "steps": args.steps, "global_batch_size": args.batch,
                     "lr": args.lr, "optimizer": args.optimizer,
                     "eval_every": args.eval_every or args.steps,
                     "warmup_steps": min(5, args.steps - 1)},
        "search": {"hooks": [{"name": hook, **{k: [v] for k, v in params.items()}}],
                   "world_size": [world_size], "seed": [seed]},
    })


def _rank(rank: int, world_size: int, args) -> list[dict]:
    from service.train import TrainingContext, run_training

    out = []
    for seed in args.seeds:
        for spec in args.hooks:
            cfg = _cfg(args, spec, seed, world_size)
            t0 = time.perf_counter()
            result = run_training(cfg.trials()[0], cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
            s = result.summary
            out.append({"hook": spec, "seed": seed, "world_size": world_size, "status": result.status,
                        "final_eval_loss": s.get("final_eval_loss"),
                        "final_eval_accuracy": s.get("final_eval_accuracy"),
                        "step_time_ms_median": s.get("step_time_ms_median"),
                        "seconds": time.perf_counter() - t0, "load_average": load_average()})
            if rank == 0:
                r = out[-1]
                print(f"  W={world_size} {_label(spec)} seed {seed}: {r['status']} eval loss "
                      f"{r['final_eval_loss']} ({r['seconds']:.0f} s, load {r['load_average']})", flush=True)
    return out


def _table(rows: list[dict], args, world_size: int) -> None:
    def loss(spec, seed):
        for r in rows:
            if r["hook"] == spec and r["seed"] == seed and r["status"] == "ok":
                return r["final_eval_loss"]
        return None

    fmt = lambda v, sign="": f"{v:{sign}.4f}" if v is not None else "nan"  # noqa: E731
    print(f"\n{args.workload}, {args.optimizer} lr {args.lr}, {args.steps} steps, global batch "
          f"{args.batch}, world size {world_size}: final eval loss")
    seeds = " ".join(f"{'seed ' + str(s):>9}" for s in args.seeds)
    gaps = " ".join(f"{'gap s' + str(s):>9}" for s in args.seeds)
    print(f"{'hook':<30} {seeds} {'mean':>8} {'spread':>8} {gaps} {'train s':>8}")
    for spec in args.hooks:
        vals = [loss(spec, s) for s in args.seeds]
        ok = [v for v in vals if v is not None]
        ref = [loss("allreduce", s) for s in args.seeds]
        gap = [v - r if v is not None and r is not None else None for v, r in zip(vals, ref)]
        secs = [r["seconds"] for r in rows if r["hook"] == spec]
        mean = statistics.fmean(ok) if ok else None
        spread = max(ok) - min(ok) if len(ok) > 1 else None
        print(f"{_label(spec):<30} {' '.join(f'{fmt(v):>9}' for v in vals)} {fmt(mean):>8} "
              f"{fmt(spread):>8} {' '.join(f'{fmt(g, chr(43)):>9}' for g in gap)} "
              f"{statistics.median(secs) if secs else float('nan'):>8.0f}")
    print("spread = max - min over seeds; gap = hook - allreduce at the same seed (positive: worse); "
          "train s = wall seconds of one run's loop incl. evals (median over seeds)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="char_lm", help="mlp_digits | cnn_digits | char_lm")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64, help="global batch size (samples per step)")
    p.add_argument("--eval-every", type=int, default=0, help="steps between evals (0: only at the end)")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--hooks", nargs="+", default=["allreduce", "bf16_compress", "quantization_pertensor",
                                                  "quantization_perchannel:512"],
                   help="name or name:chunk_size; allreduce is the gap's reference")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/quant_discrimination.json)")
    p.add_argument("--quick", action="store_true", help="4 steps, seed 0, batch 16: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.steps, args.seeds, args.batch = 4, [0], 16

    from tests.dist_utils import run_distributed

    load_before = load_average()
    rows: list[dict] = []
    for w in args.world_sizes:
        rows += run_distributed(_rank, w, args=(args,), timeout_s=7200)[0]
    load_after = load_average()
    for w in args.world_sizes:
        _table([r for r in rows if r["world_size"] == w], args, w)
    print(f"load average (1/5/15 min) before {load_before}, after {load_after}")
    path = write_json("quant_discrimination", {"settings": vars(args), "rows": rows,
                                               "load_average_before": load_before,
                                               "load_average_after": load_after, "machine": machine()},
                      out=args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
