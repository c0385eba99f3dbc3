"""One real sweep of both arms (search.compile: [false, true]): `python -m service.sweep` with a
local Ray and a SQLite MLflow store, allreduce and fp16_compress on the tiny workload at W = 2.
Both arms reach summary.csv and the report, every compiled trial's run carries compile_s, and the
compiled trials are judged against compiled allreduce (tests/test_compile.py: the rest)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.stores import store_uri
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parent.parent
CONFIG = """
name: compile_test
workload:
  name: tests.tiny_workload:tiny_digits
  steps: 12
  global_batch_size: 32
  lr: 0.05
  eval_every: 6
  warmup_steps: 2
search:
  hooks: [allreduce, fp16_compress]
  world_size: [2]
  compile: [false, true]
tracking:
  flush_seconds: 1.0
  paired_timing_every: 2
  transport_probe: false   # nothing here reads the transport: one Train start-up and probe fewer
"""
CONFIGS = ["allreduce", "allreduce-compiled", "fp16_compress", "fp16_compress-compiled"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compile_sweep")
    (tmp / "compile.yaml").write_text(CONFIG)
    uri = store_uri(tmp)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # always a local Ray
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))  # tests.tiny_workload
    done = subprocess.run([sys.executable, "-m", "service.sweep", "compile.yaml"], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("compile_test").experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    summary = next((tmp / "results").rglob("summary.csv"))
    return {"trials": {r.data.tags["trial_config"]: r for r in runs if "mlflow.parentRunId" in r.data.tags},
            "parent": parent, "rows": {row["configuration"]: row for row in csv.DictReader(summary.open())},
            "markdown": (summary.parent / "summary.md").read_text()}


def test_both_arms_reach_summary_csv_and_the_report(swept):
    assert sorted(swept["rows"]) == CONFIGS and all(r["ok"] == "1" for r in swept["rows"].values())
    assert all(f"| {config} |" in swept["markdown"] for config in CONFIGS)
    assert "Compiled trials (search.compile, workload.compile) record no step timeline" in swept["markdown"]


def test_every_compiled_trial_records_its_compilation_outside_its_steps(swept):
    for config, run in swept["trials"].items():
        m, compiled = run.data.metrics, config.endswith("-compiled")
        assert ("compile_s" in m) == compiled and run.data.params["compile"] == str(compiled), config
        if compiled:
            assert 0 < m["compile_s"] <= m["phase_compile_s"] <= m["compile_s"] + 0.5, m
            assert run.data.params["compile_mode"] == "default"
            # compilation is no step: the steps' time is far below it (seconds of inductor on 2 cores)
            assert m["step_time_ms_median"] * 12 / 1000.0 < m["compile_s"], m


def test_compiled_trials_are_judged_against_compiled_allreduce(swept):
    rows, trials, tags = swept["rows"], swept["trials"], swept["parent"].data.tags
    assert rows["allreduce"]["verdict"] == rows["allreduce-compiled"]["verdict"] == "baseline"
    gap = (trials["fp16_compress-compiled"].data.metrics["final_loss"]
           - trials["allreduce-compiled"].data.metrics["final_loss"])
    assert float(rows["fp16_compress-compiled"]["loss_gap_mean"]) == pytest.approx(gap, abs=1e-12)
    assert tags["verdict.w2.loopback.fp16_compress-compiled"] == rows["fp16_compress-compiled"]["verdict"]
    assert {"recommended.w2.loopback", "recommended.w2.loopback.compiled"} <= set(tags)
    assert tags["recommended.w2.loopback.compiled"].endswith("-compiled")
    # its paired windows timed compiled allreduce in the same (compiled) trial
    assert trials["fp16_compress-compiled"].data.metrics["paired_windows"] >= 1
