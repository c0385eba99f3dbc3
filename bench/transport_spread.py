"""What transport measured once does to the seeds' spread: the same configuration's seeds priced
at W = 8 from their own recorded comm, then from the probe's transport (service/step_model/transport.py).

    .venv/bin/python bench/transport_spread.py            # allreduce, bf16_compress x 3 seeds, W = 2 (~3 min)

Real trials (the quant preset's char_lm, ``--steps`` steps, the step timeline sampled on 5)
run one after another on a W = 2 gloo group of processes (``run_training``, no Ray); the probe
(service/train/transport_probe.py) at W = 2 and 4 before them, its wall time per W printed. Per
configuration: each seed's step at W = 8 on 10 Gbit/s (25 µs), priced both ways, and the spread
(slowest / fastest - 1). Writes bench/results/transport_spread.json.
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import load_average, machine, table, write_json

from tests.dist_utils import run_distributed

HOOKS = ("allreduce", "bf16_compress")


def _probe(rank: int, world_size: int):
    from service.train.transport_probe import probe

    started = time.perf_counter()
    return probe()[0], time.perf_counter() - started


def _trials(rank: int, world_size: int, steps: int, seeds: int):
    from service.config import SweepConfig
    from service.train import TrainingContext, run_training

    cfg = SweepConfig.model_validate({
        "name": "transport-spread", "search": {"hooks": list(HOOKS), "world_size": [world_size],
                                               "seed": list(range(seeds))},
        "workload": {"name": "char_lm", "steps": steps, "global_batch_size": 64, "lr": 0.003, "optimizer": "adamw",
                     "eval_every": steps, "warmup_steps": 5},
        "tracking": {"timeline_steps": 5}})
    out = []
    for trial in cfg.trials():
        result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
        out.append((trial.hook, trial.seed, result.timeline.to_json() if result.timeline else None))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    from service.step_model.transport import fit
    from service.step_model.trial import TrialTimeline

    load_before = load_average()
    samples, cost = [], {}
    for w in (2, 4):
        got, seconds = run_distributed(_probe, w)[0]
        samples += got
        cost[w] = round(seconds, 2)
    transport = fit(samples, cost)
    trials = run_distributed(_trials, 2, (args.steps, args.seeds))[0]
    rows, raw = [], {}
    for hook in HOOKS:
        tls = [TrialTimeline.from_json(t) for h, _, t in trials if h == hook and t]
        own = [tl.price(64, 8, 10.0, 25e-6).step_ms for tl in tls]
        measured = [tl.price(64, 8, 10.0, 25e-6, transport).step_ms for tl in tls]
        raw[hook] = {"own_ms": own, "transport_ms": measured}
        rows.append([hook, " / ".join(f"{x:.1f}" for x in own), f"{100 * (max(own) / min(own) - 1):.1f}",
                     " / ".join(f"{x:.1f}" for x in measured), f"{100 * (max(measured) / min(measured) - 1):.1f}"])
    print(table(["config", "W=8 own comm, ms per seed", "spread %", "W=8 transport.json, ms", "spread %"], rows))
    print(f"probe cost {cost} s; fit per kind and W (fixed ms, ms per byte, worst error): "
          f"{({k: [(f.world_size, f.fixed_ms, f.per_byte_ms, f.max_rel_error) for f in fits] for k, fits in transport.kinds.items()})}")
    print(f"load average before {load_before}, after {load_average()}")
    path = write_json("transport_spread", {"machine": machine(), "probe_s": cost, "transport": transport.to_json(),
                                           "seeds": raw, "load_average_before": load_before,
                                           "load_average_after": load_average()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
