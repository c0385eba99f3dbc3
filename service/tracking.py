"""WHERE MLFLOW IS WRITTEN: the only module of the project that imports mlflow.

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
  ``log_batch`` of 1000 points ~0.2 s);
- :func:`end_run` closes a run FINISHED (tag ``status`` ok | nan), FAILED (``status``
  failed, tag ``error``) or KILLED (``status`` killed).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from mlflow.entities import Metric, Param, RunStatus, RunTag, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from service import uris
from service.text import one_line

PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
END_STATUSES = ("FINISHED", "FAILED", "KILLED")
# MLflow's per-request limits (mlflow.utils.validation).
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_TAGS_PER_BATCH = 100
_MAX_TAG_VALUE = 8000
_MAX_PARAM_VALUE = 6000


# --------------------------------------------------------------------------- store


def resolve_tracking_uri() -> str:
    """The tracking URI a sweep writes to.

    ``MLFLOW_TRACKING_URI`` when set (the standard variable), otherwise MLflow's own
    default store, SQLite ``mlflow.db`` in the working directory. Local paths are made
    absolute, because Ray starts workers in other working directories.
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        return f"sqlite:///{os.path.abspath('mlflow.db')}"
    return absolute_uri(uri)


def absolute_uri(uri: str) -> str:
    """``uri`` with a relative SQLite or file path made absolute (others unchanged)."""
    store = uris.tracking_store(uri)
    if store.kind == "sqlite" and store.path and store.path != ":memory:" and not os.path.isabs(store.path):
        return f"sqlite:///{os.path.abspath(store.path)}"
    if store.kind == "file" and not uri.startswith("file:"):  # a bare path means a file store
        return "file://" + os.path.abspath(uri)
    return uri


def client(tracking_uri: str | None = None) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri or resolve_tracking_uri())


def _artifact_location(tracking_uri: str, experiment_name: str) -> str | None:
    """Artifacts next to a SQLite database (not in whatever the cwd is); None lets the
    store (a server, a file store) choose."""
    store = uris.tracking_store(tracking_uri)
    if store.kind == "sqlite" and store.path is not None:
        db_dir = os.path.dirname(store.path) or os.getcwd()
        return "file://" + os.path.join(db_dir, "mlruns", _safe_name(experiment_name))
    return None


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "experiment"


# MLflow 3 reads this experiment tag to tell a model-training experiment from a GenAI one.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# MLflow 3.17's UI opens every experiment in its GenAI view (an empty traces "Overview") unless
# the URL names the model-training view; it then remembers the choice in the browser.
UI_VIEW_QUERY = "workflowType=machine_learning"
LOCAL_UI = "http://127.0.0.1:5000"


def get_or_create_experiment(name: str, tracking_uri: str | None = None) -> str:
    """The experiment id of ``name``, created (with artifacts beside a SQLite store) if
    it does not exist yet, and marked a model-training experiment."""
    uri = tracking_uri or resolve_tracking_uri()
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
            c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    try:
        return c.create_experiment(name, artifact_location=_artifact_location(uri, name),
                                   tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except MlflowException:  # created concurrently by another process
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def ui_command(tracking_uri: str) -> str | None:
    """The command that serves a local store's UI at LOCAL_UI (None for a tracking server)."""
    if uris.is_server(tracking_uri):
        return None
    return f"mlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1 --port 5000"


def ui_url(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI page of an experiment's runs (or of one run), in the model-training view."""
    base = tracking_uri.rstrip("/") if uris.is_server(tracking_uri) else LOCAL_UI
    page = f"/#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    return f"{base}{page}?{UI_VIEW_QUERY}"


def experiment_id_of(run_id: str, tracking_uri: str) -> str:
    return client(tracking_uri).get_run(run_id).info.experiment_id


# --------------------------------------------------------------------------- runs


def git_commit(path: str | None = None) -> str | None:
    """The commit of the git checkout holding ``path`` (default: this project), or None."""
    where = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(where):
        where = os.path.dirname(where)
    try:
        out = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def start_parent_run(cfg, config_path: str | None, tracking_uri: str | None = None) -> str:
    """Create the sweep's parent run in experiment ``cfg.name``; returns its run id.

    Tags: ``config_path`` and ``git_commit`` (when the project is a git checkout),
    ``seeds_min`` / ``seeds_max`` with adaptive seeds; the config file itself is logged as an
    artifact.
    """
    uri = tracking_uri or resolve_tracking_uri()
    c = client(uri)
    experiment_id = get_or_create_experiment(cfg.name, uri)
    tags = {"role": "sweep", "status": "running", "sweep_fingerprint": cfg.fingerprint(),
            "target_tolerance": repr(cfg.report.target_tolerance)}
    if cfg.search.adaptive is not None:  # the report judges the gaps by the rule these set
        tags.update(seeds_min=str(cfg.search.adaptive.min), seeds_max=str(cfg.search.adaptive.max))
    if config_path:
        tags["config_path"] = os.path.abspath(str(config_path))
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
        tags["mlflow.source.git.commit"] = commit
    run = c.create_run(experiment_id, tags=tags, run_name=cfg.name)
    if config_path and os.path.isfile(str(config_path)):
        c.log_artifact(run.info.run_id, str(config_path))
    return run.info.run_id


def trial_params(trial, cfg) -> dict[str, Any]:
    """The params of a trial's run: the hook, every hook parameter by its own name, the
    grid coordinates, the workload settings, the backend and the library versions."""
    wl = cfg.workload
    use_gpu = cfg.resources.use_gpu
    params: dict[str, Any] = {"hook": trial.hook}
    params.update(dict(trial.hook_params or {}))
    params.update({
        "world_size": trial.world_size,
        "seed": trial.seed,
        "workload": wl.name,
        "global_batch_size": wl.global_batch_size,
        "steps": wl.steps,
        "lr": wl.lr,
        "optimizer": wl.optimizer,
        "grad_accumulation": wl.grad_accumulation,
        "backend": "nccl" if use_gpu else "gloo",
        "torch_version": _version("torch"),
        "ray_version": _version("ray"),
    })
    if trial.link_gbps is not None:  # an emulated link (config network:)
        params.update(link_gbps=trial.link_gbps, latency_ms=cfg.network.latency_ms)
    return params


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def log_trial_params(run_id: str, trial, cfg, tracking_uri: str | None = None) -> None:
    """Log :func:`trial_params` into ``run_id`` (one batch)."""
    params = [Param(k, str(v)[:_MAX_PARAM_VALUE]) for k, v in trial_params(trial, cfg).items()]
    c = client(tracking_uri)
    for i in range(0, len(params), _MAX_PARAMS_TAGS_PER_BATCH):
        c.log_batch(run_id, params=params[i:i + _MAX_PARAMS_TAGS_PER_BATCH])


# A trial's identity, written as tags when its run is created (never parsed from the run name).
TRIAL_KEY_TAG = "trial_key"   # TrialSpec.key: what --resume matches on
_IDENTITY = {"config": "trial_config", "hook": "trial_hook", "hook_params": "trial_hook_params",
             "world_size": "trial_world_size", "seed": "trial_seed", "link_gbps": "trial_link_gbps"}


def identity_tags(trial) -> dict[str, str]:
    """The tags that say which trial (a TrialSpec) a run is: key, configuration label (the run
    name without its world size, seed and link: one label per configuration), hook, hook params
    as JSON, world size, seed and emulated link ("" on the ordinary network)."""
    return {TRIAL_KEY_TAG: trial.key,
            _IDENTITY["config"]: trial.config_label,
            _IDENTITY["hook"]: trial.hook,
            _IDENTITY["hook_params"]: json.dumps(dict(trial.hook_params), sort_keys=True),
            _IDENTITY["world_size"]: str(trial.world_size),
            _IDENTITY["seed"]: str(trial.seed),
            _IDENTITY["link_gbps"]: "" if trial.link_gbps is None else repr(float(trial.link_gbps))}


def start_child_run(parent_run_id: str, trial, cfg, tracking_uri: str | None = None) -> str:
    """Create a trial's run, nested under the sweep's parent run (same experiment), named
    ``trial.run_name``, with its identity tags (:func:`identity_tags`) and params; returns
    its run id."""
    c = client(tracking_uri)
    parent = c.get_run(parent_run_id)
    run = c.create_run(
        parent.info.experiment_id,
        tags={PARENT_TAG: parent_run_id, "role": "trial", "status": "running", **identity_tags(trial)},
        run_name=trial.run_name,
    )
    log_trial_params(run.info.run_id, trial, cfg, tracking_uri)
    return run.info.run_id


def child_runs(parent_run_id: str, tracking_uri: str | None = None) -> list:
    """The trial runs nested under ``parent_run_id`` (mlflow ``Run`` objects, oldest first)."""
    c = client(tracking_uri)
    parent = c.get_run(parent_run_id)
    runs = []
    token = None
    while True:
        page = c.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
            max_results=1000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def end_run(run_id: str, status: str, error: str | None = None,
            tracking_uri: str | None = None) -> None:
    """End ``run_id`` as FINISHED, FAILED or KILLED.

    FAILED sets tag ``status`` = failed and ``error`` = the error text (truncated to
    MLflow's tag limit); KILLED sets ``status`` = killed. FINISHED keeps the ``status``
    tag the worker wrote (ok | nan), or sets ok if there is none.
    """
    status = status.upper()
    if status not in END_STATUSES:
        raise ValueError(f"end_run status must be one of {', '.join(END_STATUSES)}, got {status!r}")
    c = client(tracking_uri)
    tags: dict[str, str] = {}
    if status == "FAILED":
        tags["status"] = "failed"
        if error:
            tags["error"] = _tail(str(error), _MAX_TAG_VALUE)
    elif status == "KILLED":
        tags["status"] = "killed"
    elif c.get_run(run_id).data.tags.get("status", "running") == "running":
        tags["status"] = "ok"
    if tags:
        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    c.set_terminated(run_id, status=RunStatus.to_string(RunStatus.from_string(status)))


def _tail(text: str, limit: int) -> str:
    """The end of ``text`` (a traceback's last lines say what went wrong)."""
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


def run_tags(run_id: str, tracking_uri: str | None = None) -> dict[str, str]:
    return dict(client(tracking_uri).get_run(run_id).data.tags)


def set_tags(run_id: str, tracking_uri: str | None = None, **tags: Any) -> None:
    """Set tags on ``run_id`` right away (one request)."""
    items = [RunTag(k, _tail(str(v), _MAX_TAG_VALUE)) for k, v in tags.items()]
    c = client(tracking_uri)
    for i in range(0, len(items), _MAX_PARAMS_TAGS_PER_BATCH):
        c.log_batch(run_id, tags=items[i:i + _MAX_PARAMS_TAGS_PER_BATCH])


def last_logged_steps(run_id: str, keys: Iterable[str],
                      tracking_uri: str | None = None) -> dict[str, int]:
    """For each metric key, the highest step already in ``run_id`` (-1 if none).

    A restarted trial uses this to log each step exactly once: points a crashed attempt
    already flushed are not logged again.
    """
    c = client(tracking_uri)
    out = {}
    for key in keys:
        history = c.get_metric_history(run_id, key)
        out[key] = max((m.step for m in history), default=-1)
    return out


# --------------------------------------------------------------------------- logger


class MetricLogger:
    """Batching metric logger for one run (used by rank 0 of a trial).

    ``log(step, **metrics)`` buffers points; the buffer goes out as ``log_batch`` requests
    when ``flush_seconds`` have passed since the last flush, on ``flush()`` and on
    ``close()``. Within each key, points are sent in step order, so a crash leaves a prefix
    of each key's history in the store. ``skip_through`` ({key: step}) drops points at or
    below a step that a previous attempt of the trial already logged.
    """

    def __init__(self, run_id: str, tracking_uri: str | None = None, flush_seconds: float = 5.0,
                 skip_through: dict[str, int] | None = None):
        self.run_id = run_id
        self.tracking_uri = tracking_uri or resolve_tracking_uri()
        self.flush_seconds = float(flush_seconds)
        self.skip_through = dict(skip_through or {})
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        self._buffer: list[Metric] = []
        self._last_flush = time.monotonic()
        self.points_logged = 0
        self.flush_seconds_spent = 0.0

    def log(self, step: int, **metrics: float) -> None:
        """Buffer one point per metric at ``step``; flush if it is time."""
        now_ms = int(time.time() * 1000)
        for key, value in metrics.items():
            if step <= self.skip_through.get(key, -1):
                continue
            self._buffer.append(Metric(key, float(value), now_ms, int(step)))
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def log_summary(self, step: int = 0, **metrics: float) -> None:
        """Log summary metrics (one value each) and flush."""
        now_ms = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now_ms, int(step)) for k, v in metrics.items())
        self.flush()

    def set_tags(self, **tags: Any) -> None:
        """Set tags right away (rare: status, provenance)."""
        set_tags(self.run_id, self.tracking_uri, **tags)

    def log_dict(self, dictionary: dict, artifact_file: str) -> None:
        """Store ``dictionary`` as a JSON (or YAML) artifact of the run."""
        self._client.log_dict(self.run_id, dictionary, artifact_file)

    def flush(self) -> None:
        """Send the buffered points, at most 1000 per request."""
        started = time.monotonic()
        while self._buffer:
            chunk = self._buffer[:_MAX_METRICS_PER_BATCH]
            self._send(chunk)
            del self._buffer[:len(chunk)]
            self.points_logged += len(chunk)
        self._last_flush = time.monotonic()
        self.flush_seconds_spent += self._last_flush - started

    def _send(self, chunk: list[Metric], attempts: int = 3) -> None:
        # A shared SQLite file can be briefly locked by another writer (the driver, another
        # trial): retry a couple of times before giving up.
        for attempt in range(attempts):
            try:
                self._client.log_batch(self.run_id, metrics=chunk)
                return
            except MlflowException:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "MetricLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- resume
# (added by the sweep driver for `python -m service.sweep CONFIG --resume`)


def latest_sweep_runs(experiment_name: str, tracking_uri: str | None = None, *,
                      fingerprint: str | None = None, max_results: int = 1) -> list:
    """The most recent parent runs (tag ``role`` = sweep) of ``experiment_name``, newest
    first; only those of config ``fingerprint`` (``SweepConfig.fingerprint``) when given."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment_name)
    if exp is None:
        return []
    where = "tags.role = 'sweep'"
    if fingerprint:
        where += f" and tags.sweep_fingerprint = '{fingerprint}'"
    return list(c.search_runs([exp.experiment_id], filter_string=where, max_results=max_results,
                              order_by=["attributes.start_time DESC"]))


def reopen_run(run_id: str, tracking_uri: str | None = None) -> None:
    """Mark an ended run RUNNING again (tag ``status`` = running): a resumed sweep continues
    its parent run and the runs of its unfinished trials instead of creating new ones."""
    c = client(tracking_uri)
    c.log_batch(run_id, tags=[RunTag("status", "running")])
    c.update_run(run_id, status="RUNNING")


# --------------------------------------------------------------------------- reading a sweep


class StoreError(Exception):
    """The store cannot answer what was asked (no such store, experiment or sweep): one line."""


@dataclass(frozen=True)
class TrialRecord:
    """One trial's run as the sweep recorded it: its identity (from the tags written when the run
    was created, typed again: hook params as the config had them) and what it logged."""

    run_id: str
    run_name: str
    key: str                        # TrialSpec.key
    config: str                     # the configuration's label, e.g. quantization_perchannel-c512
    hook: str
    hook_params: dict[str, Any]     # every hook parameter, defaults included, typed
    world_size: int
    seed: int
    link_gbps: float | None         # the emulated link, None on the ordinary network
    status: str                     # MLflow's: RUNNING | FINISHED | FAILED | KILLED
    start_time: int                 # epoch ms
    end_time: int | None
    metrics: dict[str, float]       # latest value of every metric
    params: dict[str, str]
    tags: dict[str, str]

    @classmethod
    def from_run(cls, run) -> "TrialRecord":
        tags = run.data.tags
        missing = [t for t in (TRIAL_KEY_TAG, *_IDENTITY.values()) if t not in tags]
        if missing:
            raise StoreError(f"trial run {run.info.run_name or run.info.run_id} ({run.info.run_id}) has no "
                             f"{missing[0]} tag: it was written by an older version of the service, "
                             f"which this one cannot read; run the sweep again")
        link = tags[_IDENTITY["link_gbps"]]
        return cls(run_id=run.info.run_id, run_name=run.info.run_name or run.info.run_id,
                   key=tags[TRIAL_KEY_TAG], config=tags[_IDENTITY["config"]], hook=tags[_IDENTITY["hook"]],
                   hook_params=json.loads(tags[_IDENTITY["hook_params"]]),
                   world_size=int(tags[_IDENTITY["world_size"]]), seed=int(tags[_IDENTITY["seed"]]),
                   link_gbps=float(link) if link else None, status=run.info.status,
                   start_time=run.info.start_time or 0, end_time=run.info.end_time,
                   metrics=dict(run.data.metrics), params=dict(run.data.params), tags=dict(tags))

    @property
    def state(self) -> str:
        """ok | nan | failed | killed | running: how the trial ended (or that it has not)."""
        if self.status in ("RUNNING", "KILLED", "FAILED"):
            return self.status.lower()
        tag = self.tags.get("status")
        if tag in ("ok", "nan", "failed"):
            return tag
        return "nan" if self.metrics.get("nan_detected", 0) >= 1 else "ok"

    @property
    def ended(self) -> bool:
        """FINISHED or FAILED: done for --resume (KILLED and RUNNING runs are continued)."""
        return self.status in ("FINISHED", "FAILED")


class SweepReader:
    """The read side of the contract above, for the report (service/report/), the end-of-sweep
    table and --resume: a sweep's parent run, its trial records, their metric histories and
    config; plus recording derived results and attaching files."""

    def __init__(self, tracking_uri: str | None = None):
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
        store = uris.tracking_store(uri)
        db_path = store.path if store.kind == "sqlite" else "mlflow.db" if not uri else None
        if db_path and db_path != ":memory:" and not Path(db_path).is_file():
            # MLflow would create an empty store there: a typo must not leave one behind.
            raise StoreError(f"no MLflow store at {os.path.abspath(db_path)} (set "
                              f"MLFLOW_TRACKING_URI or --tracking-uri, or run from the "
                              f"directory of the sweep's mlflow.db)")
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = self.client.tracking_uri

    def resolve_parent(self, ref: str) -> str:
        """A parent run id from a parent run id, a child run id, or an experiment name
        (its most recent parent run)."""
        if re.fullmatch(r"[0-9a-f]{32}", ref):
            try:
                run = self.client.get_run(ref)
            except MlflowException:
                run = None
            if run is not None:
                return run.data.tags.get(PARENT_TAG) or run.info.run_id
        try:
            experiment = self.client.get_experiment_by_name(ref)
        except MlflowException as e:
            raise StoreError(f"cannot read the MLflow store at {self.tracking_uri}: "
                              f"{one_line(e, with_type=False)}") from None
        if experiment is None:
            names = sorted(e.name for e in self.client.search_experiments() if e.name != "Default")
            raise StoreError(f"no MLflow experiment or run {ref!r} at {self.tracking_uri} "
                              f"(experiments there: {', '.join(names) or 'none'})")
        parents = [r for r in self._search(experiment.experiment_id, "")
                   if PARENT_TAG not in r.data.tags]
        if not parents:
            raise StoreError(f"experiment {ref!r} has no sweep (parent) run yet")
        return max(parents, key=lambda r: r.info.start_time or 0).info.run_id

    def get_run(self, run_id: str):
        return self.client.get_run(run_id)

    def experiment_name(self, experiment_id: str) -> str:
        return self.client.get_experiment(experiment_id).name

    def trials(self, parent_run_id: str) -> list["TrialRecord"]:
        """The trial records of a sweep, one per trial (of several runs of a trial, the newest),
        oldest first. Raises StoreError (one line) for a run that has no identity tags: one
        written by a version of the service from before they existed."""
        parent = self.client.get_run(parent_run_id)
        runs = self._search(parent.info.experiment_id, f"tags.`{PARENT_TAG}` = '{parent_run_id}'")
        newest: dict[str, TrialRecord] = {}
        for run in sorted(runs, key=lambda r: r.info.start_time or 0):
            record = TrialRecord.from_run(run)
            newest.pop(record.key, None)  # re-inserted: the dict keeps start order
            newest[record.key] = record
        return list(newest.values())

    def history(self, run_id: str, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of a step metric, in step order; empty arrays if never logged.
        A step logged twice (a trial restarted from a checkpoint in the same run) keeps its
        latest value."""
        latest = {}
        for m in sorted(self.client.get_metric_history(run_id, key),
                        key=lambda m: (m.step, m.timestamp)):
            latest[m.step] = m.value
        steps = sorted(latest)
        return (np.array(steps, dtype=np.int64),
                np.array([latest[s] for s in steps], dtype=np.float64))

    def config_text(self, run_id: str) -> tuple[str, str] | None:
        """(file name, text) of the sweep config the driver attached, if any."""
        try:
            artifacts = self.client.list_artifacts(run_id)
            yaml_files = [a.path for a in artifacts
                          if not a.is_dir and a.path.endswith((".yaml", ".yml"))]
            if not yaml_files:
                for a in artifacts:  # one level down (e.g. config/quant.yaml)
                    if a.is_dir:
                        yaml_files += [b.path for b in self.client.list_artifacts(run_id, a.path)
                                       if not b.is_dir and b.path.endswith((".yaml", ".yml"))]
            if not yaml_files:
                return None
            with tempfile.TemporaryDirectory() as tmp:
                local = self.client.download_artifacts(run_id, yaml_files[0], tmp)
                return yaml_files[0], Path(local).read_text(errors="replace")
        except Exception:  # a missing or unreadable config must not stop the report
            return None

    def record(self, run_id: str, metrics: dict[str, float] | None = None,
               tags: dict[str, str] | None = None) -> None:
        """Summary metrics (step 0) and tags derived after the fact (the report's answer)."""
        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in (metrics or {}).items()],
                              tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()])

    def attach(self, run_id: str, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(run_id, str(path))

    def _search(self, experiment_id: str, filter_string: str) -> list:
        runs, token = [], None
        while True:
            page = self.client.search_runs([experiment_id], filter_string,
                                           run_view_type=ViewType.ACTIVE_ONLY,
                                           max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs
