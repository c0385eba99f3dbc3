"""The MLflow side of each Tune trial, kept out of the trial's process.

Every Tune trial is a fresh Python process (Ray never reuses one for an actor). When the trial
opened and closed its own MLflow run it imported ``mlflow`` first (~1.2 CPU-s, see
docs/performance.md), on the path of every trial before its TorchTrainer could start.
:class:`TrialRuns` is one small actor (0 CPUs) per sweep, started by the driver next to the
progress board: it imports ``service.tracking`` once and opens, tags and closes the trials'
runs when a trial asks (``ray.get`` on its methods; the trial needs its run id before its
TorchTrainer starts, so the call is synchronous). Calls are served one at a time, which also
keeps concurrent trials from contending for a SQLite store's write lock.

This module imports no MLflow at import time: a trial process that unpickles the actor's
handle must not pull it in.
"""

from __future__ import annotations

from typing import Any

import ray


@ray.remote(num_cpus=0)
class TrialRuns:
    """Opens and closes the MLflow runs of one sweep's trials (nested under ``parent_run_id``)."""

    def __init__(self, parent_run_id: str, tracking_uri: str):
        from service import tracking  # here, in the actor's process, once per sweep

        self._tracking = tracking
        self._parent_run_id = parent_run_id
        self._tracking_uri = tracking_uri
        # The first request of a process opens the store (a SQLite store checks its schema:
        # ~0.65 s measured): done now, while Tune starts, not in the first trial's open().
        tracking.client(tracking_uri).get_run(parent_run_id)

    def open(self, trial: Any, run_cfg: Any, reusable_run_id: str | None = None) -> str:
        """The run id for ``trial`` (a TrialSpec): ``reusable_run_id`` marked RUNNING again (a
        resumed trial continues its interrupted run), else a new child run with its params (from
        ``run_cfg``, the config the trial trains with) and its identity tags (``trial_key``, which
        --resume matches on, among them)."""
        if reusable_run_id:
            self._tracking.reopen_run(reusable_run_id, self._tracking_uri)
            return reusable_run_id
        return self._tracking.start_child_run(self._parent_run_id, trial, run_cfg,
                                              tracking_uri=self._tracking_uri)

    # ----- rank 0's writes during the trial (service/train/ray_entry.py's RunWriter): the ranks
    # never import mlflow nor open the store, ~2 s on the path of every trial's start

    def begin_attempt(self, run_id: str, kernel_backend: str, step_keys: tuple[str, ...]
                      ) -> tuple[int, frozenset[int], dict[str, int]]:
        """A trial attempt starts: (its number, the faults that already fired, and after a restart
        the last step each of ``step_keys`` was logged at), read from the run's tags and history;
        the attempt and ``kernel_backend`` (which quantization kernels ran) tagged on the run."""
        attempt, fired = self._tracking.restart_state(run_id, self._tracking_uri)
        self._tracking.record_attempt(run_id, self._tracking_uri, attempt, kernel_backend=kernel_backend)
        done = self._tracking.last_logged_steps(run_id, step_keys, self._tracking_uri) if attempt > 1 else {}
        return attempt, fired, done

    def log_points(self, run_id: str, points: list[tuple[str, float, int, int]]) -> None:
        """Step metrics, (key, value, timestamp ms, step) each, written at once."""
        with self._tracking.MetricLogger(run_id, self._tracking_uri) as logger:
            logger.log_points(points)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        self._tracking.set_tags(run_id, self._tracking_uri, **tags)

    def log_dict(self, run_id: str, dictionary: dict, artifact_file: str) -> None:
        with self._tracking.MetricLogger(run_id, self._tracking_uri) as logger:
            logger.log_dict(dictionary, artifact_file)

    def fault_fired(self, run_id: str, index: int, fault: Any) -> None:
        """Configured fault ``index`` fired, recorded before it takes effect (a restart skips it)."""
        self._tracking.record_fault_fired(run_id, self._tracking_uri, index, fault)

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        """Summary metrics the trial's process measured itself (e.g. its emulated link's)."""
        with self._tracking.MetricLogger(run_id, self._tracking_uri) as logger:
            logger.log_summary(**metrics)

    def close(self, run_id: str, status: str, error: str | None = None,
              fit_returned_at: float | None = None) -> tuple[str, float]:
        """End ``run_id`` FINISHED, FAILED (with ``error``) or KILLED; returns how it ended, as
        its ``status`` tag says (ok | nan | failed | killed), and its ``final_eval_loss`` (NaN:
        none logged), what adaptive seeds decide on. Read from the run: Ray Train's
        ``Result.metrics`` is the last checkpoint's report, None in a trial without one.
        ``fit_returned_at`` (unix s): the trial's tear-down phase is logged up to it."""
        if fit_returned_at is not None:
            self._tracking.log_teardown(run_id, fit_returned_at, self._tracking_uri)
        self._tracking.end_run(run_id, status, error=error, tracking_uri=self._tracking_uri)
        return self._tracking.run_outcome(run_id, self._tracking_uri)
