"""A sweep recorded by the code from before the folders moved (07d42ab: service/ as loose modules)
resumes with this checkout: the old code runs the sweep from a `git worktree` of that commit and
is interrupted mid-trial (SIGINT), then this checkout's `--resume` finishes it under the same
parent run, continuing the interrupted trial's run from its checkpoint, every trial once.

What it guards: the trial keys, identity tags, run params and checkpoints a sweep leaves in
MLflow and on disk are what --resume reads back, and moving modules must not change them.
Slow by nature (two sweeps of two trials: Ray start-up, Ray Train per trial).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.test_resume import (CONFIG, STEPS, all_runs, assert_left_closed, children, parents, sweep_cmd,
                               wait_for_a_trial_mid_training)

ROOT = Path(__file__).resolve().parent.parent
BEFORE_THE_MOVE = "07d42ab"  # the last commit with the loose service/ modules

pytestmark = [pytest.mark.ray, pytest.mark.timeout(3600)]


def _git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def old_checkout(tmp_path):
    """This repository at BEFORE_THE_MOVE, as a detached worktree (removed afterwards)."""
    if _git("cat-file", "-e", f"{BEFORE_THE_MOVE}^{{commit}}").returncode != 0:
        pytest.skip(f"git history without {BEFORE_THE_MOVE} (a shallow clone or an exported tree): "
                    "the resume across the folder move needs the commit from before it")
    tree = tmp_path / "before-the-move"
    added = _git("worktree", "add", "--detach", str(tree), BEFORE_THE_MOVE)
    assert added.returncode == 0, added.stderr
    try:
        yield tree
    finally:
        _git("worktree", "remove", "--force", str(tree))


def _env(uri: str, code: Path) -> dict:
    """A local Ray (no RAY_ADDRESS) whose every process imports `hooks` and `service` from ``code``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", PYTHONPATH=str(code))
    return env


def test_a_sweep_recorded_before_the_move_resumes_after_it(tmp_path, old_checkout):
    work = tmp_path / "sweep"
    work.mkdir()
    config = work / "resume.yaml"
    config.write_text(CONFIG)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)

    # the old code records the sweep and is interrupted in the middle of a trial
    proc = subprocess.Popen(sweep_cmd(config), cwd=work, env=_env(uri, old_checkout),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = wait_for_a_trial_mid_training(proc, client)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, f"{out}\n{err}"
    assert_left_closed(client, victim)
    before = {r.info.run_id for r in children(all_runs(client, "resume_test"))}

    # this checkout resumes it
    resumed = subprocess.run(sweep_cmd(config, "--resume"), cwd=work, env=_env(uri, ROOT),
                             capture_output=True, text=True, timeout=2400)
    assert resumed.returncode == 0, f"{resumed.stdout}\n{resumed.stderr}"
    assert "Resuming sweep" in resumed.stdout

    runs = all_runs(client, "resume_test")
    (parent,) = parents(runs)  # the old sweep's parent run, continued
    assert parent.info.status == "FINISHED"
    trial_runs = children(runs)
    assert sorted(r.info.run_name for r in trial_runs) == ["allreduce-w1-s0", "allreduce-w2-s0"]
    assert before <= {r.info.run_id for r in trial_runs}, "the interrupted trial continues its own run"
    for run in trial_runs:  # every trial finished, once: one run each, one loss point per step
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok", run.info.run_name
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        assert len(steps) == STEPS and len(set(steps)) == STEPS, (run.info.run_name, sorted(steps))
