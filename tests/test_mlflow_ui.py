"""The MLflow UI the sweep points users at, for real: `mlflow ui` on a temporary SQLite store
(127.0.0.1), pages rendered by headless Chromium. Issue 13: MLflow 3.17's UI opened the
experiment on its GenAI "Overview" (traces, token usage: all empty), not on the sweep's runs;
the sweep now prints the runs page and the sweep's run in the model-training view."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from service import tracking
from service.sweep.results import mlflow_ui_hint
from tests.dist_utils import free_port
from tests.test_report import run_chromium
from tests.test_worker import make_cfg, trial_of

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A store holding a sweep's parent run and one trial run, served by `mlflow ui`."""
    tmp = tmp_path_factory.mktemp("mlflow_ui")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cfg = make_cfg(world_sizes=(1,))
    parent = tracking.start_parent_run(cfg, None, tracking_uri=uri)
    child = tracking.start_child_run(parent, trial_of(cfg, 1), cfg, tracking_uri=uri)
    tracking.end_run(child, "FINISHED", tracking_uri=uri)
    tracking.end_run(parent, "FINISHED", tracking_uri=uri)
    port = free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow_cli), "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=5)
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "mlflow ui did not start"
            time.sleep(1)
    yield {"uri": uri, "base": base, "parent": parent, "child": child, "tmp": tmp}
    os.killpg(proc.pid, 15)
    proc.wait(timeout=30)


def _rendered(url: str, tmp_path: Path) -> str:
    return run_chromium(["--virtual-time-budget=20000", "--window-size=1400,900", "--dump-dom", url],
                        tmp_path, timeout=180).stdout


def test_the_experiment_is_marked_model_training(ui):
    experiment = tracking.client(ui["uri"]).get_experiment_by_name("worker-test")
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_the_printed_pages_open_on_the_runs_in_the_training_view(ui, tmp_path):
    hint = mlflow_ui_hint(ui["uri"], ui["parent"])
    lines = hint.splitlines()
    assert lines[0] == f"MLflow: mlflow ui --backend-store-uri {ui['uri']} --host 127.0.0.1 --port 5000"
    trials_url = lines[1].split("trials: ", 1)[1]
    sweep_url = lines[2].split("sweep:  ", 1)[1]
    assert sweep_url.split("?")[0].endswith(f"/runs/{ui['parent']}")
    parent_name = tracking.client(ui["uri"]).get_run(ui["parent"]).info.run_name
    # the printed URLs name port 5000; the test's server listens elsewhere
    runs_page = _rendered(trials_url.replace(tracking.LOCAL_UI, ui["base"]), tmp_path)
    assert parent_name in runs_page, runs_page[-3000:]
    assert "Detect Issues" not in runs_page and "No data available" not in runs_page  # GenAI overview
    run_page = _rendered(sweep_url.replace(tracking.LOCAL_UI, ui["base"]), tmp_path)
    assert parent_name in run_page and ui["parent"] in run_page
    assert "Detect Issues" not in run_page
