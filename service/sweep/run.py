"""``run_sweep``: a sweep's trials run on Ray, every trial's MLflow run closed whatever happens.

Ray Train V2 (Ray >= 2.43) no longer accepts a trainer inside ``Tuner``: each Tune trial is a
plain function (``_run_trial``) that builds and fits its own ``TorchTrainer``. Ray pickles that
function by reference, so it lives here, in an importable module (``service.sweep.run``), and
never in the ``__main__`` that ``python -m service.sweep`` runs.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from service.config import SweepConfig, TrialSpec
from service.sweep import logs
from service.sweep.adaptive import SeedRounds, left_to_run
from service.sweep.capacity import TRIAL_DRIVER_CPUS, check_fits, cpus_needed
from service.sweep.checks import check_cluster, check_tracking_store
from service.sweep.context import SweepContext
from service.sweep.network import log_link, prepare_network, remove_networks, trial_network
from service.sweep.paths import safe_name, storage_root, trial_dirname
from service.sweep.results import SweepOutcome, trial_rows
from service.sweep.resume import plan_resume
from service.sweep.signals import signals_raise_keyboard_interrupt
from service.text import one_line
from service.uris import join

if TYPE_CHECKING:  # it imports Ray Tune: only when a sweep runs
    from service.sweep.searcher import SeedSearcher

log = logging.getLogger("service.sweep")


def run_sweep(cfg: SweepConfig, config_path: Path, trials: list[TrialSpec] | None = None, *,
              resume: bool = False, out: TextIO = sys.stdout,
              train_loop: Callable[[dict], None] | None = None,
              init_ray: Callable[[SweepConfig, list[TrialSpec]], None] | None = None) -> SweepOutcome:
    """Run the trials of ``cfg`` and return the table rows (read back from MLflow).

    ``resume``: continue the experiment's latest sweep (its parent run) and run only the
    trials without a FINISHED or FAILED run, reusing the runs of interrupted ones.
    ``train_loop`` is the per-worker function given to TorchTrainer (default:
    ``service.train.ray_entry.train_loop_per_worker``). ``init_ray(cfg, trials)`` connects to Ray (default:
    ``_init_ray``; a bench that started Ray itself passes one that does nothing).

    SIGINT/SIGTERM while trials run: the running trials are stopped, their runs and the
    parent end KILLED, and the outcome says ``interrupted`` (resume with ``resume=True``).
    """
    from service import tracking

    logs.route_library_logs_to_file()  # with main()'s log file: the terminal keeps the sweep's own lines
    trials = cfg.trials() if trials is None else trials
    # plan: the links first of all, before MLflow or Ray is touched (a refusal leaves nothing);
    # --resume first decides what is unfinished, and measures only the links it still needs
    links = None if resume else prepare_network(cfg, trials, out)
    tracking_uri = tracking.resolve_tracking_uri()
    check_tracking_store(tracking_uri)  # before Ray starts: an unreachable store fails in seconds
    adaptive = cfg.search.adaptive is not None  # seeds added while undecided: service/sweep/adaptive.py
    parent_run_id, reusable_runs, pending, done = None, {}, trials, {}
    if resume:
        plan = plan_resume(cfg, trials, tracking_uri)
        parent_run_id, reusable_runs, pending = plan.parent_run_id, plan.reusable_runs, plan.pending
        done = plan.done if adaptive else {}
        print(f"Resuming sweep {cfg.name!r} (parent run {parent_run_id}): {len(trials) - len(pending)} of "
              + (f"at most {len(trials)} trials already finished; the adaptive seeds go on from there"
                 if adaptive else f"{len(trials)} trials already finished, {len(pending)} to run"),
              file=out, flush=True)
        if not (left_to_run(seed_rounds(cfg, trials), done) if adaptive else pending) and cfg.search.plan is None:
            print("Nothing left to run.", file=out, flush=True)
            return SweepOutcome(parent_run_id, tracking_uri, trial_rows(parent_run_id, tracking_uri, trials,
                                                                        ran_only=adaptive))
        from service.sweep.plan_round import trials_to_measure  # it imports the report: only on resume

        links = prepare_network(cfg, trials_to_measure(cfg, trials, pending), out)  # the plan round's links too
    # check: Ray up, and the cluster can place and reach it all
    storage = storage_root(cfg)
    started = time.monotonic()
    local_ray = (init_ray or _init_ray)(cfg, pending or trials)  # a LocalRay when this sweep started one
    try:
        log.info("ray ready in %.1f s", time.monotonic() - started)
        check_cluster(cfg, pending or trials, tracking_uri, storage)
        # open the record, run the trials, close every run (whatever happens)
        run = _SweepRun(cfg, trials, pending, tracking_uri, storage, parent_run_id, reusable_runs, links)
        run.go(config_path, train_loop or _default_train_loop(), resume, out, done, local_ray)
        log.info("sweep ended %s after %.1f s", run.status, time.monotonic() - started)
    finally:
        if local_ray is not None:  # every process of the Ray instance it started, however it ended
            stop_ray(local_ray, out)  # a no-op where Ctrl-C's path in go() already stopped it
    if run.parent_run_id is None:  # interrupted before the sweep's run existed: nothing to report
        raise KeyboardInterrupt
    # report: the table, read back from MLflow
    rows = trial_rows(run.parent_run_id, tracking_uri, run.trials, ran_only=adaptive)  # the plan round's too
    return SweepOutcome(run.parent_run_id, tracking_uri, rows, run.status == "KILLED", run.trials)


def seed_rounds(cfg: SweepConfig, trials: list[TrialSpec]) -> SeedRounds:
    """The rounds of an adaptive sweep over ``trials`` (every configuration at max seeds)."""
    seeds = cfg.search.adaptive
    return SeedRounds(trials, seeds.min, seeds.max, cfg.report.target_tolerance)


def adaptive_range(cfg: SweepConfig, trials: list[TrialSpec]) -> str:
    """'8 to 20 trials': every configuration at min seeds, to every one at max."""
    return seed_rounds(cfg, trials).range_text()


def _default_train_loop() -> Callable[[dict], None]:
    from service.train import train_loop_per_worker

    return train_loop_per_worker


class _SweepRun:
    """The Tune experiment of one sweep between its parent run's opening and closing."""

    def __init__(self, cfg: SweepConfig, trials: list[TrialSpec], pending: list[TrialSpec], tracking_uri: str,
                 storage: str, parent_run_id: str | None, reusable_runs: dict[str, str], links):
        self.cfg, self.trials, self.pending, self.tracking_uri = cfg, trials, pending, tracking_uri
        self.storage, self.parent_run_id, self.reusable_runs, self.links = storage, parent_run_id, reusable_runs, links
        self.status = "FAILED"  # FINISHED | FAILED | KILLED (interrupted)

    def go(self, config_path: Path, train_loop: Callable[[dict], None], resume: bool, out: TextIO,
           done: dict, local_ray=None) -> None:
        """``done``: an adaptive sweep's outcomes so far (--resume), for its seed rounds;
        ``local_ray``: the Ray instance the sweep started (None: one it joined)."""
        from service import tracking
        from service.sweep.progress import ProgressBoard, ProgressPrinter
        from service.sweep.searcher import SeedSearcher
        from service.sweep.trial_runs import TrialRuns
        from service.sweep.transport import measure_transport

        # Tune's console reporter (a config box, per-trial error banners) would interleave with
        # the progress lines; the legacy reporter at verbose=0 prints nothing.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
        # Tune's own SIGINT handler would wind the experiment down quietly and return as if it
        # had finished; ours makes SIGINT and SIGTERM one path that ends the runs KILLED. It is
        # in place before the parent run exists, so no signal can leave that run RUNNING.
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        cfg, uri, interrupted_at_ms, board = self.cfg, self.tracking_uri, None, None
        with signals_raise_keyboard_interrupt() as signal_received:
            printer = None
            try:
                self.parent_run_id = tracking.open_sweep_run(cfg, str(config_path), uri, self.parent_run_id)
                tracking.log_cluster_transport(self.parent_run_id, uri, cfg.report.cluster)  # reports read this copy
                if not resume:
                    size = (f"{adaptive_range(cfg, self.trials)} (adaptive seeds)" if cfg.search.adaptive is not None
                            else f"{len(self.trials)} trials")
                    print(f"Sweep {cfg.name!r}: {size}; MLflow parent run {self.parent_run_id} at {uri}",
                          file=out, flush=True)
                measure_transport(cfg, self.trials, self.parent_run_id, uri, self.storage, out,
                                  autoscaling_requests=local_ray is None)
                # Started before Tune, so its process start and MLflow import overlap Tune's own start.
                trial_runs = TrialRuns.remote(self.parent_run_id, uri)
                board = ProgressBoard.remote(len(self.trials), already_done=len(self.trials) - len(self.pending))
                printer = ProgressPrinter(board, out=out).start()
                search = (SeedSearcher(seed_rounds(cfg, self.trials), done, board)
                          if cfg.search.adaptive is not None else None)
                sweep, tune_name = self._context(train_loop, board, trial_runs, resume, local_ray is None)
                if self.pending:  # --resume of a sweep whose plan round is all that is left: none
                    _make_tuner(sweep, self.pending, tune_name, self.storage, search).fit()
                if cfg.search.plan is not None:
                    self._plan_round(sweep, tune_name, board, out)
                self.status = "FINISHED"
            except KeyboardInterrupt:
                self.status, interrupted_at_ms = "KILLED", signal_received["at_ms"] or int(time.time() * 1000)
                print("\ninterrupted: stopping the running trials ...", file=out, flush=True)
            finally:
                if printer is not None:
                    printer.stop()
                if self.status == "KILLED":
                    _tell_trials_interrupted(board)
                    stop_ray(local_ray, out)  # ends the trial actors, their Train controllers and workers
                if self.links is not None:  # the trials' emulated hosts, also of trials that were killed
                    remove_networks()
                if self.parent_run_id is not None:  # every child run closed, then the parent
                    tracking.close_sweep_run(self.parent_run_id, uri, self.status, interrupted_at_ms)


    def _plan_round(self, sweep: SweepContext, tune_name: str, board, out: TextIO) -> None:
        """search.plan's last round (service/sweep/plan_round.py): the plan designed from the
        trials recorded so far, its trials not yet ended run; all of them join ``self.trials``."""
        from service import tracking
        from service.sweep import plan_round

        try:
            plan = plan_round.design(self.cfg, self.parent_run_id, self.tracking_uri)
            records = tracking.SweepReader(self.tracking_uri).trials(self.parent_run_id)
        except Exception as exc:  # the configured trials stand; the round says why it could not run
            print(f"Plan round: could not design a plan: {one_line(exc)}", file=out, flush=True)
            return
        trials = plan_round.plan_trials(self.cfg, self.trials, plan, {r.key for r in records})
        plan_round.announce(plan, trials, out)
        ended = {r.key for r in records if r.ended}
        todo = [t for t in trials if t.key not in ended]
        self.trials = self.trials + trials
        if todo:
            board.add_trials.remote(len(todo))
            _make_tuner(sweep, todo, f"{tune_name}-plan", self.storage).fit()

    def _context(self, train_loop: Callable[[dict], None], board, trial_runs, resume: bool,
                 autoscaling_requests: bool) -> tuple[SweepContext, str]:
        """What every trial of this sweep runs with, and the Tune experiment's name."""
        # Train's per-trial directories hang off the parent run: a resumed trial finds its
        # checkpoints there, a new sweep never picks up an old sweep's.
        sweep_dir = f"{safe_name(self.cfg.name)}-{self.parent_run_id[:8]}"
        network = None if self.links is None else {"links": self.links, "owner_pid": os.getpid()}
        sweep = SweepContext(self.cfg, self.tracking_uri, join(self.storage, sweep_dir, "trials"), board, trial_runs,
                             train_loop, self.reusable_runs, network, autoscaling_requests)
        return sweep, sweep_dir if not resume else f"{sweep_dir}-resumed-{time.strftime('%Y%m%d-%H%M%S')}"


def _make_tuner(sweep: SweepContext, pending: list[TrialSpec], tune_name: str, storage: str,
                search: SeedSearcher | None = None):
    """A Tune experiment ``tune_name`` over ``pending``: one function trainable per trial
    (``_run_trial``), each given ``sweep``. ``search``: adaptive seeds; its rounds propose the
    trials (at most ``pending``), in place of the grid."""
    from ray import tune

    cfg = sweep.cfg
    trainable = tune.with_parameters(tune.with_resources(_run_trial, {"CPU": TRIAL_DRIVER_CPUS}), sweep=sweep)
    grid = {"trial": tune.grid_search([t.to_dict() for t in pending])}
    return tune.Tuner(
        trainable,
        param_space=grid if search is None else {},
        tune_config=tune.TuneConfig(max_concurrent_trials=cfg.resources.max_concurrent_trials,
                                    trial_dirname_creator=trial_dirname, search_alg=search,
                                    # one Tune trial process for every trial (they all ask for the same
                                    # sliver of a CPU): a fresh one imported Tune, torch and the service
                                    # again, ~3.7 s between every two trials (docs/performance.md)
                                    reuse_actors=True,
                                    num_samples=1 if search is None else max(1, len(pending))),
        run_config=tune.RunConfig(name=tune_name, storage_path=storage, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )


def _run_trial(config: dict, *, sweep: SweepContext) -> None:
    """One Tune trial: a child MLflow run around one TorchTrainer fit, always closed.

    A failing fit ends the run FAILED with the error text and returns normally, so the
    sweep goes on with the other trials. The run is opened and closed by ``sweep.trial_runs``
    (service.sweep.trial_runs.TrialRuns): this process never imports MLflow, and says so in its
    Tune result (``trial_process_imported_mlflow``).
    """
    import ray
    from ray import tune

    from service.sweep import ray_runtime

    ray_runtime.apply_env()  # Ray Train settings that cut per-trial overhead (measured there)
    trial = TrialSpec.from_dict(config["trial"])
    trial_runs, board, network = sweep.trial_runs, sweep.board, sweep.network
    # the config this trial trains with (a timing run's own steps), built here once and handed to
    # its run's params (TrialRuns) and to its workers
    run_cfg = sweep.cfg.run_config(trial)
    # a resumed trial continues its interrupted run; the run id is needed before Train starts
    run_id = ray.get(trial_runs.open.remote(trial, run_cfg, sweep.reusable_runs.get(trial.key)))
    board.trial_started.remote(trial.key, trial.run_name, run_cfg.workload.steps)

    # network: this trial's emulated hosts (service/network/netem.py), owned by the driver's pid so the
    # driver removes them if this process is killed; the workers join them (service/train/ray_entry.py)
    try:
        net = trial_network(sweep.cfg, trial, network)
    except Exception as exc:  # e.g. a namespace that cannot be created: this trial fails, in one line
        return _trial_failed(trial, run_id, trial_runs, board, f"its emulated network: {one_line(exc)}")
    trainer = _trainer(sweep, trial, run_cfg, run_id, net)
    try:
        try:
            trainer.fit()
        finally:
            if net is not None:
                log_link(trial_runs, run_id, net, network["links"][trial.link_gbps])
    except Exception as exc:
        if _interrupted(board):  # torn down by Ctrl-C/SIGTERM: --resume runs it again
            ray.get(trial_runs.close.remote(run_id, "KILLED"))
            return
        summary, details = describe_failure(exc)
        return _trial_failed(trial, run_id, trial_runs, board, summary, details)
    # final_eval_loss: what adaptive seeds decide on (service/sweep/searcher.py), from the run
    status, final_eval_loss = ray.get(trial_runs.close.remote(run_id, "FINISHED", fit_returned_at=time.time()))
    board.trial_ended.remote(trial.key, status)
    tune.report({"status": status, "run_id": run_id, "final_eval_loss": final_eval_loss,
                 "trial_process_imported_mlflow": "mlflow" in sys.modules})


def _trial_failed(trial: TrialSpec, run_id: str, trial_runs, board, summary: str, details: str = "") -> None:
    """The trial's run ends FAILED with the error text; the board and Tune are told in one line."""
    import ray
    from ray import tune

    ray.get(trial_runs.close.remote(run_id, "FAILED", f"{summary}\n{details}".strip()))
    board.trial_ended.remote(trial.key, f"failed: {summary}")
    tune.report({"status": "failed", "error": summary, "run_id": run_id,
                 "trial_process_imported_mlflow": "mlflow" in sys.modules})


def _trainer(sweep: SweepContext, trial: TrialSpec, run_cfg: SweepConfig, run_id: str, net):
    """The trial's TorchTrainer: world_size workers running ``sweep.train_loop`` on ``run_cfg``
    (the trial's own config), restarted from the last checkpoint up to checkpoint.max_failures
    times, reporting to Tune."""
    import ray
    import ray.train

    from service.sweep.cluster import torch_config as cluster_torch_config
    from service.sweep.lean_trainer import LeanTorchTrainer
    from service.sweep.progress import Publisher

    use_gpu = run_cfg.resources.use_gpu
    resources = {"CPU": run_cfg.resources.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = 1
    return LeanTorchTrainer(
        sweep.train_loop,
        train_loop_config={
            "trial": trial.to_dict(),
            "run_config": run_cfg.model_dump(),
            "trial_runs": sweep.trial_runs,  # rank 0 writes the run through it (service/train/ray_entry.py)
            "run_id": run_id,
            "progress": Publisher(sweep.board, trial.key),
            "network": {"hosts": [vars(h) for h in net.hosts]} if net else None,
            "trial_started_at": time.time(),  # its start-up phase runs from here to the first step
        },
        scaling_config=ray.train.ScalingConfig(num_workers=trial.world_size, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        # across hosts gloo must not bind to a loopback hostname (service/sweep/cluster.py)
        torch_config=cluster_torch_config("nccl" if use_gpu else "gloo", ray.nodes()),
        autoscaling_requests=sweep.autoscaling_requests,
        run_config=ray.train.RunConfig(
            name=trial.run_name, storage_path=sweep.trials_storage,
            # no TuneReportCallback: Tune reads only _run_trial's own report (service/sweep/lean_trainer.py)
            failure_config=ray.train.FailureConfig(max_failures=run_cfg.checkpoint.max_failures)),
    )


def describe_failure(exc: BaseException) -> tuple[str, str]:
    """(one line naming the failing ranks and their errors, the first rank's traceback)."""
    failures = getattr(exc, "worker_failures", None)  # ray.train.WorkerGroupError
    if failures:
        parts, details = [], ""
        for rank in sorted(failures):
            base = getattr(failures[rank], "_base_exc", failures[rank])
            parts.append(f"rank {rank}: {one_line(base)}")
            if not details:
                details = getattr(failures[rank], "_traceback_str", None) or str(failures[rank])
        return "; ".join(parts), details
    inner = getattr(exc, "controller_failure", None)  # ray.train.ControllerError
    if inner is not None:
        return f"Ray Train controller: {one_line(inner)}", ""
    return one_line(exc), "".join(traceback.format_exception(exc))


def _tell_trials_interrupted(board) -> None:
    """Mark the board interrupted before the trials are torn down (best effort, bounded)."""
    import ray

    if board is None:
        return
    try:
        ray.get(board.interrupt.remote(), timeout=5)
    except Exception as exc:  # the runs are still closed KILLED, by tracking.close_sweep_run
        log.warning("could not tell the trials about the interruption: %s", one_line(exc))


def _interrupted(board) -> bool:
    """Was the sweep interrupted? (asked by a trial whose fit failed; a board that no longer
    answers means the driver is gone, which is an interruption too)."""
    import ray

    try:
        return bool(ray.get(board.interrupted.remote(), timeout=5))
    except Exception:
        return True


def stop_ray(local_ray, out: TextIO) -> None:
    """Ray shut down; with a local instance this sweep started (``local_ray``), every one of its
    processes stopped (service/sweep/processes.py), and a line on ``out`` if one would not stop.
    Where a Ctrl-C came while the transport probe's thread was inside Ray, the driver does not
    disconnect (transport.probe_interrupted: that crashed the process); the CLI then leaves by os._exit."""
    from service.sweep.transport import probe_interrupted

    inside = probe_interrupted()
    if inside:
        log.info("interrupted inside the transport probe: its thread was inside Ray, so this "
                 "driver does not disconnect (it exits at once after the report)")
    if local_ray is None:
        import ray

        if not inside:
            ray.shutdown()  # a cluster's Ray (or a bench's own): this driver disconnects, its trials end
        return
    left = local_ray.stop(disconnect=not inside)
    if left:
        print(f"warning: could not stop {len(left)} process(es) of this sweep's Ray instance "
              f"(pids {' '.join(map(str, sorted(left)))}): kill them by hand", file=out, flush=True)


def _init_ray(cfg: SweepConfig, trials: list[TrialSpec]):
    """Connect to the cluster RAY_ADDRESS names (returns None), or start a local Ray instance
    (returns it, a processes.LocalRay: the sweep stops all of it at its end)."""
    import ray

    from service.sweep import ray_runtime

    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        ray.init(address=address, log_to_driver=False)
        return None
    gpus = None
    if cfg.resources.use_gpu:
        import torch

        gpus = torch.cuda.device_count()
        check_fits(cfg, trials, where="this machine", gpus=gpus)
    # Logical CPUs, not cores: a world size of 4 on a 2-core machine still runs (slower).
    # init_local retries Ray's fixed 30 s raylet start-up window on a loaded machine, and
    # kills what a timed-out attempt left behind.
    return ray_runtime.init_local(max(1, math.ceil(cpus_needed(cfg, trials))), gpus)
