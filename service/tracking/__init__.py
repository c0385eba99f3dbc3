"""WHERE MLFLOW IS WRITTEN AND READ: the only package of the project that imports mlflow.

Everything goes through ``MlflowClient`` with explicit run ids, never through mlflow's
global "active run": the sweep driver and the trial's workers are different processes
(often on different nodes), and each of them addresses the same runs by id.

What a sweep records (the contract the UI, reports and tests rely on):

- experiment = the config's ``name``;
- one parent run per sweep invocation (tags ``config_path``, ``git_commit``; the config
  file as an artifact), created by :func:`start_parent_run`;
- one child run per trial, nested through the ``mlflow.parentRunId`` tag and named
  ``trial.run_name``, created by :func:`start_child_run` with the trial's params and its
  identity as tags, written once with the run (:func:`identity_tags`: ``trial_key``,
  ``trial_config``, ``trial_hook``, ``trial_hook_params`` as JSON, ``trial_world_size``,
  ``trial_seed``, ``trial_link_gbps``); :class:`SweepReader` reads them back as
  :class:`TrialRecord` objects, so no reader parses run names or string params;
- rank 0 of the trial logs step metrics and the summary into the child run through a
  batching :class:`MetricLogger` (a single ``log_metric`` costs ~10 ms on SQLite, a
  ``log_batch`` of 1000 points ~0.2 s); with ``tracking.timeline_steps`` it attaches the
  trial's step timeline (``step_timeline.json``, read back by ``SweepReader.step_timeline``);
- the sweep's transport, measured once before its trials, on the parent run
  (``transport.json``: :func:`log_transport`, read back by ``SweepReader.transport``; report.cluster.transport's
  copy, ``cluster_transport.json``: :func:`log_cluster_transport`, ``SweepReader.cluster_transport``), or the
  one-line reason its probe failed (tag ``transport_not_measured``: :func:`log_transport_failure`,
  read back by ``SweepReader.transport_failure``);
- :func:`end_run` closes a run FINISHED (tag ``status`` ok | nan), FAILED (``status``
  failed, tag ``error``) or KILLED (``status`` killed).

The modules, by what they hold:

    store.py     the tracking URI, the client, experiments, the UI's address; shared tags and limits
    runs.py      the parent and child runs, params, tags, run ends; what --resume asks
    identity.py  a trial's identity tags, written once and read back as TrialRecord
    logger.py    MetricLogger: rank 0's batching writer
    reader.py    SweepReader: the read side (report, end-of-sweep table, --resume)
"""

from service.tracking.identity import TRIAL_KEY_TAG, TrialRecord, identity_tags
from service.tracking.logger import MetricLogger
from service.tracking.reader import SweepReader
from service.tracking.runs import (child_runs, close_sweep_run, end_run, git_commit, last_logged_steps,
                                   latest_sweep_runs, log_cluster_transport, log_transport, log_transport_failure, open_sweep_run, record_attempt, record_fault_fired, restart_state,
                                   log_trial_params, log_teardown, reopen_run, run_outcome, run_tags, set_tags, start_child_run,
                                   start_parent_run, trial_params)
from service.tracking.store import (END_STATUSES, EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, LOCAL_UI, PARENT_TAG,
                                    RUN_NAME_TAG, UI_VIEW_QUERY, StoreError, absolute_uri, client,
                                    experiment_id_of, get_or_create_experiment, resolve_tracking_uri, ui_command,
                                    ui_url)

__all__ = ["END_STATUSES", "EXPERIMENT_KIND", "EXPERIMENT_KIND_TAG", "LOCAL_UI", "PARENT_TAG", "RUN_NAME_TAG",
           "TRIAL_KEY_TAG", "UI_VIEW_QUERY", "MetricLogger", "StoreError", "SweepReader", "TrialRecord",
           "absolute_uri", "child_runs", "client", "close_sweep_run", "open_sweep_run", "record_attempt", "record_fault_fired", "restart_state", "end_run", "experiment_id_of", "get_or_create_experiment",
           "git_commit", "identity_tags", "last_logged_steps", "latest_sweep_runs", "log_cluster_transport", "log_transport", "log_transport_failure",
           "log_trial_params",
           "log_teardown", "reopen_run", "resolve_tracking_uri", "run_outcome", "run_tags", "set_tags", "start_child_run", "start_parent_run",
           "trial_params", "ui_command", "ui_url"]
