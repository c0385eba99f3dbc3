"""Issue 7, lever (a), for real: the Tune trial's process no longer imports MLflow.

Every Tune trial is a fresh Python process on the critical path of its TorchTrainer; importing
mlflow there cost ~1.2 CPU-s per trial (docs/performance.md). The trial now asks the sweep's
TrialRuns actor (service/trial_runs.py) to open and close its run, and reports whether
``mlflow`` is in its own ``sys.modules`` to Tune (its result.json). One real one-trial sweep
(`python -m service.sweep`, local Ray, a temporary SQLite store) checks both: the flag is
False, and the run is still complete (params, trial_key tag, FINISHED with status ok, and the
run id the trial reported to Tune).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(900)


def one_trial_config(tmp_path: Path) -> Path:
    config = tmp_path / "light_trial.yaml"
    config.write_text(f"""
name: light_trial
storage_path: {tmp_path / 'results'}
workload: {{name: mlp_digits, steps: 3, global_batch_size: 64, lr: 0.05, optimizer: sgd,
           eval_every: 3, warmup_steps: 1}}
search: {{hooks: [allreduce], world_size: [1], seed: [0]}}
resources: {{cpus_per_worker: 0.5, max_concurrent_trials: 1}}
tracking: {{flush_seconds: 2.0}}
""")
    return config


def tune_trial_results(storage: Path) -> list[dict]:
    """Every result a Tune trial reported (Tune's result.json files: one JSON per line)."""
    records = []
    for path in storage.rglob("result.json"):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if "trial_process_imported_mlflow" in r]


@pytest.mark.ray
def test_the_tune_trial_process_does_not_import_mlflow_and_its_run_is_complete(tmp_path):
    config = one_trial_config(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # always a local Ray
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "service.sweep", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"

    (reported,) = tune_trial_results(tmp_path / "results")
    assert reported["trial_process_imported_mlflow"] is False
    assert reported["status"] == "ok"

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("light_trial")
    runs = client.search_runs([experiment.experiment_id], max_results=10)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    (child,) = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert child.info.run_id == reported["run_id"]
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.info.run_name == "allreduce-w1-s0"
    assert child.data.tags["trial_key"], "the tag --resume matches runs on"
    assert child.info.status == "FINISHED" and child.data.tags["status"] == "ok"
    assert child.data.params["hook"] == "allreduce" and child.data.params["world_size"] == "1"
    assert len(client.get_metric_history(child.info.run_id, "loss")) == 3
