"""``python -m service.sweep CONFIG``: sweep DDP communication hooks, one Ray Train run per trial.

The shape of a sweep:

    load_config (validated before anything starts)
      -> ray.init: a local Ray instance, or the cluster RAY_ADDRESS names
      -> MLflow parent run (tracking.start_parent_run)
      -> Ray Tune, one function trial per grid point (_run_trial), max_concurrent_trials at once
           -> MLflow child run (opened by the sweep's TrialRuns actor, service/trial_runs.py)
           -> TorchTrainer(service.worker.train_loop_per_worker).fit(): world_size workers,
              rank 0 logs the trial into the child run
           -> the child run ends FINISHED, or FAILED with the error text (TrialRuns again)
      -> the parent run ends FINISHED; a table of the trials, read back from MLflow

Ray Train V2 (Ray >= 2.43) no longer accepts a trainer inside ``Tuner``: each Tune trial is a
plain function that builds and fits its own ``TorchTrainer``.

Ray is only here: the workers see plain PyTorch (service/worker.py) and MLflow is only behind
service/tracking.py. The Tune trial's process never imports MLflow (a second of CPU per trial
on its critical path): it asks the TrialRuns actor, which imported it once for the sweep.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from service.config import ConfigError, SweepConfig, TrialSpec, load_config

log = logging.getLogger("service.sweep")

# A Tune trial only waits on its TorchTrainer: it needs a sliver of a CPU, not a whole one.
TRIAL_DRIVER_CPUS = 0.01
# Summary metrics shown in the end-of-sweep table (logged by the worker's rank 0).
TABLE_METRICS = ("final_loss", "final_eval_accuracy", "time_to_target_s", "samples_per_s", "comm_bytes_per_step",
                 "compression_ratio")


_log_file: Path | None = None  # set by main(): where this process's log records go


class SweepError(Exception):
    """A problem the user can fix, reported as one line (e.g. a cluster too small)."""


@dataclass
class SweepOutcome:
    parent_run_id: str
    tracking_uri: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if r["status"] not in ("ok", "nan"))


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.sweep",
        description=(
            "Sweep PyTorch DDP gradient-communication hooks: one Ray Tune trial per "
            "(hook configuration, world size, seed), each a Ray Train TorchTrainer run, every "
            "trial recorded in MLflow (a parent run per sweep, a nested run per trial). "
            "The config is validated before anything starts."),
        epilog=(
            "Environment: RAY_ADDRESS - run on that Ray cluster instead of starting a local "
            "Ray instance; MLFLOW_TRACKING_URI - record there instead of ./mlflow.db (SQLite). "
            "A config's network: section (e.g. the preset network) runs every rank on its own "
            "emulated host, each host's link shaped by tc to network.link_gbps; it needs root "
            "(CAP_NET_ADMIN) and iproute2, and is refused in one line without them. "
            "Exit status: 0 every trial finished (ok or nan), 1 some trial failed or the sweep "
            "itself failed, 2 bad config or an environment that cannot run it, 130 interrupted."),
    )
    parser.add_argument(
        "config", metavar="CONFIG",
        help="the sweep's YAML file, or the name of a preset in tune_configs/ "
             "(e.g. smoke, quant, fp16, all_hooks)")
    parser.add_argument(
        "--dry-run", action="store_true",
        help="print the expanded trial list (hook, its params, world size, seed) and the "
             "trial count, then exit; starts no Ray and creates no MLflow run")
    parser.add_argument(
        "--resume", action="store_true",
        help="continue the latest sweep of this config's experiment (e.g. after Ctrl-C): run "
             "only the trials that did not finish, under the same MLflow parent run, continuing "
             "interrupted trials' runs (and their checkpoints) instead of creating new ones")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg, config_path = load_config(args.config)
        trials = cfg.trials()
    except ConfigError as exc:
        for line in exc.lines():  # every problem, one line each: fix them all in one go
            print(f"error: {line}", file=sys.stderr)
        return 2

    if args.dry_run:
        for trial in trials:
            print(trial.describe())
        print(f"{len(trials)} trial{'s' if len(trials) != 1 else ''}")
        return 0

    log_path = _start_log_file(cfg)
    try:
        outcome = run_sweep(cfg, config_path, trials, resume=args.resume)
    except SweepError as exc:
        log.error("sweep refused: %s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unexpected environment: one line here, the traceback in the log
        log.exception("sweep failed")
        print(f"error: the sweep failed: {_one_line(exc)} (details: {log_path})", file=sys.stderr)
        return 1

    report_line = write_report(cfg, outcome)  # first: it records each trial's time to target
    rows = trial_rows(outcome.parent_run_id, outcome.tracking_uri, trials)
    print()
    print(format_table(rows))
    print()
    print(f"{_count(len(outcome.rows), 'trial')}, {outcome.failed} failed. Log: {log_path}")
    print(mlflow_ui_hint(outcome.tracking_uri, outcome.parent_run_id))
    print(report_line, flush=True)
    if outcome.interrupted:
        print(f"Interrupted: unfinished trials ended KILLED. Finish them with: "
              f"python -m service.sweep {args.config} --resume")
        return 130
    return 1 if outcome.failed else 0


# --------------------------------------------------------------------------- the sweep


def run_sweep(cfg: SweepConfig, config_path: Path, trials: list[TrialSpec] | None = None, *,
              resume: bool = False, out: TextIO = sys.stdout,
              train_loop: Callable[[dict], None] | None = None) -> SweepOutcome:
    """Run the trials of ``cfg`` and return the table rows (read back from MLflow).

    ``resume``: continue the experiment's latest sweep (its parent run) and run only the
    trials without a FINISHED or FAILED run, reusing the runs of interrupted ones.
    ``train_loop`` is the per-worker function given to TorchTrainer (default:
    ``service.worker.train_loop_per_worker``).

    SIGINT/SIGTERM while trials run: the running trials are stopped, their runs and the
    parent end KILLED, and the outcome says ``interrupted`` (resume with ``resume=True``).
    """
    import ray

    from service import tracking
    from service.progress import ProgressBoard, ProgressPrinter
    from service.trial_runs import TrialRuns

    if _log_file is not None:  # main() keeps the terminal for the sweep's own lines
        _route_library_logs_to_file()

    trials = cfg.trials() if trials is None else trials
    # first of all, before MLflow or Ray is touched: refuses in one line and leaves nothing
    links = _prepare_network(cfg, trials, out)
    tracking_uri = tracking.resolve_tracking_uri()
    check_tracking_store(tracking_uri)  # before Ray starts: an unreachable store fails in seconds

    if train_loop is None:
        from service.worker import train_loop_per_worker as train_loop

    parent_run_id, reusable_runs, pending = None, {}, trials
    if resume:
        parent_run_id, reusable_runs, pending = plan_resume(cfg, trials, tracking_uri)
        print(f"Resuming sweep {cfg.name!r} (parent run {parent_run_id}): {len(trials) - len(pending)} of "
              f"{len(trials)} trials already finished, {len(pending)} to run", file=out, flush=True)
        if not pending:
            return SweepOutcome(parent_run_id, tracking_uri, trial_rows(parent_run_id, tracking_uri, trials))

    storage = storage_root(cfg)
    started = time.monotonic()
    _init_ray(cfg, pending)
    log.info("ray ready in %.1f s", time.monotonic() - started)
    check_cluster(cfg, pending, tracking_uri, storage)

    # Tune's console reporter (a config box, per-trial error banners) would interleave with
    # the progress lines; the legacy reporter at verbose=0 prints nothing.
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    # Tune's own SIGINT handler would wind the experiment down quietly and return as if it
    # had finished; ours makes SIGINT and SIGTERM one path that ends the runs KILLED. It is
    # in place before the parent run exists, so no signal can leave that run RUNNING.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    interrupted, interrupted_at_ms = False, None
    parent_status = "FAILED"
    board = printer = None
    with _signals_raise_keyboard_interrupt() as signal_received:
        try:
            if parent_run_id is None:
                parent_run_id = tracking.start_parent_run(cfg, str(config_path), tracking_uri=tracking_uri)
                print(f"Sweep {cfg.name!r}: {len(trials)} trials; MLflow parent run {parent_run_id} at {tracking_uri}",
                      file=out, flush=True)
            else:
                tracking.reopen_run(parent_run_id, tracking_uri)
            # Started before Tune, so its process start and MLflow import overlap Tune's own start.
            trial_runs = TrialRuns.remote(cfg, parent_run_id, tracking_uri)
            board = ProgressBoard.remote(len(trials), already_done=len(trials) - len(pending))
            printer = ProgressPrinter(board, out=out).start()
            _make_tuner(cfg, pending, parent_run_id, tracking_uri, storage, train_loop, reusable_runs,
                        resume, board, trial_runs, links).fit()
            parent_status = "FINISHED"
        except KeyboardInterrupt:
            interrupted = True
            interrupted_at_ms = signal_received["at_ms"] or int(time.time() * 1000)
            parent_status = "KILLED"
            print("\ninterrupted: stopping the running trials ...", file=out, flush=True)
        finally:
            if printer is not None:
                printer.stop()
            if interrupted:
                _tell_trials_interrupted(board)
                ray.shutdown()  # ends the trial actors, their Train controllers and workers
            if links is not None:  # the trials' emulated hosts, also of trials that were killed
                _remove_networks()
            if parent_run_id is not None:
                _close_leftover_runs(parent_run_id, tracking_uri, killed=parent_status != "FINISHED",
                                     interrupted_at_ms=interrupted_at_ms)
                tracking.end_run(parent_run_id, parent_status, tracking_uri=tracking_uri)
            log.info("sweep ended %s after %.1f s", parent_status, time.monotonic() - started)
    if parent_run_id is None:  # interrupted before the sweep's run existed: nothing to report
        raise KeyboardInterrupt

    rows = trial_rows(parent_run_id, tracking_uri, trials)
    return SweepOutcome(parent_run_id, tracking_uri, rows, interrupted)


def _make_tuner(cfg: SweepConfig, pending: list[TrialSpec], parent_run_id: str, tracking_uri: str,
                storage: str, train_loop: Callable[[dict], None], reusable_runs: dict[str, str],
                resume: bool, board, trial_runs, links=None):
    """A Tune experiment over ``pending``: one function trainable per trial (``_run_trial``).

    ``links``: {link_gbps: LinkMeasurement} when the config has a network: section."""
    from ray import tune

    # Train's per-trial directories hang off the parent run: a resumed trial finds its
    # checkpoints there, a new sweep never picks up an old sweep's.
    sweep_dir = f"{_safe(cfg.name)}-{parent_run_id[:8]}"
    trainable = tune.with_parameters(
        tune.with_resources(_run_trial, {"CPU": TRIAL_DRIVER_CPUS}),
        cfg=cfg, tracking_uri=tracking_uri, trials_storage=_join(storage, sweep_dir, "trials"),
        board=board, trial_runs=trial_runs, train_loop=train_loop, reusable_runs=reusable_runs,
        network=None if links is None else {"links": links, "owner_pid": os.getpid()},
    )
    tune_name = sweep_dir if not resume else f"{sweep_dir}-resumed-{time.strftime('%Y%m%d-%H%M%S')}"
    return tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search([t.to_dict() for t in pending])},
        tune_config=tune.TuneConfig(max_concurrent_trials=cfg.resources.max_concurrent_trials,
                                    trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(name=tune_name, storage_path=storage, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )


def plan_resume(cfg: SweepConfig, trials: list[TrialSpec],
                tracking_uri: str) -> tuple[str, dict[str, str], list[TrialSpec]]:
    """(parent run id, {trial key: run id to continue}, trials still to run) for --resume.

    The parent is the experiment's latest sweep run of the same config (its fingerprint). A
    trial is done when its run ended FINISHED or FAILED; a KILLED (interrupted) or still
    RUNNING run is continued, so no trial ever gets a second run.
    """
    from service import tracking

    same = tracking.latest_sweep_runs(cfg.name, tracking_uri, fingerprint=cfg.fingerprint())
    if not same:
        if tracking.latest_sweep_runs(cfg.name, tracking_uri):
            raise SweepError(f"nothing to resume: the sweeps of experiment {cfg.name!r} in {tracking_uri} ran a "
                             f"different config (workload, grid, faults or checkpoints changed since); "
                             f"run it without --resume to start a new sweep")
        raise SweepError(f"nothing to resume: no earlier sweep of experiment {cfg.name!r} in {tracking_uri}; "
                         f"run it without --resume")
    parent = same[0]
    done, reusable = set(), {}
    for run in tracking.child_runs(parent.info.run_id, tracking_uri):
        key = run.data.tags.get("trial_key")
        if not key:
            continue
        if run.info.status in ("FINISHED", "FAILED"):
            done.add(key)
            reusable.pop(key, None)
        elif key not in done:
            reusable[key] = run.info.run_id
    pending = [t for t in trials if t.key not in done]
    return parent.info.run_id, reusable, pending


@contextlib.contextmanager
def _signals_raise_keyboard_interrupt():
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (once: further signals
    are ignored until the block has cleaned up, so the runs get closed). Yields a dict whose
    ``at_ms`` is the signal's time (epoch ms), None until one came."""
    watched = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in watched}
    received: dict[str, int | None] = {"at_ms": None}

    def handler(signum, frame):
        received["at_ms"] = int(time.time() * 1000)
        for s in watched:
            signal.signal(s, signal.SIG_IGN)
        log.warning("received %s: stopping the sweep", signal.Signals(signum).name)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for s in watched:
        signal.signal(s, handler)
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _run_trial(config: dict, *, cfg: SweepConfig, tracking_uri: str, trials_storage: str, board,
               trial_runs, train_loop: Callable[[dict], None],
               reusable_runs: dict[str, str] | None = None, network: dict | None = None) -> None:
    """One Tune trial: a child MLflow run around one TorchTrainer fit, always closed.

    A failing fit ends the run FAILED with the error text and returns normally, so the
    sweep goes on with the other trials. The run is opened and closed by ``trial_runs``
    (service.trial_runs.TrialRuns): this process never imports MLflow, and says so in its
    Tune result (``trial_process_imported_mlflow``).
    """
    import ray
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from service import ray_runtime
    from service.cluster import torch_config as cluster_torch_config
    from service.progress import Publisher

    ray_runtime.apply_env()  # Ray Train settings that cut per-trial overhead (measured there)
    trial = TrialSpec.from_dict(config["trial"])
    # a resumed trial continues its interrupted run; the run id is needed before Train starts
    run_id = ray.get(trial_runs.open.remote(trial, (reusable_runs or {}).get(trial.key)))
    board.trial_started.remote(trial.key, trial.run_name, cfg.workload.steps)

    # network: this trial's emulated hosts (service/netem.py), owned by the driver's pid so the
    # driver removes them if this process is killed; the workers join them (worker.py)
    try:
        net = _trial_network(cfg, trial, network)
    except Exception as exc:  # e.g. a namespace that cannot be created: this trial fails, in one line
        summary = f"its emulated network: {_one_line(exc)}"
        ray.get(trial_runs.close.remote(run_id, "FAILED", summary))
        board.trial_ended.remote(trial.key, f"failed: {summary}")
        tune.report({"status": "failed", "error": summary, "run_id": run_id,
                     "trial_process_imported_mlflow": "mlflow" in sys.modules})
        return

    use_gpu = cfg.resources.use_gpu
    resources = {"CPU": cfg.resources.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = 1
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "trial": trial.to_dict(),
            "sweep": cfg.model_dump(),
            "tracking_uri": tracking_uri,
            "run_id": run_id,
            "progress": Publisher(board, trial.key),
            "network": {"hosts": [vars(h) for h in net.hosts]} if net else None,
        },
        scaling_config=ray.train.ScalingConfig(num_workers=trial.world_size, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        # across hosts gloo must not bind to a loopback hostname (service/cluster.py)
        torch_config=cluster_torch_config("nccl" if use_gpu else "gloo", ray.nodes()),
        run_config=ray.train.RunConfig(
            name=trial.run_name, storage_path=trials_storage,
            failure_config=ray.train.FailureConfig(max_failures=cfg.checkpoint.max_failures),
            callbacks=[TuneReportCallback()]),
    )
    try:
        try:
            trainer.fit()
        finally:
            if net is not None:
                _log_link(trial_runs, run_id, net, network["links"][trial.link_gbps])
    except Exception as exc:
        if _interrupted(board):  # torn down by Ctrl-C/SIGTERM: --resume runs it again
            ray.get(trial_runs.close.remote(run_id, "KILLED"))
            return
        summary, details = describe_failure(exc)
        ray.get(trial_runs.close.remote(run_id, "FAILED", f"{summary}\n{details}".strip()))
        board.trial_ended.remote(trial.key, f"failed: {summary}")
        tune.report({"status": "failed", "error": summary, "run_id": run_id,
                     "trial_process_imported_mlflow": "mlflow" in sys.modules})
        return
    status = ray.get(trial_runs.close.remote(run_id, "FINISHED"))
    board.trial_ended.remote(trial.key, status)
    tune.report({"status": status, "run_id": run_id,
                 "trial_process_imported_mlflow": "mlflow" in sys.modules})


def _prepare_network(cfg: SweepConfig, trials: list[TrialSpec], out: TextIO):
    """{link_gbps: LinkMeasurement} for a config with network: (None without): leftovers of
    killed sweeps removed, the machine checked and each link measured (service/link_measure.py)."""
    if cfg.network is None:
        return None
    from service import link_measure, netem

    # Ctrl-C/SIGTERM during the measurement: KeyboardInterrupt (even where the shell started us
    # with SIGINT ignored), and the measurement's hosts are removed on the way out
    with _signals_raise_keyboard_interrupt():
        try:
            return link_measure.prepare(cfg.network, [t.link_gbps for t in trials], out=out)
        except netem.NetemError as exc:
            raise SweepError(str(exc)) from None
        except KeyboardInterrupt:
            netem.remove_owned(os.getpid())
            raise


def _remove_networks() -> None:
    from service import netem

    removed = netem.remove_owned(os.getpid())
    if removed:
        log.info("removed the emulated hosts of stopped trials: %s", " ".join(removed))


def _trial_network(cfg: SweepConfig, trial: TrialSpec, network: dict | None):
    """The trial's emulated hosts (one per rank), created; None without network:."""
    if network is None or trial.link_gbps is None:
        return None
    from service import netem

    return netem.Network(trial.world_size, trial.link_gbps, cfg.network.latency_ms,
                         owner_pid=network["owner_pid"]).create()


def _log_link(trial_runs, run_id: str, net, measured) -> None:
    """The link the trial ran on, measured, and the bytes its hosts really sent; then the
    hosts are removed."""
    import ray

    try:
        metrics = {"link_measured_gbps": measured.measured_gbps,
                   "link_measured_latency_ms": measured.measured_latency_ms}
        try:
            metrics["link_tx_bytes"] = float(sum(net.tx_bytes()))  # whole frames, every host, whole trial
        except Exception as exc:  # noqa: BLE001 - a missing counter must not fail the trial
            log.warning("could not read the links' byte counters: %s", _one_line(exc))
        ray.get(trial_runs.log_metrics.remote(run_id, metrics))
    finally:
        net.remove()


def describe_failure(exc: BaseException) -> tuple[str, str]:
    """(one line naming the failing ranks and their errors, the first rank's traceback)."""
    failures = getattr(exc, "worker_failures", None)  # ray.train.WorkerGroupError
    if failures:
        parts, details = [], ""
        for rank in sorted(failures):
            base = getattr(failures[rank], "_base_exc", failures[rank])
            parts.append(f"rank {rank}: {_one_line(base)}")
            if not details:
                details = getattr(failures[rank], "_traceback_str", None) or str(failures[rank])
        return "; ".join(parts), details
    inner = getattr(exc, "controller_failure", None)  # ray.train.ControllerError
    if inner is not None:
        return f"Ray Train controller: {_one_line(inner)}", ""
    return _one_line(exc), "".join(traceback.format_exception(exc))


def _tell_trials_interrupted(board) -> None:
    """Mark the board interrupted before the trials are torn down (best effort, bounded)."""
    import ray

    if board is None:
        return
    try:
        ray.get(board.interrupt.remote(), timeout=5)
    except Exception as exc:  # the runs are still closed KILLED by _close_leftover_runs
        log.warning("could not tell the trials about the interruption: %s", _one_line(exc))


def _interrupted(board) -> bool:
    """Was the sweep interrupted? (asked by a trial whose fit failed; a board that no longer
    answers means the driver is gone, which is an interruption too)."""
    import ray

    try:
        return bool(ray.get(board.interrupted.remote(), timeout=5))
    except Exception:
        return True


def _close_leftover_runs(parent_run_id: str, tracking_uri: str, *, killed: bool,
                         interrupted_at_ms: int | None = None) -> None:
    """No child run is left RUNNING: an interrupted sweep's trials end KILLED; a trial
    whose process died before it could close its run ends FAILED.

    ``interrupted_at_ms``: when the signal came. A trial whose TorchTrainer was torn down by
    the interruption may get to close its own run FAILED first (a race with ``ray.shutdown``);
    a run that ended FAILED after the signal is such a trial, and becomes KILLED, so that
    ``--resume`` runs it again instead of taking it for a finished failure.
    """
    from service import tracking

    for run in tracking.child_runs(parent_run_id, tracking_uri):
        if (interrupted_at_ms is not None and run.info.status == "FAILED"
                and (run.info.end_time or 0) >= interrupted_at_ms):
            tracking.end_run(run.info.run_id, "KILLED", tracking_uri=tracking_uri)
        elif run.info.status == "RUNNING":
            if killed:
                tracking.end_run(run.info.run_id, "KILLED", tracking_uri=tracking_uri)
            else:
                tracking.end_run(run.info.run_id, "FAILED", tracking_uri=tracking_uri,
                                 error="the trial's process ended without closing its run "
                                       "(see the Ray logs of the sweep)")


# --------------------------------------------------------------------------- checks


def check_tracking_store(uri: str, timeout_s: float = 5.0) -> None:
    """Fail in the first seconds, naming the URI, when the tracking store does not answer.

    MLflow's client retries an unreachable server for minutes; a server is probed here on
    its /health endpoint with a short timeout instead. Other stores (SQLite, file) are
    opened once.
    """
    from service import tracking

    if tracking.is_server(uri):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
                if reply.status == 200:
                    return
                reason = f"HTTP {reply.status}"
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = _one_line(getattr(exc, "reason", None) or exc) if not isinstance(exc, ValueError) else str(exc)
        raise SweepError(f"the MLflow tracking server {uri} does not answer ({reason}); start it, "
                         f"or fix/unset MLFLOW_TRACKING_URI (unset: ./mlflow.db)")
    try:
        tracking.client(uri).search_experiments(max_results=1)
    except Exception as exc:
        raise SweepError(f"cannot open the MLflow tracking store {uri}: {_one_line(exc)}; "
                         f"fix or unset MLFLOW_TRACKING_URI (unset: ./mlflow.db)") from None


def check_cluster(cfg: SweepConfig, trials: list[TrialSpec], tracking_uri: str, storage: str) -> None:
    """Before any trial starts: the largest trial fits the cluster, and on a multi-host
    cluster the tracking store and the storage path are reachable from every host."""
    import ray

    largest = max(t.world_size for t in trials)
    cpw = cfg.resources.cpus_per_worker
    total = ray.cluster_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive", True)]
    need_cpu = largest * cpw + TRIAL_DRIVER_CPUS
    biggest_node = max((n.get("Resources", {}).get("CPU", 0) for n in nodes), default=0)
    if total.get("CPU", 0) + 1e-9 < need_cpu or biggest_node + 1e-9 < cpw:
        raise SweepError(
            f"world_size {largest} x cpus_per_worker {cpw:g} needs {need_cpu:g} CPUs but this Ray cluster "
            f"has {total.get('CPU', 0):g} (largest node {biggest_node:g}): it can never place that trial; "
            f"lower search.world_size or resources.cpus_per_worker, or add nodes")
    if cfg.resources.use_gpu and total.get("GPU", 0) < largest:
        raise SweepError(f"world_size {largest} with use_gpu needs {largest} GPUs but this Ray cluster has "
                         f"{total.get('GPU', 0):g}; lower search.world_size or set resources.use_gpu: false")
    if cfg.network is not None and len(nodes) > 1:
        raise SweepError(f"network: emulated hosts are namespaces on one machine, and this Ray cluster has "
                         f"{len(nodes)} nodes: run it on a single-node (local) Ray, or remove network:")
    try:
        from service.cluster import ClusterConfigError, check_storage_for_cluster, check_tracking_uri_for_cluster
    except ImportError:  # pragma: no cover - the cluster checks are optional
        return
    try:
        check_tracking_uri_for_cluster(tracking_uri, nodes)
        check_storage_for_cluster(storage, nodes)
    except ClusterConfigError as exc:
        raise SweepError(str(exc)) from None


# --------------------------------------------------------------------------- Ray


def cpus_needed(cfg: SweepConfig, trials: list[TrialSpec]) -> float:
    """Logical CPUs for max_concurrent_trials of the largest trials running at once."""
    largest = max(t.world_size for t in trials)
    concurrent = min(cfg.resources.max_concurrent_trials, len(trials))
    return concurrent * (largest * cfg.resources.cpus_per_worker + TRIAL_DRIVER_CPUS)


def _init_ray(cfg: SweepConfig, trials: list[TrialSpec]) -> None:
    import ray

    from service import ray_runtime

    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    gpus = None
    if cfg.resources.use_gpu:
        import torch

        gpus = torch.cuda.device_count()
        if gpus < max(t.world_size for t in trials):
            raise SweepError(f"use_gpu with world_size {max(t.world_size for t in trials)} needs that many "
                             f"GPUs; this machine has {gpus}; lower search.world_size or set "
                             f"resources.use_gpu: false")
    # Logical CPUs, not cores: a world size of 4 on a 2-core machine still runs (slower).
    # init_local retries Ray's fixed 30 s raylet start-up window on a loaded machine, and
    # kills what a timed-out attempt left behind.
    ray_runtime.init_local(max(1, math.ceil(cpus_needed(cfg, trials))), gpus)


# --------------------------------------------------------------------------- results


def trial_rows(parent_run_id: str, tracking_uri: str, trials: list[TrialSpec]) -> list[dict[str, Any]]:
    """One row per trial of the sweep, from its MLflow child run (trials in grid order)."""
    from service import tracking

    by_key: dict[str, Any] = {}
    for run in tracking.child_runs(parent_run_id, tracking_uri):
        key = run.data.tags.get("trial_key") or run.info.run_name
        by_key[key] = run  # the newest run of a trial wins
    rows = []
    for trial in trials:
        run = by_key.get(trial.key) or by_key.get(trial.run_name)
        row: dict[str, Any] = {"trial": trial.run_name, "hook": trial.hook,
                               "params": " ".join([f"{k}={v}" for k, v in trial.non_default_params().items()]
                                                  + ([f"link={trial.link_gbps:g}Gbit/s"]
                                                     if trial.link_gbps is not None else [])),
                               "world_size": trial.world_size, "seed": trial.seed}
        if run is None:
            row.update({m: None for m in TABLE_METRICS}, status="not run", nan_source="", run_id=None,
                       error="")
        else:
            row.update({m: run.data.metrics.get(m) for m in TABLE_METRICS})
            tags = run.data.tags
            row["status"] = tags.get("status", run.info.status.lower())  # ok | nan | failed | killed
            row["nan_source"] = tags.get("nan_source", "")
            row["error"] = (tags.get("error") or "").splitlines()[0] if tags.get("error") else ""
            row["run_id"] = run.info.run_id
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The end-of-sweep table: one row per trial."""
    headers = ["hook", "params", "world", "seed", "final loss", "eval acc", "to target s", "samples/s",
               "bytes/step", "compression", "status"]
    body = []
    for r in rows:
        body.append([
            r["hook"], r["params"] or "-", str(r["world_size"]), str(r["seed"]),
            _num(r["final_loss"], "{:.4f}"), _num(r["final_eval_accuracy"], "{:.3f}"),
            _num(r["time_to_target_s"], "{:.2f}"),
            _num(r["samples_per_s"], "{:,.0f}"), _bytes(r["comm_bytes_per_step"]),
            _num(r["compression_ratio"], "{:.2f}x"),
            f"{r['status']} ({r['nan_source']})" if r.get("nan_source") else r["status"],
        ])
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(headers)]
    right = {2, 3, 4, 5, 6, 7, 8, 9}

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(row) for row in body]
    for r in rows:
        if r.get("error"):
            out.append(f"  {r['trial']}: {r['error']}")
    return "\n".join(out).rstrip()


def mlflow_ui_hint(tracking_uri: str, parent_run_id: str) -> str:
    """Where to read the sweep in the MLflow UI: the command serving a local store, the trials'
    page and the sweep's run (both in the UI's model-training view, not its GenAI overview)."""
    from service import tracking

    experiment_id = tracking.experiment_id_of(parent_run_id, tracking_uri)
    command = tracking.ui_command(tracking_uri)
    lines = [f"MLflow: {command}" if command else f"MLflow: {tracking_uri}",
             f"  trials: {tracking.ui_url(tracking_uri, experiment_id)}",
             f"  sweep:  {tracking.ui_url(tracking_uri, experiment_id, parent_run_id)}"]
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _bytes(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) < 1024:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


# --------------------------------------------------------------------------- files and logs


def storage_root(cfg: SweepConfig) -> str:
    """Where Ray Tune and Ray Train keep their state: the config's storage_path (a local
    directory made absolute, or a URI such as s3://...), default ./results."""
    where = cfg.storage_path or "results"
    if "://" in where:
        return where
    return str(Path(where).expanduser().resolve())


def write_report(cfg: SweepConfig, outcome: SweepOutcome) -> str:
    """Build the sweep's report (service.report: plots, summary, report.html) into
    <storage>/<sweep>/report and attach it to the parent run; returns the line to print.
    A report that cannot be built is a one-line warning: the sweep's results are in MLflow."""
    root = storage_root(cfg)
    base = Path("results").resolve() if "://" in root else Path(root)
    out_dir = base / f"{_safe(cfg.name)}-{outcome.parent_run_id[:8]}" / "report"
    try:
        from service.report import build_report

        path = build_report(outcome.parent_run_id, outcome.tracking_uri, out_dir=out_dir, attach=True)
    except Exception as exc:  # noqa: BLE001 - the report must not fail a finished sweep
        log.exception("report failed")
        return (f"warning: no report: {_one_line(exc)} (rebuild it with: "
                f"python -m service.report {outcome.parent_run_id})")
    return f"Report: {path} (also attached to the parent run)"


def local_dir(cfg: SweepConfig) -> Path:
    """A directory on this machine for the sweep's log (storage_path when it is local)."""
    root = storage_root(cfg)
    base = Path("results").resolve() if "://" in root else Path(root)
    return base / _safe(cfg.name)


def _start_log_file(cfg: SweepConfig) -> Path:
    """Send this process's logging (ours and Ray's) to a file instead of the terminal."""
    directory = local_dir(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    global _log_file
    _log_file = path
    return path


def _route_library_logs_to_file() -> None:
    """Ray and MLflow install their own stderr handlers when imported; send their records
    to our log file (the root logger's handlers) instead, so the terminal shows only the
    sweep's own lines."""
    for name in ("ray", "ray.tune", "ray.train", "ray.data", "ray.air", "mlflow"):
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                logger.removeHandler(h)
        logger.propagate = True


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts]) if "://" in root else str(Path(root, *parts))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "sweep"


def _trial_dirname(trial) -> str:
    spec = trial.config.get("trial", {})
    try:
        return f"{TrialSpec.from_dict(spec).run_name}-{trial.trial_id}"
    except Exception:
        return trial.trial_id


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _one_line(exc: BaseException | str) -> str:
    if isinstance(exc, BaseException):
        text = str(exc).strip()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        first = lines[0].strip() if lines else ""
        # A traceback's message is its last line ("ValueError: ..."); otherwise the first.
        if first.startswith("Traceback") and lines:
            return lines[-1].strip()
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return " ".join(str(exc).split())


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy: Ray pickles _run_trial by reference,
    # and workers must find it as service.sweep._run_trial.
    from service.sweep import main as _main

    sys.exit(_main())
