"""Does error feedback lower final loss? The same hook with error_feedback off and on, per seed.

    .venv/bin/python bench/error_feedback.py                                  # the defaults below
    .venv/bin/python bench/error_feedback.py --optimizer sgd --lr 0.5 --seeds 0 1 --steps 300
    .venv/bin/python bench/error_feedback.py --hooks topk:ratio=0.01 signsgd --optimizer sgd --lr 0.5
    .venv/bin/python bench/error_feedback.py --workload mlp_digits --batch 256 --lr 0.05 --optimizer sgd \
        --hooks topk:ratio=0.01 signsgd

``--hooks`` compares several hooks (``name`` or ``name:param=value,param=value``) in one run,
each off and on, against one ``allreduce`` per seed; without it, ``--hook`` (one hook).

Runs ``service.train.run_training`` (the service's own training loop, no Ray) on the char_lm
workload in a real gloo group of ``--world-size`` ranks (spawned processes; one thread each):
for every seed the hook without feedback, the hook with it, and ``allreduce`` as the exact
reference, the same seed, data order and steps. Prints final eval loss per seed, the paired
difference (feedback − none; negative = feedback helped) and the per-step gradient error
(``grad_rel_error_mean``, sampled every ``--fidelity-every`` steps), and writes
bench/results/error_feedback.json. Figures and their reading: docs/hooks.md, "Error feedback".
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import load_average, machine, write_json  # also puts the repository root on sys.path


def _cfg(args, hook: str, params: dict, seed: int):
    from service.config import SweepConfig

    return SweepConfig.model_validate({
        "name": "bench-error-feedback",
        "workload": {"name": args.workload, "steps": args.steps, "global_batch_size": args.batch,
                     "lr": args.lr, "optimizer": args.optimizer, "eval_every": args.steps,
                     "warmup_steps": 1},
        "search": {"hooks": [{"name": hook, **{k: [v] for k, v in params.items()}}],
                   "world_size": [args.world_size], "seed": [seed]},
        "tracking": {"fidelity_every": args.fidelity_every},
    })


def _value(text: str):
    """A --hooks parameter value: true/false, an int, a float, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_hook(spec: str) -> tuple[str, dict]:
    """``"topk:ratio=0.01"`` -> ``("topk", {"ratio": 0.01})``."""
    name, _, rest = spec.partition(":")
    params = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--hooks {spec!r}: expected param=value, got {item!r}")
        params[key] = _value(value)
    return name, params


def _hook_list(args) -> list[tuple[str, dict]]:
    if args.hooks:
        return [parse_hook(h) for h in args.hooks]
    return [(args.hook, {} if args.chunk_size is None else {"chunk_size": args.chunk_size})]


def _jobs(args) -> list[tuple[str, dict, int]]:
    jobs = []
    for seed in args.seeds:
        for hook, params in _hook_list(args):
            jobs += [(hook, {**params, "error_feedback": False}, seed),
                     (hook, {**params, "error_feedback": True}, seed)]
        if not args.no_reference:
            jobs.append(("allreduce", {}, seed))
    return jobs


def _rank(rank: int, world_size: int, args) -> list[dict]:
    from service.train import TrainingContext, run_training

    out = []
    for hook, params, seed in _jobs(args):
        cfg = _cfg(args, hook, params, seed)
        t0 = time.perf_counter()
        result = run_training(cfg.trials()[0], cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
        s = result.summary
        out.append({"hook": hook, "params": params, "seed": seed, "status": result.status, "workload": args.workload,
                    "final_eval_loss": s.get("final_eval_loss"), "final_loss": s.get("final_loss"),
                    "grad_rel_error_mean": s.get("grad_rel_error_mean"),
                    "grad_cosine_mean": s.get("grad_cosine_mean"),
                    "seconds": time.perf_counter() - t0})
        if rank == 0:
            r = out[-1]
            print(f"  {hook} {params} seed {seed}: {r['status']} eval loss {r['final_eval_loss']} "
                  f"({r['seconds']:.0f} s)", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hook", default="quantization_pertensor")
    p.add_argument("--hooks", nargs="+", default=None, metavar="NAME[:PARAM=VALUE,...]",
                   help="several hooks, each off and on (overrides --hook), e.g. topk:ratio=0.01 signsgd")
    p.add_argument("--chunk-size", type=int, default=None, help="for the chunked hooks")
    p.add_argument("--workload", default="char_lm")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64, help="global batch size")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--fidelity-every", type=int, default=50)
    p.add_argument("--no-reference", action="store_true", help="skip the allreduce runs")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/error_feedback.json)")
    p.add_argument("--quick", action="store_true", help="4 steps, seed 0, batch 16: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.steps, args.seeds, args.batch, args.fidelity_every = 4, [0], 16, 2

    from tests.dist_utils import run_distributed

    load_before = load_average()
    rows = run_distributed(_rank, args.world_size, args=(args,), timeout_s=7200)[0]
    load_after = load_average()

    def loss(hook, params, ef, seed):
        for r in rows:
            if r["hook"] == hook and r["seed"] == seed and (
                    ef is None or r["params"] == {**params, "error_feedback": ef}):
                return r["final_eval_loss"]
        return None

    fmt = lambda v: f"{v:.4f}" if v is not None else "nan/none"  # noqa: E731
    summary = []
    for hook, params in _hook_list(args):
        label = hook + "".join(f" {k}={v}" for k, v in params.items())
        print(f"\n{label} on {args.workload}, {args.optimizer} lr {args.lr}, {args.steps} steps, "
              f"batch {args.batch}, world size {args.world_size}: final eval loss")
        print(f"{'seed':>4} {'no feedback':>12} {'feedback':>9} {'fb - none':>10} {'allreduce':>10}")
        diffs = []
        for seed in args.seeds:
            off, on = loss(hook, params, False, seed), loss(hook, params, True, seed)
            ref = loss("allreduce", {}, None, seed)
            d = on - off if on is not None and off is not None else None
            if d is not None:
                diffs.append(d)
            summary.append({"hook": hook, "params": params, "seed": seed, "no_feedback": off, "feedback": on,
                            "allreduce": ref})
            print(f"{seed:>4} {fmt(off):>12} {fmt(on):>9} {fmt(d):>10} {fmt(ref):>10}")
        if diffs:
            print(f"mean difference {statistics.fmean(diffs):+.4f} over {len(diffs)} seed(s)")
    print(f"load average before {' '.join(f'{v:.2f}' for v in load_before)}, "
          f"after {' '.join(f'{v:.2f}' for v in load_after)}")
    path = write_json("error_feedback", {"settings": vars(args), "rows": rows, "summary": summary,
                                         "load_average_before": load_before,
                                         "load_average_after": load_after, "machine": machine()}, out=args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
