"""Step time of every built-in workload at world size 1 and 2, side by side (docs/workloads.md).

    python bench/workload_sizing.py            # 2 alternating rounds, 25 steps per trial
    python bench/workload_sizing.py --quick    # 1 round, 6 steps (smoke test)

The service's own loop (``service.train.run_training``, allreduce hook, NaN checks on, no
MLflow) trains each workload for a few steps at world size 1 (this process, a 1-rank gloo
group) and at world size 2 (two spawned gloo processes on 127.0.0.1), in alternating rounds:
each round runs every workload at W=1, then every workload at W=2, so all of them see the
same machine load. The figure per (workload, W) is the median over rounds of the trial's
``step_time_ms_median`` (rank 0's step time after the warm-up steps). Global batch: the
workload's preset batch (``--batch`` overrides), the same at both world sizes. One thread per
process, as the sweep's workers with ``cpus_per_worker: 1``. hf_gpt2 is skipped when
transformers (the ``.[hf]`` extra) is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Rendezvous, join_group, load_average, machine, median, table, write_json  # noqa: E402

# Global batch (samples) per workload: what the presets train with (hf_gpt2: tune_configs/hf_gpt2.yaml).
BATCH = {"mlp_digits": 64, "cnn_digits": 64, "char_lm": 64, "hf_gpt2": 32}
OPTIMIZER = {"mlp_digits": ("sgd", 0.05), "cnn_digits": ("sgd", 0.05), "char_lm": ("adamw", 0.001),
             "hf_gpt2": ("adamw", 0.002)}


def _cfg(name: str, steps: int, warmup: int, batch: int, world_size: int):
    from service.config import SweepConfig

    optimizer, lr = OPTIMIZER[name]
    return SweepConfig.model_validate({
        "name": "sizing",
        "workload": {"name": name, "steps": steps, "global_batch_size": batch, "lr": lr, "optimizer": optimizer,
                     "eval_every": steps, "warmup_steps": warmup},
        "search": {"hooks": ["allreduce"], "world_size": [world_size]},
    })


def run_all(rank: int, world_size: int, names: list[str], steps: int, warmup: int, batches: dict) -> dict:
    """Each workload's step_time_ms_median (and per-sample figure) on this rank."""
    import torch

    from service.train import TrainingContext, run_training

    torch.set_num_threads(1)
    out = {}
    for name in names:
        cfg = _cfg(name, steps, warmup, batches[name], world_size)
        result = run_training(cfg.trials()[0], cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
        out[name] = {"step_ms": result.summary["step_time_ms_median"], "final_loss": result.summary["final_loss"]}
    return out


def _spawned(rank: int, world_size: int, port: int, args: tuple, queue) -> None:
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    join_group(port, rank, world_size, timeout_s=600)
    try:
        result = run_all(rank, world_size, *args)
        queue.put((rank, result))
    finally:
        dist.destroy_process_group()


def at_world_size(world_size: int, args: tuple) -> dict:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if world_size == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            return run_all(0, 1, *args)
        finally:
            dist.destroy_process_group()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    meet = Rendezvous(world_size)
    procs = [ctx.Process(target=_spawned, args=(r, world_size, meet.port, args, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    return results[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=25, help="optimizer steps per trial")
    parser.add_argument("--warmup", type=int, default=5, help="steps excluded from the step time")
    parser.add_argument("--batch", type=int, default=None, help="one global batch for every workload")
    parser.add_argument("--quick", action="store_true", help="1 round of 6 steps (smoke test)")
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/workload_sizing.json)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 6, 2
    names = [n for n in BATCH if n != "hf_gpt2" or importlib.util.find_spec("transformers")]
    batches = {n: args.batch or BATCH[n] for n in names}
    load_before = load_average()
    rounds = []
    for r in range(args.rounds):
        row = {}
        for world_size in (1, 2):
            row[world_size] = at_world_size(world_size, (names, args.steps, args.warmup, batches))
        rounds.append(row)
        print(f"round {r + 1}/{args.rounds} done, load {load_average()}", file=sys.stderr)
    load_after = load_average()
    results = {}
    rows = []
    for name in names:
        one = median(rd[1][name]["step_ms"] for rd in rounds)
        two = median(rd[2][name]["step_ms"] for rd in rounds)
        results[name] = {"global_batch": batches[name], "w1_step_ms": one, "w2_step_ms": two}
        rows.append([name, batches[name], round(one, 1), round(two, 1), round(two / one, 2)])
    print(table(["workload", "global batch", "W=1 step (ms)", "W=2 step (ms)", "W2/W1"], rows))
    print(f"load average before {load_before}, after {load_after}; {args.rounds} rounds of {args.steps} steps")
    path = write_json("workload_sizing", {"machine": machine(), "load_before": load_before,
                                          "load_after": load_after, "rounds": rounds, "results": results,
                                          "steps": args.steps, "warmup": args.warmup}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
