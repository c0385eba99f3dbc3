"""Compiled beside eager: what torch.compile of a trial's DDP model costs and changes, per hook.

    python bench/compile.py          # char_lm and cnn_digits, W = 2, 3 hooks x 2 arms, 2 rounds
    python bench/compile.py --quick  # cnn_digits, 2 hooks, 8 steps, 1 round (smoke test)

Two gloo processes (torch.multiprocessing, no Ray) run ``service.train.run_training`` for every
(workload, hook) eager and compiled (``search.compile``: service/train/compiled.py), the arms'
order reversed every other round so both see the same machine; no paired windows and no step
timeline in either arm (the same measurement load). Inductor's cache goes to a fresh folder, so
each workload's first compiled run compiles cold (a sweep's first compiled trial) and the later
ones warm (its later trials: dynamo's in-process cache is reset before each, as in a fresh trial
process). Per run:

- ``compile_s``: the trial's compilation phase (compile + the warm-up forward/backward);
- step ms: the median after the warm-up steps, and steps 1 and 2 (what compilation left behind);
- per bucket, how much of its communication the backward still hides: on every step past the
  warm-up the hook's state stamps each bucket (hooks/step_sampling.py's StepRecorder): its
  communication runs from its first collective's launch to its completion, and the fraction of
  it before the backward's end (the last hook call's return: the step model's definition,
  service/step_model/stamps.py) is hidden; medians over steps.

Prints the table docs/performance.md quotes and writes bench/results/compile.json with the load
average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Rendezvous, join_group, load_average, machine, median, table, write_json  # noqa: E402

WORKLOADS = ("char_lm", "cnn_digits")
HOOKS = ("allreduce", "fp16_compress", "quantization_perchannel")
ARMS = ("eager", "compiled")


def bench_config(workload: str, hook: str, compiled: bool, steps: int, warmup: int) -> dict:
    return {"name": "bench-compile",
            "workload": {"name": workload, "steps": steps, "global_batch_size": 64, "eval_every": steps,
                         "warmup_steps": warmup},
            "search": {"hooks": [hook], "world_size": [2], "seed": [0], "compile": compiled},
            "tracking": {"paired_timing_every": 0, "timeline_steps": 0}}


def _stamping(recorders: list):
    """build_hook whose hook puts a fresh StepRecorder in its state at each step's first bucket
    (DDP calls bucket 0 first): every step's hook calls stamped (hooks/step_sampling.py)."""
    import hooks
    from hooks.step_sampling import StepRecorder

    def build(name, process_group=None, **params):
        state, hook = hooks.build(name, process_group=process_group, **params)

        def stamped(st, bucket):
            if bucket.index() == 0:
                recorders.append(StepRecorder())
                st.sampling = recorders[-1]
            return hook(st, bucket)
        return state, stamped
    return build


def _launched(call) -> float:
    return call.launched if call.launched is not None else call.returned


def hidden_fractions(calls) -> list[float]:
    """Per bucket of one step's stamped calls: the fraction of its communication (its first
    collective's launch to its completion, queueing behind the bucket before included) that
    ends before the backward does (the last hook call's return)."""
    end = max(c.returned for c in calls)
    return [min(max(end - _launched(c), 0.0), c.completed - _launched(c)) / (c.completed - _launched(c))
            if c.completed > _launched(c) else 1.0 for c in calls]


def _comm_ms(calls) -> list[float]:
    return [1000.0 * max(c.completed - _launched(c), 0.0) for c in calls]


def _one_run(rank: int, workload: str, hook: str, arm: str, steps: int, warmup: int) -> dict:
    import torch._dynamo

    from service.config import SweepConfig
    from service.train import StepMeter, TrainingContext, run_training

    cfg = SweepConfig.model_validate(bench_config(workload, hook, arm == "compiled", steps, warmup))
    recorders, meters = [], []
    torch._dynamo.reset()  # a fresh trial process: nothing compiled in it yet (inductor's disk cache stays)
    ctx = TrainingContext(rank=rank, world_size=2, device="cpu", build_hook=_stamping(recorders),
                          make_meter=lambda w, first: meters.append(StepMeter(w, first)) or meters[-1])
    result = run_training(cfg.trials()[0], cfg, ctx)
    measured = [r.calls for r in recorders[warmup:] if r.calls and all(c.completed for c in r.calls)]
    buckets = max((len(c) for c in measured), default=0)
    times = meters[0].times_ms
    s = result.summary
    return {"workload": workload, "hook": hook, "arm": arm, "compile_s": s.get("compile_s"),
            "step_ms": s["step_time_ms_median"], "step1_ms": times.get(1), "step2_ms": times.get(2),
            "bytes_per_step": s["comm_bytes_per_step"], "final_loss": s["final_loss"], "buckets": buckets,
            "hidden": [median(hidden_fractions(c)[i] for c in measured if len(c) == buckets) for i in range(buckets)],
            "comm_ms": [median(_comm_ms(c)[i] for c in measured if len(c) == buckets) for i in range(buckets)],
            "load_1m": load_average()[:1]}


def _worker(rank: int, port: int, settings: dict, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    join_group(port, rank, 2)
    runs = []
    for r in range(settings["rounds"]):
        for workload in settings["workloads"]:
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                for hook in settings["hooks"]:
                    dist.barrier()
                    run = {"round": r + 1, **_one_run(rank, workload, hook, arm, settings["steps"], settings["warmup"])}
                    runs.append(run)
                    if rank == 0:
                        print(f"round {r + 1} {workload:10s} {hook:24s} {arm:8s}: step {run['step_ms']:.1f} ms, "
                              f"compile {run['compile_s'] or 0:.1f} s, hidden {[round(h, 2) for h in run['hidden']]}",
                              flush=True)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(runs))


def summarise(runs: list[dict], settings: dict) -> list[dict]:
    """Per (workload, hook): each arm's medians over rounds, the compiled step over the eager one,
    the cold compile (the workload's first compiled run) and the warm ones."""
    rows = []
    for workload in settings["workloads"]:
        compiled_runs = [x for x in runs if x["workload"] == workload and x["arm"] == "compiled"]
        cold = compiled_runs[0] if compiled_runs else None
        for hook in settings["hooks"]:
            arm = {a: [x for x in runs if (x["workload"], x["hook"], x["arm"]) == (workload, hook, a)] for a in ARMS}
            row = {"workload": workload, "hook": hook}
            for a, xs in arm.items():
                row[f"{a}_step_ms"] = median(x["step_ms"] for x in xs)
                row[f"{a}_step1_ms"] = median(x["step1_ms"] for x in xs)
                row[f"{a}_hidden"] = [median(x["hidden"][i] for x in xs) for i in range(min(len(x["hidden"]) for x in xs))]
                row[f"{a}_comm_ms"] = [median(x["comm_ms"][i] for x in xs) for i in range(min(len(x["comm_ms"]) for x in xs))]
                row[f"{a}_bytes_per_step"] = median(x["bytes_per_step"] for x in xs)
            row["compiled_over_eager"] = row["compiled_step_ms"] / row["eager_step_ms"]
            row["compile_s_cold"] = cold["compile_s"] if cold is not None and cold["hook"] == hook else None
            warm = [x["compile_s"] for x in arm["compiled"] if x is not cold]
            row["compile_s_warm"] = median(warm) if warm else None
            rows.append(row)
    return rows


def _print(rows: list[dict]) -> None:
    pct = lambda xs: " / ".join(f"{100 * h:.0f}" for h in xs)  # noqa: E731
    print(table(["workload", "hook", "compile s cold", "compile s warm", "eager step ms", "compiled step ms",
                 "compiled/eager", "step 1 ms eager", "step 1 ms compiled", "hidden % per bucket eager",
                 "hidden % compiled", "comm ms eager", "comm ms compiled"],
                [[r["workload"], r["hook"], r["compile_s_cold"], r["compile_s_warm"], r["eager_step_ms"],
                  r["compiled_step_ms"], r["compiled_over_eager"], r["eager_step1_ms"], r["compiled_step1_ms"],
                  pct(r["eager_hidden"]), pct(r["compiled_hidden"]),
                  " / ".join(f"{c:.1f}" for c in r["eager_comm_ms"]),
                  " / ".join(f"{c:.1f}" for c in r["compiled_comm_ms"])] for r in rows]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="cnn_digits, allreduce and fp16_compress, 8 steps, 1 round")
    parser.add_argument("--out", help="JSON path (default bench/results/compile.json)")
    args = parser.parse_args(argv)
    settings = {"workloads": list(WORKLOADS), "hooks": list(HOOKS), "steps": args.steps, "warmup": args.warmup,
                "rounds": args.rounds, "world_size": 2}
    if args.quick:
        settings.update(workloads=["cnn_digits"], hooks=["allreduce", "fp16_compress"], steps=8, warmup=2, rounds=1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-compile-inductor-")  # cold first compile
    import torch.multiprocessing as mp

    load_before = load_average()
    out = Path(tempfile.mkdtemp(prefix="bench-compile-")) / "runs.json"
    meet = Rendezvous(2)
    mp.spawn(_worker, args=(meet.port, settings, str(out)), nprocs=2, join=True)
    runs = json.loads(out.read_text())
    rows = summarise(runs, settings)
    load_after = load_average()
    print()
    _print(rows)
    print(f"\nload average before {load_before}, after {load_after}")
    path = write_json("compile", {"settings": settings, "machine": machine(), "load_average_before": load_before,
                                  "load_average_after": load_after, "summary": rows, "runs": runs}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
