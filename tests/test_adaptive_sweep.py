"""Adaptive seeds for real (issue 23): `python -m service.sweep` with `search.seed: {min: 2,
max: 3}`, a local Ray and a SQLite MLflow store, on the tiny workload at world size 1.

One sweep, shared by every assertion: it is interrupted (SIGINT) once round 1 and one trial of
round 2 have finished, then `--resume` finishes it. bf16_compress's gap to allreduce is ~1e-6 in
both seeds: decided (matches) at min, it gets no third seed; signsgd's two gaps (~1.3% and
~1.5%) leave its interval holding the 1% tolerance, so it and the baseline get seed 2.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = """
name: adaptive_test
workload:
  name: tests.tiny_workload:tiny_digits
  steps: 20
  global_batch_size: 32
  lr: 0.05
  eval_every: 10
  warmup_steps: 2
search:
  hooks: [allreduce, bf16_compress, signsgd]
  world_size: [1]
  seed: {min: 2, max: 3}
resources:
  cpus_per_worker: 1
  max_concurrent_trials: 1
tracking:
  flush_seconds: 1.0
"""


def _env(uri: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # always a local Ray
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))  # tests.tiny_workload
    return env


def _cmd(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "service.sweep", str(config), *extra]


def _children(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name("adaptive_test")
    runs = [] if exp is None else client.search_runs([exp.experiment_id], max_results=200)
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def _wait_until_finished(proc: subprocess.Popen, client: MlflowClient, count: int) -> None:
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if len([r for r in _children(client) if r.info.status == "FINISHED"]) >= count:
                return
        except Exception:  # the store is still being created by the sweep
            pass
        time.sleep(1)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adaptive")
    config = tmp / "adaptive.yaml"
    config.write_text(CONFIG)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    first = subprocess.Popen(_cmd(config), cwd=tmp, env=_env(uri), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_finished(first, client, 7)  # round 1 (6 trials) and the first of round 2
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    interrupted = {r.data.tags["trial_key"] for r in _children(client)}
    resumed = subprocess.run(_cmd(config, "--resume"), cwd=tmp, env=_env(uri), capture_output=True,
                             text=True, timeout=1200)
    return {"first": (first.returncode, out, err), "resumed": resumed, "client": client,
            "interrupted_keys": interrupted, "tmp": tmp}


def test_dry_run_prints_the_range_and_the_rule(tmp_path):
    config = tmp_path / "adaptive.yaml"
    config.write_text(CONFIG)
    dry = subprocess.run(_cmd(config, "--dry-run"), cwd=tmp_path, env=_env(f"sqlite:///{tmp_path}/m.db"),
                         capture_output=True, text=True, timeout=300)
    out = dry.stdout
    assert dry.returncode == 0, dry.stderr
    assert "6 to 9 trials (adaptive seeds 2 to 3)" in out
    assert "round 1: every configuration at seeds 0 to 1" in out and "split over the 2 looks" in out
    assert out.count("world_size=1") == 6  # round 1's trials, one line each


@pytest.mark.ray
def test_decided_at_min_gets_no_more_seeds_and_the_baseline_has_every_seed(sweep):
    rc, out, err = sweep["first"]
    assert rc == 130, f"{out}\n{err}"
    resumed = sweep["resumed"]
    assert resumed.returncode == 0, f"{resumed.stdout}\n{resumed.stderr}"
    runs = _children(sweep["client"])
    seeds = {}
    for r in runs:
        seeds.setdefault(r.data.tags["trial_config"], set()).add(int(r.data.tags["trial_seed"]))
    assert seeds["bf16_compress"] == {0, 1}                      # matched at min: no third seed
    assert seeds["signsgd-c512"] == {0, 1, 2}                    # undecided at min: one more
    assert seeds["allreduce"] == {0, 1, 2}                       # paired with every seed used
    assert all(r.info.status == "FINISHED" and r.data.tags["status"] == "ok" for r in runs)
    # the progress line showed the rounds; the headline the trials saved
    assert "round 2 of at most 2]" in out + resumed.stdout
    # round 2 as the first process planned it from its own trials' results (not from --resume's
    # read of MLflow): bf16_compress decided, so 6 + 2 trials (Ray Train's Result.metrics is
    # the last checkpoint's, None without one: round 1 once saw every loss as NaN, 6 + 3)
    assert "[6/8 trials done, round 2" in out and "/9 trials done" not in out
    assert "8 trials, 1 fewer than 3 seeds for every configuration (9)" in (
        next((sweep["tmp"] / "results").rglob("summary.md")).read_text())


@pytest.mark.ray
def test_resume_after_an_interrupt_finishes_without_duplicates(sweep):
    runs = _children(sweep["client"])
    keys = [r.data.tags["trial_key"] for r in runs]
    assert len(keys) == len(set(keys)) == 8                      # no seed ran twice
    assert sweep["interrupted_keys"] <= set(keys)                # the runs before the interrupt, kept
    assert "Resuming sweep" in sweep["resumed"].stdout
    parent = sweep["client"].get_run(runs[0].data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FINISHED"
    assert (parent.data.tags["seeds_min"], parent.data.tags["seeds_max"]) == ("2", "3")
    assert parent.data.tags["verdict.w1.loopback.bf16_compress"] == "matches"
    summary = next((sweep["tmp"] / "results").rglob("summary.csv"))
    rows = {r["configuration"]: r for r in csv.DictReader(summary.open())}
    assert rows["bf16_compress"]["verdict"] == "matches" and rows["bf16_compress"]["seeds"] == "0 1"
    assert rows["allreduce"]["seeds"] == "0 1 2"
    assert "not run" not in sweep["resumed"].stdout              # the table lists what ran
