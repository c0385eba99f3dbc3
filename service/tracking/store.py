"""The tracking store: its URI, the client, experiments (created with artifacts beside a SQLite
store, marked model-training), the UI's address, and the tags and limits every writer shares."""

from __future__ import annotations

import os

from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from service import uris

PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
END_STATUSES = ("FINISHED", "FAILED", "KILLED")
# On a sweep's parent run where its transport probe failed: the one-line reason (the report says it).
TRANSPORT_FAILED_TAG = "transport_not_measured"
# MLflow's per-request limits (mlflow.utils.validation).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_TAG_VALUE = 8000
MAX_PARAM_VALUE = 6000
MAX_RESULTS_PER_PAGE = 1000  # runs per search_runs page

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


def search_all_runs(c: MlflowClient, experiment_id: str, filter_string: str,
                    order_by: list[str] | None = None) -> list:
    """Every active run of ``experiment_id`` that matches ``filter_string``, page after page."""
    runs, token = [], None
    while True:
        page = c.search_runs([experiment_id], filter_string, run_view_type=ViewType.ACTIVE_ONLY,
                             max_results=MAX_RESULTS_PER_PAGE, order_by=order_by, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


class StoreError(Exception):
    """The store cannot answer what was asked (no such store, experiment or sweep): one line."""
