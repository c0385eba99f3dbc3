"""SweepReader: the read side, for the report, the end-of-sweep table and --resume (a sweep's
parent run, its trial records, metric histories and config; recording derived results)."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from service import uris
from service.step_model.trial import ARTIFACT as TIMELINE_ARTIFACT
from service.step_model.trial import TrialTimeline
from service.step_model.transport import ARTIFACT as TRANSPORT_ARTIFACT
from service.step_model.transport import CLUSTER_ARTIFACT
from service.step_model.transport import TransportFit
from service.text import one_line
from service.tracking.identity import TrialRecord
from service.tracking.store import PARENT_TAG, TRANSPORT_FAILED_TAG, StoreError, search_all_runs


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

    def step_timeline(self, run_id: str) -> TrialTimeline | None:
        """The trial's recorded step timeline (``step_timeline.json``, service/step_model/trial.py),
        or None when the trial recorded none (timeline_steps 0, nothing sampled, an older run)."""
        if not any(a.path == TIMELINE_ARTIFACT for a in self.client.list_artifacts(run_id)):
            return None
        return TrialTimeline.from_json(json.loads(self._artifact_text(run_id, TIMELINE_ARTIFACT)))

    def transport(self, parent_run_id: str) -> TransportFit | None:
        """The sweep's measured transport (``transport.json`` on its parent run), or None (a
        sweep from before it was measured, one with no W above 1)."""
        if not any(a.path == TRANSPORT_ARTIFACT for a in self.client.list_artifacts(parent_run_id)):
            return None
        return TransportFit.from_json(json.loads(self._artifact_text(parent_run_id, TRANSPORT_ARTIFACT)))

    def cluster_transport(self, parent_run_id: str) -> tuple[TransportFit, str] | None:
        """(report.cluster.transport's probe as the sweep copied it onto its parent run, the path it
        was copied from), or None: no such copy (no report.cluster.transport, or an older sweep)."""
        if not any(a.path == CLUSTER_ARTIFACT for a in self.client.list_artifacts(parent_run_id)):
            return None
        data = json.loads(self._artifact_text(parent_run_id, CLUSTER_ARTIFACT))
        return TransportFit.from_json({k: v for k, v in data.items() if k != "copied_from"}), data.get("copied_from", "")

    def transport_failure(self, parent_run_id: str) -> str | None:
        """Why the sweep's transport probe failed (one line), or None: measured, or never probed."""
        return self.client.get_run(parent_run_id).data.tags.get(TRANSPORT_FAILED_TAG)

    def _artifact_text(self, run_id: str, path: str) -> str:
        """One small artifact's text, without MLflow's download progress bar (a report reads one
        per trial: the bars would bury the sweep's own output)."""
        quiet = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
        before = os.environ.get(quiet)
        os.environ[quiet] = "false"
        try:
            with tempfile.TemporaryDirectory() as tmp:
                return Path(self.client.download_artifacts(run_id, path, tmp)).read_text(errors="replace")
        finally:
            if before is None:
                os.environ.pop(quiet, None)
            else:
                os.environ[quiet] = before

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
            return yaml_files[0], self._artifact_text(run_id, yaml_files[0])
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
        return search_all_runs(self.client, experiment_id, filter_string)
