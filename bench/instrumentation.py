"""What the trial's instrumentation costs per step: MLflow logging + NaN checks + hook
accounting on, against the same loop with all three off.

    python bench/instrumentation.py          # char_lm, world size 2, 3 alternating rounds
    python bench/instrumentation.py --quick  # 6 steps, 1 round (smoke test)
    python bench/instrumentation.py --timeline --world-size 1   # + "on" without the step timeline

Two gloo processes (torch.multiprocessing, no Ray) run ``service.train.run_training`` on
the same trial again and again, alternating the two modes, so both see the same machine load:

- on:  rank 0 logs every step through ``tracking.MetricLogger`` into a SQLite MLflow store
       (batched, flushed every ``flush_seconds``), ``service.train.nan.NanMonitor`` checks every
       step (fused max-abs passes + one tiny all-reduce), and the hook is the library's
       ``allreduce`` with its byte/time/NaN-flag accounting;
- off: no logger, a stand-in monitor that only reads the local loss, and torch's own
       ``allreduce_hook`` (the same algorithm without accounting).

Step time = wall between the starts of consecutive steps on rank 0 (so a logger flush, which
happens after the step's own timer stops, is counted), over the steps after warm-up; the
figure is the mean (flushes included) and the median, per mode, and on/off - 1, paired by
round. CPU per step (both ranks' process time over the same steps) is reported beside it: on a
machine shared with other work the wall figures swing by tens of percent, the CPU the
instrumentation adds does not.

``--timeline`` adds the arm ``no_timeline``: "on" with ``tracking.timeline_steps: 0``, so
on / no_timeline - 1 is what recording the step timeline costs (issue 24's budget: within 3 % of
the step). Its sampled steps' stamps land in the median step; the compute window after each
sampled step (the rank's forward and backward at two batch sizes, outside the step's own timer)
lands between two step starts, so in the mean, once per sampled step: the trial's extra seconds
are reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Rendezvous, join_group, load_average, machine, median, table, write_json  # noqa: E402

# on/off is the figure; the "only_*" modes turn one part on at a time to say which part costs.
MODES = ("on", "off")
PART_MODES = ("only_logging", "only_nan_checks", "only_accounting")
TIMELINE_MODE = "no_timeline"  # "on" without the step timeline (--timeline)


def bench_config(steps: int, warmup: int, flush_seconds: float, world_size: int = 2) -> dict:
    return {
        "name": "bench-instrumentation",
        "workload": {"name": "char_lm", "steps": steps, "global_batch_size": 32, "lr": 0.001,
                     "optimizer": "adamw", "eval_every": steps, "warmup_steps": warmup},
        "search": {"hooks": ["allreduce"], "world_size": [world_size], "seed": [0]},
        "resources": {"cpus_per_worker": 1.0},
        "tracking": {"flush_seconds": flush_seconds},
    }


class _NoChecks:
    """NaN checks off: the step's local loss, no reductions, no all-reduce."""

    report = None

    def __init__(self, *args, **kwargs):
        self._pending = None

    def submit(self, step, loss):
        from service.train.nan import StepCheck

        self._pending = StepCheck(step=step, mean_loss=float(loss), nonfinite=False)

    def resolve(self):
        pending, self._pending = self._pending, None
        return pending


def _plain_allreduce(name, process_group=None, **params):
    """Hook accounting off: torch's built-in allreduce hook (same algorithm, no accounting)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return process_group, allreduce_hook


def _one_run(mode: str, trial, cfg, rank: int, run_id: str, uri: str) -> dict:
    import service.train as train
    from service import tracking

    begins: list[float] = []
    cpu_begins: list[float] = []

    class RecordingMeter(train.StepMeter):
        def begin(self):
            begins.append(time.perf_counter())
            cpu_begins.append(time.process_time())
            super().begin()

    parts = {"make_meter": RecordingMeter}
    inside = _time_instrumentation_calls(train) if mode == "on" else None
    logger = None
    if mode == TIMELINE_MODE:  # everything "on" has but the step timeline
        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"timeline_steps": 0})})
    full = mode in ("on", TIMELINE_MODE)
    if not full and mode != "only_nan_checks":
        parts["make_monitor"] = _NoChecks
    if not full and mode != "only_accounting":
        parts["build_hook"] = _plain_allreduce
    if (full or mode == "only_logging") and rank == 0:
        logger = tracking.MetricLogger(run_id, uri, cfg.tracking.flush_seconds)
    ctx = train.TrainingContext(rank=rank, world_size=trial.world_size, device="cpu", logger=logger, **parts)
    try:
        started = time.perf_counter()
        train.run_training(trial, cfg, ctx)
        total = time.perf_counter() - started
    finally:
        if inside is not None:
            inside.restore()
    warm = cfg.workload.warmup_steps
    steps = [b - a for a, b in zip(begins[warm:], begins[warm + 1:])]
    cpu = cpu_begins[-1] - cpu_begins[warm]
    return {"mode": mode, "step_ms_mean": 1000 * sum(steps) / len(steps), "step_ms_median": 1000 * median(steps),
            "cpu_ms_per_step": 1000 * cpu / len(steps),  # this rank's CPU (all its threads)
            "steps_measured": len(steps), "run_training_s": total,
            "flush_s": getattr(logger, "flush_seconds_spent", 0.0),
            # wall ms per step spent inside the instrumentation's own calls ("on" only)
            "inside_ms_per_step": inside.per_step(len(begins)) if inside is not None else {}}


class _CallTimers:
    """Wall time spent inside named methods (patched on their classes), restorable."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._saved: list[tuple[type, str, Any]] = []

    def wrap(self, cls: Any, method: str, part: str) -> None:  # a class or a module
        original = getattr(cls, method)
        self._saved.append((cls, method, original))
        seconds = self.seconds
        seconds.setdefault(part, 0.0)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - started

        setattr(cls, method, timed)

    def restore(self) -> None:
        for cls, method, original in reversed(self._saved):
            setattr(cls, method, original)

    def per_step(self, steps: int) -> dict[str, float]:
        return {part: 1000 * s / max(steps, 1) for part, s in self.seconds.items()}


class _Delegate:
    """A module's stand-in whose attributes are the module's, so one of them can be timed alone."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def _time_instrumentation_calls(train) -> _CallTimers:
    """Time the instrumentation's own calls in the loop: what it costs in itself, apart from
    what it does to the rest of the step (caches, threads, waiting for a peer)."""
    import hooks.state
    from service import tracking
    from service.train import nan

    timers = _CallTimers()
    timers.wrap(nan.NanMonitor, "submit", "nan_submit")
    timers.wrap(nan.NanMonitor, "resolve", "nan_resolve")
    timers.wrap(nan, "nonfinite", "nan_weight_read")  # inside nan_submit: the read of the weights
    # inside nan_submit: launching the agreement's async all-reduce (service.train.nan's own `dist` only,
    # so the hooks' collectives are not counted)
    timers._saved.append((nan, "dist", nan.dist))
    nan.dist = _Delegate(nan.dist)
    timers.wrap(nan.dist, "all_reduce", "nan_agreement_launch")
    timers.wrap(train.Reporter, "record", "logging")
    timers.wrap(train.Reporter, "log", "logging")
    timers.wrap(tracking.MetricLogger, "flush", "logging_flush")
    timers.wrap(hooks.state.HookState, "begin", "accounting")
    timers.wrap(hooks.state.HookState, "account", "accounting")
    return timers


def _worker(rank: int, port: int, sweep: dict, rounds: int, modes: list[str], run_ids: list[str], uri: str,
            out: str) -> None:
    import torch
    import torch.distributed as dist

    from service.config import SweepConfig

    torch.set_num_threads(1)
    cfg = SweepConfig.model_validate(sweep)
    join_group(port, rank, cfg.search.world_size[0])
    trial = cfg.trials()[0]
    results = []
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            dist.barrier()
            result = _one_run(mode, trial, cfg, rank, run_ids[len(results)], uri)
            result["round"], result["load_1m"] = r + 1, load_average()[:1]
            results.append(result)
            if rank == 0:
                print(f"round {r + 1} {mode:15s}: step {result['step_ms_mean']:6.1f} ms mean, "
                      f"{result['step_ms_median']:6.1f} ms median", flush=True)
    dist.destroy_process_group()
    Path(f"{out}-rank{rank}").write_text(json.dumps(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2,
                        help="1: one process, no peer to wait for, so a loaded machine's scheduling "
                             "delays do not land on the collectives (the instrumentation's own work)")
    parser.add_argument("--flush-seconds", type=float, default=5.0, help="the MetricLogger's flush interval (config default 5)")
    parser.add_argument("--parts", action="store_true",
                        help="also run each part alone (logging, NaN checks, accounting) to see which one costs")
    parser.add_argument("--timeline", action="store_true",
                        help="also run 'on' without the step timeline (tracking.timeline_steps: 0): its cost")
    parser.add_argument("--quick", action="store_true", help="6 steps, 1 round")
    parser.add_argument("--out", help="JSON path (default bench/results/instrumentation.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.rounds = 6, 1, 1

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.multiprocessing as mp

    from service import tracking
    from service.config import SweepConfig

    load_before = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="bench-instrumentation-"))
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    sweep = SweepConfig.model_validate(bench_config(args.steps, args.warmup, args.flush_seconds, args.world_size))
    experiment = tracking.get_or_create_experiment(sweep.name, uri)
    modes = list(MODES + PART_MODES) if args.parts else list(MODES)
    if args.timeline:
        modes.insert(1, TIMELINE_MODE)
    run_ids = [tracking.client(uri).create_run(experiment, run_name=f"run{i}").info.run_id
               for i in range(args.rounds * len(modes))]
    out = workdir / "results.json"
    meet = Rendezvous(sweep.search.world_size[0])
    mp.spawn(_worker, args=(meet.port, sweep.model_dump(), args.rounds, modes, run_ids, uri, str(out)),
             nprocs=args.world_size, join=True)
    per_rank = [json.loads(Path(f"{out}-rank{rank}").read_text()) for rank in range(args.world_size)]
    results = per_rank[0]
    for theirs_all in per_rank[1:]:  # CPU of all ranks per step: the work the machine does
        for mine, theirs in zip(results, theirs_all):
            mine["cpu_ms_per_step"] += theirs["cpu_ms_per_step"]
    # Wall ms per step inside the instrumentation's own calls, "on" mode, median over rounds.
    inside = {f"rank{rank}": {part: median(x["inside_ms_per_step"][part] for x in runs if x["mode"] == "on")
                              for part in next(x for x in runs if x["mode"] == "on")["inside_ms_per_step"]}
              for rank, runs in enumerate(per_rank)}

    summary = {}
    for mode in modes:
        runs = [x for x in results if x["mode"] == mode]
        summary[mode] = {"step_ms_mean": median(x["step_ms_mean"] for x in runs),
                         "step_ms_median": median(x["step_ms_median"] for x in runs),
                         "cpu_ms_per_step": median(x["cpu_ms_per_step"] for x in runs)}
    # Paired per round (the two runs of a round ran back to back): the ratio of each pair, then its median.
    def paired(mode: str, key: str, reference: str = "off") -> float:
        pairs = [(x, off) for x in results if x["mode"] == mode for off in results
                 if off["mode"] == reference and off["round"] == x["round"]]
        return median(x[key] / off[key] - 1 for x, off in pairs)

    for mode in modes:
        summary[mode]["vs_off_mean"] = paired(mode, "step_ms_mean")
        summary[mode]["vs_off_median"] = paired(mode, "step_ms_median")
        summary[mode]["vs_off_cpu"] = paired(mode, "cpu_ms_per_step")
    overhead_mean, overhead_median = summary["on"]["vs_off_mean"], summary["on"]["vs_off_median"]
    print()
    print(table(["mode", "step ms (mean)", "step ms (median)", "vs off (mean) %", "vs off (median) %",
                 "CPU ms/step (all ranks)", "vs off (CPU) %"],
                [[m, summary[m]["step_ms_mean"], summary[m]["step_ms_median"], 100 * summary[m]["vs_off_mean"],
                  100 * summary[m]["vs_off_median"], summary[m]["cpu_ms_per_step"], 100 * summary[m]["vs_off_cpu"]]
                 for m in modes]))
    print(f"\ninstrumentation overhead (on/off - 1, median of paired rounds): "
          f"{100 * overhead_mean:.1f}% of mean step time, {100 * overhead_median:.1f}% of median step time, "
          f"{100 * summary['on']['vs_off_cpu']:.1f}% of CPU per step")
    timeline = None
    if args.timeline:
        timeline = {key: paired("on", key, TIMELINE_MODE) for key in ("step_ms_mean", "step_ms_median", "cpu_ms_per_step")}
        timeline["extra_s_per_trial"] = median(
            x["run_training_s"] - y["run_training_s"] for x in results if x["mode"] == "on" for y in results
            if y["mode"] == TIMELINE_MODE and y["round"] == x["round"])
        print(f"\nstep timeline ({sweep.tracking.timeline_steps} sampled steps of {args.steps}; on / no_timeline - 1, "
              f"median of paired rounds): {100 * timeline['step_ms_median']:.1f}% of the median step (the stamps), "
              f"{100 * timeline['step_ms_mean']:.1f}% of the mean step (stamps + compute windows), "
              f"{100 * timeline['cpu_ms_per_step']:.1f}% of CPU per step; "
              f"{timeline['extra_s_per_trial']:+.2f} s per run_training")
    parts = list(inside["rank0"])
    print("\nwall ms per step inside the instrumentation's own calls ('on', median of rounds; "
          "logging includes logging_flush, nan_resolve includes waiting for the agreement):")
    print(table(["rank"] + parts, [[r] + [inside[r][p] for p in parts] for r in inside]))
    path = write_json("instrumentation", {
        "settings": {"workload": "char_lm", "world_size": args.world_size, "steps": args.steps, "warmup": args.warmup,
                     "rounds": args.rounds, "flush_seconds": args.flush_seconds},
        "machine": machine(), "load_average_before": load_before, "load_average_after": load_average(),
        "summary": summary, "overhead_fraction_mean": overhead_mean, "overhead_fraction_median": overhead_median,
        "overhead_fraction_cpu": summary["on"]["vs_off_cpu"],
        "inside_ms_per_step": inside, "timeline_overhead": timeline,
        "runs": results,
    }, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
