"""Paired timing's order effect: does the arm that runs second in a window look faster?

    python bench/paired_order.py          # char_lm, world size 2, 150 steps, 4 rounds of 3 arms
    python bench/paired_order.py --quick  # 8 steps, 1 round (smoke test)

Two gloo processes (torch.multiprocessing, no Ray) run ``service.train.run_training`` with a paired
window on every measured step (``tracking.paired_timing_every: 1``; the trial's first, third, ...
window runs the baseline's forward/backward before the trial's own, the others after its step:
service/train/paired_timing.py) and no step timeline, one run per arm, the arms' order reversed
every other round so that all see the same machine:

- ``aa``: the trial's own hook *is* allreduce (a trial named fp16_compress, allreduce built under
  it) against the baseline's allreduce: but for noise and order every ratio is 1, so
  ``paired_order_effect`` (the after-windows' median ratio over the before-windows') is the
  order effect alone;
- ``fp16_compress`` and ``quantization_pertensor``: hooks that differ from the baseline.

Per arm, the median over rounds of: the before-windows' and after-windows' median ratios, their
quotient (the order effect: > 1, the arm that runs second looks faster), the ratio over all
windows (``step_ratio_vs_baseline``, what the report uses), and the forward/backward times; the
load average before and after the run.
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

ARMS = {"aa": "fp16_compress", "fp16_compress": "fp16_compress", "quantization_pertensor": "quantization_pertensor"}
KEYS = ("paired_ratio_before", "paired_ratio_after", "paired_order_effect", "step_ratio_vs_baseline",
        "own_fb_ms", "baseline_fb_ms", "step_time_ms_median", "paired_windows")


def bench_config(hook: str, steps: int, warmup: int) -> dict:
    return {
        "name": "bench-paired-order",
        "workload": {"name": "char_lm", "steps": steps, "global_batch_size": 32, "lr": 0.001,
                     "optimizer": "adamw", "eval_every": steps, "warmup_steps": warmup},
        "search": {"hooks": [hook], "world_size": [2], "seed": [0]},
        "tracking": {"paired_timing_every": 1, "timeline_steps": 0},
    }


def _allreduce_under_any_name(name, process_group=None, **params):
    """The aa arm: the trial's own hook is the baseline's (allreduce) whatever its trial is named."""
    import hooks

    return hooks.build(hooks.BASELINE, process_group=process_group)


def _worker(rank: int, port: int, steps: int, warmup: int, rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    import hooks
    from service.config import SweepConfig
    from service.train import run_training
    from service.train.context import TrainingContext

    torch.set_num_threads(1)
    join_group(port, rank, 2)
    results = []
    for r in range(rounds):
        for arm in (list(ARMS) if r % 2 == 0 else list(ARMS)[::-1]):
            cfg = SweepConfig.model_validate(bench_config(ARMS[arm], steps, warmup))
            build = _allreduce_under_any_name if arm == "aa" else hooks.build
            dist.barrier()
            ctx = TrainingContext(rank=rank, world_size=2, device="cpu", build_hook=build)
            result = run_training(cfg.trials()[0], cfg, ctx)
            row = {"arm": arm, "round": r + 1, "load_1m": load_average()[:1],
                   **{k: result.summary.get(k, float("nan")) for k in KEYS}}
            results.append(row)
            if rank == 0:
                print(f"round {r + 1} {arm:24s}: ratio before {row['paired_ratio_before']:.3f}, "
                      f"after {row['paired_ratio_after']:.3f}, order effect {row['paired_order_effect']:.3f}",
                      flush=True)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="8 steps, 1 round")
    parser.add_argument("--out", help="JSON path (default bench/results/paired_order.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.rounds = 8, 2, 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.multiprocessing as mp

    load_before = load_average()
    out = Path(tempfile.mkdtemp(prefix="bench-paired-order-")) / "results.json"
    meet = Rendezvous(2)
    mp.spawn(_worker, args=(meet.port, args.steps, args.warmup, args.rounds, str(out)), nprocs=2, join=True)
    runs = json.loads(out.read_text())
    summary = {arm: {k: median(x[k] for x in runs if x["arm"] == arm) for k in KEYS} for arm in ARMS}
    load_after = load_average()
    print()
    print(table(["arm", "ratio, before-windows", "ratio, after-windows", "order effect (after/before)",
                 "ratio, all windows", "own fb ms", "baseline fb ms", "step ms"],
                [[arm] + [s[k] for k in KEYS[:-1]] for arm, s in summary.items()]))
    print(f"\norder effect of the A/A arm (allreduce against itself): {summary['aa']['paired_order_effect']:.3f} "
          f"(median of {args.rounds} rounds, {int(summary['aa']['paired_windows'])} windows a run); "
          f"load average before {load_before}, after {load_after}")
    path = write_json("paired_order", {
        "settings": {"workload": "char_lm", "world_size": 2, "steps": args.steps, "warmup": args.warmup,
                     "rounds": args.rounds, "paired_timing_every": 1},
        "machine": machine(), "load_average_before": load_before, "load_average_after": load_after,
        "summary": summary, "runs": runs,
    }, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
