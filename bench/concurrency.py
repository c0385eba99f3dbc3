"""A 12-trial sweep at max_concurrent_trials 1 and at 2, and what running two trials at once
does to each trial's own throughput on a shared CPU.

    python bench/concurrency.py            # 6 hooks x 2 seeds, world size 2, mlp_digits
    python bench/concurrency.py --quick    # 2 trials of 3 steps (smoke test)

Both sweeps run through ``service.sweep.run_sweep`` (Tune -> Train -> MLflow) on one local
Ray instance started once with room for two trials (``service.sweep.ray_runtime``), one after the
other in one invocation (order: --order). Figures: total sweep wall at each concurrency and
their ratio; and the throughput distortion: per configuration, samples/s (logged by the
trial itself, warm-up excluded) when it ran alone (c=1) against when it shared the machine
with another trial (c=2), median over configurations. Speed-up in wall time bought with
distorted per-trial throughput is the trade: compare hooks only within one concurrency.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_average, machine, median, table, write_json  # noqa: E402

HOOKS = ["allreduce", "fp16_compress", "bf16_compress", "quantization_pertensor",
         {"name": "quantization_perchannel", "chunk_size": 512}, "powersgd"]
CPUS_PER_WORKER = 0.5


def sweep_yaml(concurrency: int, hooks: list, seeds: list[int], steps: int, world_size: int, storage: str) -> str:
    import yaml

    return yaml.safe_dump({
        "name": f"bench-concurrency-c{concurrency}",
        "storage_path": storage,
        "workload": {"name": "mlp_digits", "steps": steps, "global_batch_size": 64, "lr": 0.05,
                     "optimizer": "sgd", "eval_every": steps, "warmup_steps": min(5, steps - 1)},
        "search": {"hooks": hooks, "world_size": [world_size], "seed": seeds},
        "resources": {"cpus_per_worker": CPUS_PER_WORKER, "max_concurrent_trials": concurrency},
        "tracking": {"flush_seconds": 2.0},
    }, sort_keys=False)


def run_one(concurrency: int, path: Path) -> dict:
    from service import sweep
    from service.config import load_config

    cfg, path = load_config(path)
    started = time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        # one Ray instance for both sweeps: main() started it
        outcome = sweep.run_sweep(cfg, path, out=io.StringIO(), init_ray=lambda *a: None)
    wall = time.time() - started
    bad = [r for r in outcome.rows if r["status"] != "ok"]
    if bad:
        raise RuntimeError(f"c={concurrency}: {len(bad)} trials did not finish ok: {bad[0]['status']} {bad[0]['error']}")
    return {"concurrency": concurrency, "wall_s": wall, "trials": len(outcome.rows),
            "samples_per_s": {r["trial"]: r["samples_per_s"] for r in outcome.rows},
            "load_1m": load_average()[:1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--trials", type=int, default=12,
                        help="run the first N configurations of the 12 (6 hooks x 2 seeds), for a loaded machine")
    parser.add_argument("--order", choices=["1,2", "2,1"], default="2,1",
                        help="which concurrency runs first (the first also pays the Ray instance's warm-up)")
    parser.add_argument("--quick", action="store_true", help="2 trials of 3 steps, world size 1")
    parser.add_argument("--out", help="JSON path (default bench/results/concurrency.json)")
    args = parser.parse_args(argv)
    hooks, seeds = HOOKS[:max(1, (args.trials + 1) // 2)], [0, 1] if args.trials > 1 else [0]
    if args.quick:
        hooks, seeds, args.steps, args.world_size = ["allreduce"], [0, 1], 3, 1

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.pop("RAY_ADDRESS", None)
    load_before = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="bench-concurrency-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir / 'mlflow.db'}"

    import math

    from service import sweep

    from service.sweep import ray_runtime

    order = [int(c) for c in args.order.split(",")]
    paths = {}
    for c in order:
        paths[c] = workdir / f"c{c}.yaml"
        paths[c].write_text(sweep_yaml(c, hooks, seeds, args.steps, args.world_size, str(workdir / "ray")))
    started = time.time()
    # Room for two trials (as the sweep itself would size it for max_concurrent_trials 2).
    local_ray = ray_runtime.init_local(num_cpus=math.ceil(2 * (args.world_size * CPUS_PER_WORKER + sweep.TRIAL_DRIVER_CPUS)))
    ray_init_s = time.time() - started
    runs = {}
    try:
        for c in order:
            runs[c] = run_one(c, paths[c])
            print(f"max_concurrent_trials {c}: {runs[c]['trials']} trials in {runs[c]['wall_s']:.1f} s", flush=True)
    finally:
        local_ray.stop()  # all of it: its processes take no SIGTERM (service/sweep/processes.py)

    alone, shared = runs[1]["samples_per_s"], runs[2]["samples_per_s"]
    per_config = {name: shared[name] / alone[name] for name in alone if alone[name] and shared.get(name)}
    distortion = median(per_config.values())
    speedup = runs[1]["wall_s"] / runs[2]["wall_s"]
    print()
    print(table(["max_concurrent_trials", "trials", "sweep wall s", "median trial samples/s"],
                [[c, runs[c]["trials"], runs[c]["wall_s"], median(runs[c]["samples_per_s"].values())] for c in (1, 2)]))
    print(f"\nwall time c=1 / c=2: {speedup:.2f}x; a trial's own samples/s at c=2 / alone (median over "
          f"configurations): {distortion:.2f}  (ray.init once: {ray_init_s:.1f} s, not in the walls)")
    path = write_json("concurrency", {
        "settings": {"hooks": [h if isinstance(h, str) else h["name"] for h in hooks], "seeds": seeds,
                     "steps": args.steps, "world_size": args.world_size, "workload": "mlp_digits",
                     "cpus_per_worker": CPUS_PER_WORKER, "order": order},
        "machine": machine(), "load_average_before": load_before, "load_average_after": load_average(),
        "ray_init_s": ray_init_s, "runs": {str(c): runs[c] for c in runs},
        "wall_ratio_c1_over_c2": speedup, "throughput_ratio_shared_over_alone": distortion,
        "throughput_ratio_per_config": per_config,
    }, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
