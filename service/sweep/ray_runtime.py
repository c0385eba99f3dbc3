"""How this service starts and tunes Ray: the environment variables and ray.init arguments
that decide what a trial costs beyond its training (each one's measured effect, and the Ray
settings measured and not kept, are in docs/performance.md, "Per-trial overhead"; ``bench/overhead.py``
measures them).

    from service.sweep import ray_runtime
    ray_runtime.apply_env()                  # in the driver and in each Tune trial, before TorchTrainer
    ray_runtime.init_local(num_cpus=4)       # a local Ray instance with the settings below

Ray Train V2 reads these in the process that builds the ``TorchTrainer`` (our Tune trial) and
propagates what its controller and workers need, so setting them in the trial is enough on a
cluster too. A variable the user already set wins (``setdefault``).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import Any

from service.sweep.processes import LocalRay, children

# name -> (our value, Ray's default).
TRAIN_ENV: dict[str, tuple[str, str]] = {
    # The Train controller polls its workers at this interval, and every ray.train.report is
    # a barrier through it: a report waits up to one interval.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": ("0.2", "2.0"),
    # Train's controller and worker metrics callbacks (Prometheus gauges updated from every
    # worker and the controller loop): nothing here reads them; off saves their CPU per trial.
    "RAY_TRAIN_METRICS_ENABLED": ("0", "1"),
    # Train's per-worker chdir into the trial directory (one more remote call per worker at
    # start): the worker uses absolute paths only (tracking URI, checkpoints via Ray).
    "RAY_CHDIR_TO_TRIAL_DIR": ("0", "1"),
    # Train's preemption watcher: one more actor process per trial (importing ray.train), which
    # polls for cloud spot-node preemption notices; a sweep's nodes get none.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": ("0", "1"),
}


def apply_env(ray_defaults: bool = False) -> None:
    """Set TRAIN_ENV in this process unless the user already set a variable.

    ``ray_defaults=True`` (benchmarks only) sets Ray's own defaults instead, except the health
    check interval, which the service used before these settings were measured.
    """
    for name, (ours, default) in TRAIN_ENV.items():
        if ray_defaults and name != "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S":
            os.environ[name] = default
        else:
            os.environ.setdefault(name, ours)


# Ray starts every worker process (Tune trial, Train controller, Train workers) at nice 15 so
# its own daemons stay responsive. On a machine shared with other work that starves a trial
# behind everything else. A sweep is the user's foreground work: run its workers at the
# user's priority (Ray Jobs does the same for the drivers it starts). On an idle machine this
# changes nothing.
WORKER_NICENESS = 0


def local_init_kwargs(num_cpus: int, num_gpus: int | None = None, worker_niceness: int = WORKER_NICENESS,
                      system_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """ray.init arguments for a local instance started by the sweep (or a bench): no
    dashboard, worker output kept in Ray's log files (the terminal shows the sweep's lines),
    workers at the user's priority. ``system_config``: more Ray system settings (benches
    compare settings with it, e.g. bench/overhead.py's warm-worker profile)."""
    return dict(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                log_to_driver=False, configure_logging=False,
                _system_config={"worker_niceness": worker_niceness, **(system_config or {})})


# ray.init waits a hard-coded 30 s for its raylet to register; on a loaded machine that wait
# can run out although the node comes up a bit later.
INIT_ATTEMPTS = 3


def init_local(num_cpus: int, num_gpus: int | None = None, worker_niceness: int = WORKER_NICENESS,
               system_config: dict[str, Any] | None = None) -> LocalRay:
    """Start a local Ray instance with TRAIN_ENV applied (inherited by every Ray process),
    retrying the start-up timeout of a loaded machine; returns it (``.stop()`` ends all of it)."""
    import ray

    apply_env()
    for attempt in range(1, INIT_ATTEMPTS + 1):
        before = children()  # each as first seen: pid and start time (service/sweep/processes.py)
        try:
            with _sigterm_blocked():  # in every process ray.init starts, and theirs (processes.py)
                ray.init(**local_init_kwargs(num_cpus, num_gpus, worker_niceness, system_config))
            return LocalRay(children() - before)
        except Exception as exc:  # ray raises a bare Exception for this timeout
            # The timed-out node (GCS, raylet, monitors) was started as our children and is not
            # ours to reach through ray.shutdown(): left alive, each retry would add a whole Ray
            # instance to an already loaded machine. Stopped as a started instance is (its tree
            # read before the shutdown, only its own processes killed), at once: it never served.
            LocalRay(children() - before).stop()
            if "timed out during startup" not in str(exc) or attempt == INIT_ATTEMPTS:
                raise


@contextmanager
def _sigterm_blocked():
    """SIGTERM blocked in this thread meanwhile; a process started meanwhile inherits the block
    (as it does Ray's own block of SIGINT) and passes it on to the processes it starts.

    A scheduler stops a job by signalling its whole process group (``kill -TERM -PGID``), or
    every process of its cgroup (Slurm, systemd). The sweep handles that SIGTERM, closing its
    runs through its Ray instance; a GCS that took the signal too is gone, and a driver's call to
    a dead GCS blocks until Ray ends the process, exit 1, 60 s later (CI, stop 47). Blocked, the
    instance's processes leave the stop to the sweep, as they already do with Ctrl-C's SIGINT.
    A pending SIGTERM of this process's own is delivered when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
