"""Per-trial overhead of the service against a bare torch.multiprocessing DDP launch.

    python bench/overhead.py                 # world sizes 1, 2, 4; 2 alternating rounds
    python bench/overhead.py --quick         # world size 1, 1 round, 3 steps (smoke test)
    python bench/overhead.py --profiles ours warm --arms bare service service_marginal
                                             # warm Ray workers against the service's settings

The same training (``service.train.run_training``: same workload, steps, hook, seed) is
launched two ways, alternately, in one invocation:

- bare:    ``torch.multiprocessing`` spawns ``world_size`` processes, each initialises a
           gloo group on 127.0.0.1, runs the loop (no Ray, no MLflow logger) and exits;
- service: ``service.sweep.run_sweep`` on a one-trial config: Tune trial -> MLflow child run
           -> Ray Train ``TorchTrainer`` -> ``train_loop_per_worker`` (MLflow logging on
           rank 0) -> report -> run closed; the Ray instance is started once (ray.init is a
           per-sweep cost, reported on its own line), with ``service.sweep.ray_runtime``'s settings.

and, in the same rounds, Ray's floor: an empty TorchTrainer fitted from the bench process
(``train_noop``), the same inside one Tune function trial as the service runs it
(``tune_train_noop``: the floor of the mandated "Tune trial + TorchTrainer per trial", no
MLflow anywhere), and one empty actor (``actor_start``).

Each round runs every profile of Ray settings (``--profiles``: ``ours`` = service.sweep.ray_runtime
as the sweep starts it; ``warm`` = that plus WARM_SYSTEM_CONFIG, prestarted idle workers that
preload torch / ray.train / service.train), in alternating order, on a fresh Ray instance each.
``service_marginal`` is a ``--marginal-trials``-trial sweep: (its wall - the one-trial sweep's
wall) / (N - 1) is what one more trial of a sweep costs, without the sweep's own start.

overhead = launch wall - in-loop time (rank 0's ``run_training`` call, same clock), and the
ratio service overhead / bare overhead is the figure of issue 7 (target <= 2). The service
trial's time is also split into phases from timestamps (driver, MLflow run times, the worker).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Rendezvous, join_group, load_average, machine, median, table, TreeCpu, write_json  # noqa: E402

MARKS_ENV = "BENCH_OVERHEAD_MARKS_DIR"
RAY_DEFAULT_NICENESS = 15  # Ray's worker_niceness default
# bare and service are the comparison; train_noop (TorchTrainer with an empty loop) and
# actor_start (one empty Ray actor) measure the floor Ray itself sets.
# train_noop_ray_defaults: the same empty TorchTrainer with service.sweep.ray_runtime's Train/Tune
# variables at Ray's defaults (what they save, side by side).
# tune_train_noop: the empty TorchTrainer inside one Tune function trial with the service's
# trial resources and settings, no MLflow: the floor of the architecture the spec mandates
# ("Ray Tune sweeps the grid; each trial is a Ray Train TorchTrainer").
# service_marginal: an N-trial sweep (seeds 0..N-1), for the marginal trial beside the one-trial figure.
ARMS = ("bare", "service", "service_marginal", "train_noop", "train_noop_ray_defaults", "tune_train_noop",
        "actor_start")
DEFAULT_ARMS = [a for a in ARMS if a != "service_marginal"]  # an N-trial sweep per round: asked for by name
# Ray's warm-worker settings (Ray 2.60 system config; `ray start --system-config` on a cluster):
# prestart idle Python workers, keep them (soft limit and idle-kill threshold raised, so they are
# not killed after Ray's 1 s), and import the modules every trial process imports before they
# take work (the worker's --worker-preload-modules, set by the raylet from this list).
WARM_SYSTEM_CONFIG = {"enable_worker_prestart": True, "num_workers_soft_limit": 16,
                      "idle_worker_killing_time_threshold_ms": 600_000,
                      "preload_python_modules": ["torch", "ray.train", "ray.train.torch", "ray.tune",
                                                 "service.train"]}
PROFILES = {"ours": {}, "warm": WARM_SYSTEM_CONFIG}


def sweep_yaml(world_size: int, steps: int, storage: str, trials: int = 1) -> str:
    return f"""
name: bench-overhead-{trials}
storage_path: {storage}
workload: {{name: mlp_digits, steps: {steps}, global_batch_size: 64, lr: 0.05, optimizer: sgd,
           eval_every: {max(steps, 1)}, warmup_steps: 1}}
search: {{hooks: [allreduce], world_size: [{world_size}], seed: {list(range(trials))}}}
resources: {{cpus_per_worker: 0.5, max_concurrent_trials: 1}}
tracking: {{flush_seconds: 2.0}}
"""


# --------------------------------------------------------------------------- bare launch


def _bare_worker(rank: int, world_size: int, port: int, trial: dict, sweep: dict, marks: str) -> None:
    enter = time.time()
    import torch
    import torch.distributed as dist

    from service.config import SweepConfig, TrialSpec
    from service.train import TrainingContext, run_training

    torch.set_num_threads(1)
    imported = time.time()
    join_group(port, rank, world_size)
    grouped = time.time()
    t0, c0 = time.time(), time.process_time()
    run_training(TrialSpec.from_dict(trial), SweepConfig.model_validate(sweep), TrainingContext(rank=rank,
                 world_size=world_size, device="cpu", logger=None))
    t1, c1 = time.time(), time.process_time()
    dist.destroy_process_group()
    Path(f"{marks}-rank{rank}").write_text(json.dumps({
        "enter": enter, "imported": imported, "grouped": grouped, "run_start": t0, "run_end": t1,
        "run_cpu_s": c1 - c0, "exit": time.time()}))


def run_bare(cfg, trial, workdir: Path) -> dict:
    import torch.multiprocessing as mp

    marks = workdir / f"bare-{time.monotonic_ns()}"
    meet = Rendezvous(trial.world_size)
    meter, started = TreeCpu().start(), time.time()
    mp.spawn(_bare_worker, args=(trial.world_size, meet.port, trial.to_dict(), cfg.model_dump(), str(marks)),
             nprocs=trial.world_size, join=True)
    ended, cpu = time.time(), meter.stop()
    ranks = [json.loads(Path(f"{marks}-rank{r}").read_text()) for r in range(trial.world_size)]
    m = ranks[0]
    in_loop = m["run_end"] - m["run_start"]
    in_loop_cpu = sum(x["run_cpu_s"] for x in ranks)
    return {"wall_s": ended - started, "in_loop_s": in_loop, "overhead_s": ended - started - in_loop,
            "cpu_s": cpu, "in_loop_cpu_s": in_loop_cpu, "overhead_cpu_s": cpu - in_loop_cpu,
            "phases_s": {"spawn_and_imports": m["imported"] - started,
                         "process_group": m["grouped"] - m["imported"],
                         "in_loop": in_loop,
                         "teardown": ended - m["run_end"]}}


# --------------------------------------------------------------------------- through the service


def timed_train_loop(config: dict) -> None:
    """service.train.ray_entry.train_loop_per_worker, with timestamps around it and around run_training
    (pickled by value into the Ray workers; writes one JSON per rank into $BENCH_OVERHEAD_MARKS_DIR)."""
    import time as _time

    enter = _time.time()
    import ray.train

    import service.train.ray_entry as entry

    marks = {"enter": enter}
    original = entry.run_training

    def timed(*args, **kwargs):
        marks["run_start"], cpu0 = _time.time(), _time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            marks["run_end"], marks["run_cpu_s"] = _time.time(), _time.process_time() - cpu0

    entry.run_training = timed
    try:
        entry.train_loop_per_worker(config)
    finally:
        entry.run_training = original
        marks["exit"] = _time.time()
        rank = ray.train.get_context().get_world_rank()
        out = Path(os.environ[MARKS_ENV]) / f"{config['run_id']}-rank{rank}.json"
        out.write_text(json.dumps(marks))


def run_service(cfg, config_path: Path, uri: str, marks_dir: Path) -> dict:
    from service import sweep, tracking

    meter, started = TreeCpu().start(), time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        # Ray is already up (with ray_runtime's settings): one per bench
        outcome = sweep.run_sweep(cfg, config_path, out=io.StringIO(), train_loop=timed_train_loop,
                                  init_ray=lambda *a: None)
    ended, cpu = time.time(), meter.stop()
    row = outcome.rows[0]
    if row["status"] != "ok":
        raise RuntimeError(f"the service trial did not finish ok: {row['status']} {row.get('error')}")
    run = tracking.client(uri).get_run(row["run_id"])
    ranks = [json.loads((marks_dir / f"{row['run_id']}-rank{r}.json").read_text()) for r in range(cfg.trials()[0].world_size)]
    m = ranks[0]
    child_start, child_end = run.info.start_time / 1000.0, run.info.end_time / 1000.0
    in_loop = m["run_end"] - m["run_start"]
    in_loop_cpu = sum(x["run_cpu_s"] for x in ranks)
    return {"wall_s": ended - started, "in_loop_s": in_loop, "overhead_s": ended - started - in_loop,
            "cpu_s": cpu, "in_loop_cpu_s": in_loop_cpu, "overhead_cpu_s": cpu - in_loop_cpu,
            "phases_s": {
                "sweep_start_to_trial_start": child_start - started,   # parent run, Tune, trial actor
                "trainer_start": m["enter"] - child_start,             # controller, placement, worker actors, imports, group
                "worker_setup": m["run_start"] - m["enter"],           # MLflow tags, logger
                "in_loop": in_loop,
                "final_report": m["exit"] - m["run_end"],              # summary flush + ray.train.report barrier
                "trainer_shutdown": child_end - m["exit"],             # fit() return, run closed
                "trial_end_to_sweep_end": ended - child_end,           # Tune teardown, table from MLflow
            }}


def run_service_many(cfg, config_path: Path) -> dict:
    """run_sweep on an N-trial config (same trial, seeds 0..N-1), one after another: its wall and
    CPU, for the marginal trial (this minus the one-trial sweep, over N - 1)."""
    from service import sweep

    meter, started = TreeCpu().start(), time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        outcome = sweep.run_sweep(cfg, config_path, out=io.StringIO(), train_loop=timed_train_loop,
                                  init_ray=lambda *a: None)
    wall, cpu = time.time() - started, meter.stop()
    bad = [r for r in outcome.rows if r["status"] != "ok"]
    if bad:
        raise RuntimeError(f"a trial of the {len(outcome.rows)}-trial sweep did not finish ok: {bad[0]['status']}")
    return {"wall_s": wall, "cpu_s": cpu, "trials": len(outcome.rows), "in_loop_s": 0.0, "overhead_s": wall,
            "overhead_cpu_s": cpu}


# --------------------------------------------------------------------------- Ray's own floor


def _noop_train_loop(config: dict) -> None:
    """A TorchTrainer worker that does nothing: what Ray Train costs with no training at all."""


def set_train_env(ray_defaults: bool) -> None:
    """service.sweep.ray_runtime's variables in this process: ours, or Ray's defaults (the health
    check interval stays ours: the service had it before)."""
    from service.sweep.ray_runtime import TRAIN_ENV

    for name, (ours, default) in TRAIN_ENV.items():
        os.environ[name] = default if ray_defaults and name != "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S" else ours


def run_train_noop(world_size: int, storage: Path, ray_defaults: bool = False) -> dict:
    """TorchTrainer(no-op).fit() from the driver: controller, placement group, worker actors,
    gloo group, shutdown, and nothing else (no Tune, no MLflow, no training)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    saved = dict(os.environ)
    set_train_env(ray_defaults)
    try:
        return _fit_noop(world_size, storage, TorchTrainer, TorchConfig, ray.train)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _fit_noop(world_size, storage, TorchTrainer, TorchConfig, train) -> dict:
    meter, started = TreeCpu().start(), time.time()
    TorchTrainer(_noop_train_loop,
                 scaling_config=train.ScalingConfig(num_workers=world_size, resources_per_worker={"CPU": 0.5}),
                 torch_config=TorchConfig(backend="gloo"),
                 run_config=train.RunConfig(name=f"noop-{time.monotonic_ns()}", storage_path=str(storage))).fit()
    wall, cpu = time.time() - started, meter.stop()
    return {"wall_s": wall, "in_loop_s": 0.0, "overhead_s": wall, "cpu_s": cpu, "in_loop_cpu_s": 0.0,
            "overhead_cpu_s": cpu}


def _tune_noop_trial(config: dict) -> None:
    """What the service's Tune trial (service.sweep.run._run_trial) does with MLflow, the progress
    board and training taken out: apply the Train settings, fit an empty TorchTrainer of the
    trial's world size (Tune's report callback attached, as there), report once to Tune."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from service.sweep import ray_runtime

    ray_runtime.apply_env()
    TorchTrainer(_noop_train_loop,
                 scaling_config=ray.train.ScalingConfig(num_workers=config["world_size"],
                                                        resources_per_worker={"CPU": 0.5}),
                 torch_config=TorchConfig(backend="gloo"),
                 run_config=ray.train.RunConfig(name="noop", storage_path=config["storage"],
                                                callbacks=[TuneReportCallback()])).fit()
    tune.report({"status": "ok"})


def run_tune_train_noop(world_size: int, storage: Path) -> dict:
    """One Tune experiment of one function trial (service.sweep.run._make_tuner's resources, run
    and failure settings) whose trial fits an empty TorchTrainer: Tune's start, the trial's
    process, Train's worker group, teardown; no MLflow, no progress actor, no training."""
    from ray import tune

    from service.sweep import TRIAL_DRIVER_CPUS

    # the same two variables run_sweep sets in the driver before its Tuner
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    name = f"tune-noop-{time.monotonic_ns()}"
    meter, started = TreeCpu().start(), time.time()
    results = tune.Tuner(
        tune.with_resources(_tune_noop_trial, {"CPU": TRIAL_DRIVER_CPUS}),
        param_space={"world_size": world_size, "storage": str(storage / name / "trials")},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    ).fit()
    wall, cpu = time.time() - started, meter.stop()
    if results.errors:
        raise RuntimeError(f"the Tune no-op trial failed: {results.errors[0]}")
    return {"wall_s": wall, "in_loop_s": 0.0, "overhead_s": wall, "cpu_s": cpu, "in_loop_cpu_s": 0.0,
            "overhead_cpu_s": cpu}


@__import__("functools").lru_cache(maxsize=None)
def _pinger():
    import ray

    @ray.remote(num_cpus=0)
    class Pinger:
        def ping(self) -> int:
            return os.nice(0)  # the worker process's niceness

    return Pinger


def run_actor_start() -> dict:
    """One empty Ray actor: new worker process started, registered, answering (the unit Ray
    Train pays per actor: Tune trial, controller, placement-group cleaner, sync actor, workers)."""
    import ray

    meter, started = TreeCpu().start(), time.time()
    actor = _pinger().options(runtime_env={"env_vars": {"BENCH_FRESH": str(time.monotonic_ns())}}).remote()
    niceness = ray.get(actor.ping.remote())
    wall = time.time() - started
    ray.kill(actor)
    time.sleep(0.5)  # its exit is part of the cost
    cpu = meter.stop()
    return {"wall_s": wall, "in_loop_s": 0.0, "overhead_s": wall, "cpu_s": cpu, "in_loop_cpu_s": 0.0,
            "overhead_cpu_s": cpu, "worker_niceness": niceness}


# Every process a trial starts imports some of these; Ray Train's processes import ray.train,
# which pulls in ray.data and pandas.
IMPORTS = {"python (nothing)": "pass", "torch": "import torch", "service.train (bare rank)": "import service.train",
           "ray": "import ray", "ray.train": "import ray.train",
           "ray.train.torch + service.train + service.tracking (Train rank)":
               "import ray.train.torch, service.train, service.tracking",
           "mlflow": "import mlflow"}


def import_costs(repeats: int) -> dict[str, float]:
    """CPU seconds (user + system) a fresh interpreter spends importing each entry of IMPORTS
    (median of ``repeats``): what every process of a launch pays before doing anything."""
    import resource
    import subprocess

    out = {}
    for name, code in IMPORTS.items():
        cpu = []
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        out[name] = round(median(cpu), 3)
    return out


# --------------------------------------------------------------------------- main


def run_arm(kind: str, ws: int, configs: dict, workdir: Path, uri: str, marks_dir: Path) -> dict:
    cfg, path, trial = configs[ws]
    if kind == "bare":
        return run_bare(cfg, trial, workdir)
    if kind == "service":
        return run_service(cfg, path, uri, marks_dir)
    if kind == "service_marginal":
        many_cfg, many_path, _ = configs[("many", ws)]
        return run_service_many(many_cfg, many_path)
    if kind == "train_noop":
        return run_train_noop(ws, workdir / "noop")
    if kind == "train_noop_ray_defaults":
        return run_train_noop(ws, workdir / "noop", ray_defaults=True)
    if kind == "tune_train_noop":
        return run_tune_train_noop(ws, workdir / "tune-noop")
    return run_actor_start()


def summarise(samples: dict[str, list], marginal_trials: int) -> dict:
    """Medians of one (profile, world size): the figures of the tables below."""
    def med(arm, key):
        return median(x[key] for x in samples[arm])

    bare, service = samples["bare"], samples["service"]
    b_over, s_over = med("bare", "overhead_s"), med("service", "overhead_s")
    b_cpu, s_cpu = med("bare", "overhead_cpu_s"), med("service", "overhead_cpu_s")
    in_loop = median(x["in_loop_s"] for x in bare + service)
    out = {"train_noop_wall_s": med("train_noop", "wall_s"),
           "train_noop_ray_defaults_wall_s": med("train_noop_ray_defaults", "wall_s"),
           "train_noop_ray_defaults_cpu_s": med("train_noop_ray_defaults", "cpu_s"),
           "actor_start_s": med("actor_start", "wall_s"), "train_noop_cpu_s": med("train_noop", "cpu_s"),
           "tune_train_noop_wall_s": med("tune_train_noop", "wall_s"),
           "tune_train_noop_cpu_s": med("tune_train_noop", "cpu_s"),
           "actor_start_cpu_s": med("actor_start", "cpu_s"),
           "bare_overhead_cpu_s": b_cpu, "service_overhead_cpu_s": s_cpu, "overhead_cpu_ratio": s_cpu / b_cpu,
           "bare_wall_s": med("bare", "wall_s"), "service_wall_s": med("service", "wall_s"),
           "bare_overhead_s": b_over, "service_overhead_s": s_over, "in_loop_s": in_loop,
           "overhead_ratio": s_over / b_over,
           "service_phases_s": {k: round(median(x["phases_s"][k] for x in service), 3) for k in service[0]["phases_s"]}}
    out["tune_train_noop_ratio"] = out["tune_train_noop_wall_s"] / b_over
    out["service_over_tune_train_noop_s"] = s_over - out["tune_train_noop_wall_s"]
    # one more trial of a sweep: (N-trial sweep - 1-trial sweep) / (N - 1), paired per round
    pairs = [(m["wall_s"] - one["wall_s"]) / (marginal_trials - 1)
             for m, one in zip(samples["service_marginal"], service)]
    cpu_pairs = [(m["cpu_s"] - one["cpu_s"]) / (marginal_trials - 1)
                 for m, one in zip(samples["service_marginal"], service)]
    out["marginal_trial_wall_s"] = median(pairs)
    out["marginal_trial_overhead_s"] = median(pairs) - in_loop
    out["marginal_trial_ratio"] = out["marginal_trial_overhead_s"] / b_over
    out["marginal_trial_cpu_s"] = median(cpu_pairs)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2, help="alternating bare/service rounds per world size")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--ray-defaults", action="store_true",
                        help="run the service trials with service.sweep.ray_runtime's variables and worker niceness "
                             "at Ray's defaults (the settings before issue 7) to compare against a default run")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=DEFAULT_ARMS,
                        help="run only these arms (bare and service always run: they are the comparison); "
                             "e.g. --arms bare service to compare two versions of the service in alternating "
                             "invocations. The other arms' figures are then NaN. service_marginal (an N-trial "
                             "sweep per round) runs only when named")
    parser.add_argument("--profiles", nargs="+", choices=list(PROFILES), default=["ours"],
                        help="Ray settings to compare, each on its own fresh Ray instance per round, in "
                             "alternating order: ours (service.sweep.ray_runtime), warm (plus WARM_SYSTEM_CONFIG)")
    parser.add_argument("--marginal-trials", type=int, default=3,
                        help="trials of the service_marginal sweep (>= 2; default 3)")
    parser.add_argument("--quick", action="store_true", help="world size 1, one round, 3 steps")
    parser.add_argument("--out", help="JSON path (default bench/results/overhead.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.world_sizes, args.rounds, args.steps = [1], 1, 3
    if args.marginal_trials < 2:
        parser.error("--marginal-trials must be at least 2")

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.pop("RAY_ADDRESS", None)
    load_before = load_average()
    print(f"load average before: {load_before}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    marks_dir = workdir / "marks"
    marks_dir.mkdir()
    os.environ[MARKS_ENV] = str(marks_dir)  # inherited by the Ray workers started below
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri

    from service.sweep import ray_runtime
    from service.config import load_config

    configs: dict = {}
    for ws in args.world_sizes:
        for key, trials in ((ws, 1), (("many", ws), args.marginal_trials)):
            path = workdir / f"overhead-w{ws}-{trials}.yaml"
            path.write_text(sweep_yaml(ws, args.steps, str(workdir / "ray"), trials))
            cfg, path = load_config(path)
            configs[key] = (cfg, path, cfg.trials()[0])

    set_train_env(args.ray_defaults)  # inherited by the Ray instance, hence by the service's trials
    imports = import_costs(1 if args.quick else 3)

    arms = [arm for arm in ARMS if arm in {"bare", "service", *args.arms}]
    samples = {p: {ws: {arm: [] for arm in ARMS} for ws in args.world_sizes} for p in args.profiles}
    ray_init_s: dict[str, list[float]] = {p: [] for p in args.profiles}
    num_cpus = max(1, int(max(args.world_sizes) * 0.5 + 1))
    for r in range(args.rounds):
        for profile in (args.profiles if r % 2 == 0 else args.profiles[::-1]):
            t0 = time.time()
            niceness = RAY_DEFAULT_NICENESS if args.ray_defaults else ray_runtime.WORKER_NICENESS
            local_ray = ray_runtime.init_local(num_cpus=num_cpus, system_config=PROFILES[profile],
                                               worker_niceness=niceness)
            ray_init_s[profile].append(time.time() - t0)
            if PROFILES[profile]:
                time.sleep(10)  # let the prestarted workers come up and import, as in a sweep's first seconds
            try:
                for ws in args.world_sizes:
                    for kind in (arms if r % 2 == 0 else arms[::-1]):
                        result = run_arm(kind, ws, configs, workdir, uri, marks_dir)
                        result["load_1m"] = load_average()[:1]
                        samples[profile][ws][kind].append(result)
                        print(f"round {r + 1} {profile:4s} w{ws} {kind:23s} wall {result['wall_s']:6.2f} s  in-loop "
                              f"{result['in_loop_s']:5.2f} s  overhead {result['overhead_s']:6.2f} s  "
                              f"(cpu {result['overhead_cpu_s']:6.2f} s)  load {result['load_1m']}", flush=True)
            finally:
                local_ray.stop()  # all of it: its processes take no SIGTERM (service/sweep/processes.py)

    by_profile = {p: {ws: summarise(samples[p][ws], args.marginal_trials) for ws in args.world_sizes}
                  for p in args.profiles}
    for profile in args.profiles:
        summary = by_profile[profile]
        rows, cpu_rows = [], []
        for ws in args.world_sizes:
            x = summary[ws]
            rows.append([ws, x["in_loop_s"], x["bare_overhead_s"], x["service_overhead_s"], x["overhead_ratio"],
                         x["marginal_trial_overhead_s"], x["marginal_trial_ratio"], x["train_noop_wall_s"],
                         x["tune_train_noop_wall_s"], x["tune_train_noop_ratio"], x["service_over_tune_train_noop_s"],
                         x["actor_start_s"]])
            cpu_rows.append([ws, x["bare_overhead_cpu_s"], x["service_overhead_cpu_s"], x["overhead_cpu_ratio"],
                             x["marginal_trial_cpu_s"], x["train_noop_cpu_s"], x["train_noop_ray_defaults_cpu_s"],
                             x["tune_train_noop_cpu_s"], x["tune_train_noop_cpu_s"] / x["bare_overhead_cpu_s"],
                             x["actor_start_cpu_s"]])
        print(f"\n[{profile}] wall time (median):")
        print(table(["world", "in-loop s", "bare overhead s", "service overhead s", "ratio",
                     "marginal trial overhead s", "its ratio", "TorchTrainer no-op s",
                     "Tune trial + TorchTrainer no-op s", "its ratio", "service - that s", "1 actor start s"], rows))
        print(f"\n[{profile}] CPU time of the whole process tree beyond the loop's own (median; holds still under load):")
        print(table(["world", "bare overhead cpu-s", "service overhead cpu-s", "ratio", "marginal trial cpu-s",
                     "TorchTrainer no-op cpu-s", "same, Ray defaults", "Tune trial + TorchTrainer no-op cpu-s",
                     "its ratio", "1 actor start cpu-s"], cpu_rows))
        print(f"\n[{profile}] where a service trial's time goes (median s):")
        phase_names = list(summary[args.world_sizes[0]]["service_phases_s"])
        print(table(["phase"] + [f"w{ws}" for ws in args.world_sizes],
                    [[p] + [summary[ws]["service_phases_s"][p] for ws in args.world_sizes] for p in phase_names]))
    print("\nray.init (once per sweep, not in the figures above): "
          + ", ".join(f"{p} {median(v):.1f} s" for p, v in ray_init_s.items()))
    print("\nCPU seconds to start a Python process and import (median):")
    print(table(["imports", "cpu s"], [[k, v] for k, v in imports.items()]))
    load_after = load_average()
    print(f"\nload average before {load_before}, after {load_after}")
    first = args.profiles[0]
    path = write_json("overhead", {
        "settings": {"world_sizes": args.world_sizes, "rounds": args.rounds, "steps": args.steps, "arms": arms,
                     "profiles": {p: PROFILES[p] for p in args.profiles}, "marginal_trials": args.marginal_trials,
                     "workload": "mlp_digits", "hook": "allreduce",
                     "ray_defaults": args.ray_defaults,
                     "worker_niceness": [x.get("worker_niceness") for p in samples for ws in samples[p]
                                         for x in samples[p][ws]["actor_start"]],
                     "train_env": {k: os.environ.get(k) for k in ray_runtime.TRAIN_ENV}},
        "machine": machine(), "load_average_before": load_before, "load_average_after": load_after,
        "ray_init_s": median(ray_init_s[first]), "ray_init_s_by_profile": {p: median(v) for p, v in ray_init_s.items()},
        "import_cpu_s": imports,
        # the first profile's figures (ours by default), and every profile's
        "summary": {str(k): v for k, v in by_profile[first].items()},
        "summary_by_profile": {p: {str(k): v for k, v in by_profile[p].items()} for p in args.profiles},
        "samples": {str(k): v for k, v in samples[first].items()},
        "samples_by_profile": {p: {str(k): v for k, v in samples[p].items()} for p in args.profiles},
    }, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
