"""Interrupted sweeps, for real: `python -m service.sweep` with a local Ray and a temporary
SQLite MLflow store gets SIGINT, and its --resume SIGTERM, in the middle of a trial; every run it leaves
behind is closed KILLED (none RUNNING), and `--resume` finishes only the unfinished trials
under the same parent run, continuing the interrupted trial's run: no duplicate runs, and
one loss point per step.

The SIGINT sweep is recorded by the code from before the folders moved (07d42ab, service/ as
loose modules, from a `git worktree` of that commit) and resumed by this checkout: the trial
keys, identity tags, run params and checkpoints a sweep leaves in MLflow and on disk are what
--resume reads back, and moving modules must not change them. (A clone without that commit, a
shallow one, records it with this checkout.) Every sweep runs under tests/reaper.py, a child
subreaper: whatever a sweep's Ray instance leaves running (a Train controller reparented when
its raylet went) is found as the reaper's descendant afterwards rather than hiding under init.

Slow by nature (Ray start-up, Ray Train per trial).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.stores import store_uri
from mlflow.tracking import MlflowClient

from tests.reaper import left_running, reaped

# Three sweeps in one test: allow a slow, shared machine.
pytestmark = pytest.mark.timeout(3600)

ROOT = Path(__file__).resolve().parent.parent
BEFORE_THE_MOVE = "07d42ab"  # the last commit with the loose service/ modules

STEPS = 120  # ~8 s of training per trial: time to interrupt it mid-way, little to wait for
CONFIG = f"""
name: resume_test
workload:
  name: mlp_digits
  steps: {STEPS}
  global_batch_size: 64
  lr: 0.05
  eval_every: 60
  warmup_steps: 5
search:
  hooks: [allreduce]
  world_size: [1, 2]
  seed: [0]
resources:
  cpus_per_worker: 0.5
checkpoint:
  every: 30
tracking:
  flush_seconds: 1.0
"""


def sweep_cmd(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "service.sweep", str(config), *extra]


def sweep_env(uri: str, code: Path | None = None) -> dict:
    """A local Ray (no RAY_ADDRESS); with ``code``, every process imports `hooks` and `service` from it."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    return env


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture
def recording_code(tmp_path):
    """(checkout, commit): this repository at BEFORE_THE_MOVE as a detached worktree (removed
    afterwards), or this checkout where the history lacks it."""
    if _git("cat-file", "-e", f"{BEFORE_THE_MOVE}^{{commit}}").returncode != 0:
        yield ROOT, None
        return
    tree = tmp_path / "before-the-move"
    added = _git("worktree", "add", "--detach", str(tree), BEFORE_THE_MOVE)
    assert added.returncode == 0, added.stderr
    try:
        yield tree, _git("rev-parse", f"{BEFORE_THE_MOVE}^{{commit}}").stdout.strip()
    finally:
        _git("worktree", "remove", "--force", str(tree))


def all_runs(client: MlflowClient, experiment: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=100)


def children(runs: list) -> list:
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def parents(runs: list) -> list:
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def wait_for_a_trial_mid_training(proc: subprocess.Popen, client: MlflowClient, timeout: float = 900,
                                  logged: dict[str, int] | None = None):
    """The first child run that is RUNNING and has loss points in MLflow (more than ``logged``
    holds for its run id: a resumed run has its earlier points already)."""
    logged = logged or {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the sweep ended before it could be interrupted:\n{out}\n{err}")
        try:
            for run in children(all_runs(client, "resume_test")):
                points = len(client.get_metric_history(run.info.run_id, "loss"))
                if run.info.status == "RUNNING" and points > logged.get(run.info.run_id, 0):
                    return run
        except Exception:  # the store is still being created by the sweep
            pass
        time.sleep(1)
    proc.kill()
    pytest.fail("no trial started training in time")


def interrupt(tmp_path: Path, sig: signal.Signals, code: Path | None = None, *extra: str,
              logged: dict[str, int] | None = None):
    """The sweep started (under the reaper; ``extra``: its flags), ``sig`` once a trial is mid-training."""
    config = tmp_path / "resume.yaml"
    if not config.exists():
        config.write_text(CONFIG)
    uri = store_uri(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    left = tmp_path / f"left-{sig.name}.json"
    proc = subprocess.Popen(reaped(left, sweep_cmd(config, *extra)), cwd=tmp_path,
                            env=sweep_env(uri, code), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = wait_for_a_trial_mid_training(proc, client, logged=logged)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left_running(left) == {}
    return config, uri, client, victim, proc.returncode, out, err


def assert_left_closed(client: MlflowClient, victim) -> None:
    runs = all_runs(client, "resume_test")
    assert [r.info.status for r in runs if r.info.status == "RUNNING"] == [], "no run may stay RUNNING"
    (parent,) = parents(runs)
    assert parent.info.status == "KILLED"
    interrupted = client.get_run(victim.info.run_id)
    assert interrupted.info.status == "KILLED"
    assert interrupted.data.tags["status"] == "killed"


@pytest.mark.ray
def test_sigint_then_sigterm_mid_trial_then_resume_finishes_the_rest_without_duplicate_runs(
        tmp_path, recording_code):
    """Ctrl-C (SIGINT) stops the sweep as recorded by the code before the folder move; this
    checkout's --resume is stopped by SIGTERM (as a scheduler stops a job) once a trial trains
    again; a second --resume finishes; a third finds nothing to do. Every stop closes its runs
    KILLED and leaves no process behind; every trial ends with each of its steps logged once."""
    code, old_commit = recording_code
    config, uri, client, victim, rc, out, err = interrupt(tmp_path, signal.SIGINT, code)
    assert rc == 130, f"{out}\n{err}"
    assert "Traceback" not in out + err
    assert f"{config} --resume" in out
    assert_left_closed(client, victim)
    if old_commit is not None:
        (parent,) = parents(all_runs(client, "resume_test"))
        assert parent.data.tags.get("git_commit") == old_commit, "the sweep was recorded by the code before the move"
    before = {r.info.run_id for r in children(all_runs(client, "resume_test"))}

    logged = {r: len(client.get_metric_history(r, "loss")) for r in before}
    _, _, _, victim, rc, out, err = interrupt(tmp_path, signal.SIGTERM, ROOT, "--resume", logged=logged)
    assert rc == 130, f"{out}\n{err}"
    assert "Traceback" not in out + err
    assert_left_closed(client, victim)
    before = {r.info.run_id for r in children(all_runs(client, "resume_test"))}

    def resume(name: str) -> subprocess.CompletedProcess:  # this checkout, under the reaper
        done = subprocess.run(reaped(tmp_path / name, sweep_cmd(config, "--resume")), cwd=tmp_path,
                              env=sweep_env(uri, ROOT), capture_output=True, text=True, timeout=2400)
        assert left_running(tmp_path / name) == {}
        return done

    proc = resume("left-resumed.json")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "Resuming sweep" in proc.stdout

    runs = all_runs(client, "resume_test")
    (parent,) = parents(runs)  # the same parent, continued: no second sweep run
    assert parent.info.status == "FINISHED"
    trial_runs = children(runs)
    assert sorted(r.info.run_name for r in trial_runs) == ["allreduce-w1-s0", "allreduce-w2-s0"]
    assert before <= {r.info.run_id for r in trial_runs}, "interrupted trials continue their own runs"
    for run in trial_runs:
        assert run.info.status == "FINISHED", run.info.run_name
        assert run.data.tags["status"] == "ok", run.info.run_name
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        assert len(steps) == STEPS and len(set(steps)) == STEPS, (run.info.run_name, sorted(steps))
    assert client.get_run(victim.info.run_id).info.status == "FINISHED"

    # Nothing is left to do: a second --resume runs no trial and creates no run.
    again = resume("left-again.json")
    assert again.returncode == 0, f"{again.stdout}\n{again.stderr}"
    assert "0 to run" in again.stdout
    assert len(all_runs(client, "resume_test")) == len(runs)


def test_resume_without_an_earlier_sweep_is_one_line(tmp_path):
    config = tmp_path / "resume.yaml"
    config.write_text(CONFIG)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # no store at all yet
    proc = subprocess.run(sweep_cmd(config, "--resume"), cwd=tmp_path, env=sweep_env(uri),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, f"{proc.stdout}\n{proc.stderr}"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: nothing to resume"), proc.stderr


def _probe_workers(pid: int) -> set[int]:
    """The pids of Ray Train workers below ``pid`` now (``ray::RayTrainWorker...`` titles)."""
    from tests.conftest import _actor_processes_below

    return {p for name, p in _actor_processes_below(pid) if name == "RayTrainWorker"}


@pytest.mark.ray
def test_ctrl_c_while_the_transport_probe_runs_stops_the_sweep_with_130(tmp_path):
    """SIGINT while the probe's TorchTrainer runs (before any trial): the probe's fit() used to
    install Ray Train's own SIGINT handler, which aborted the probe quietly (recorded as a failed
    probe) or exited 1. Now the sweep stops as for any Ctrl-C: 130, its parent run KILLED, the
    --resume line printed, nothing left running. Under load (two busy loops from the signal to the
    exit), as service.probe's: the probe's thread is still inside Ray, so the sweep neither
    disconnects from Ray nor ends by the interpreter's exit (either crashed service.probe with
    SIGSEGV, 2 of 12 interrupts under such load) but kills its Ray instance and leaves by
    os._exit(130); its log says so."""
    config = tmp_path / "resume.yaml"
    config.write_text(CONFIG.replace("world_size: [1, 2]", "world_size: [2]"))
    uri = store_uri(tmp_path)
    left = tmp_path / "left-probe.json"
    proc = subprocess.Popen(reaped(left, sweep_cmd(config)), cwd=tmp_path, env=sweep_env(uri, ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy = []
    try:
        deadline = time.monotonic() + 600
        while not _probe_workers(proc.pid):  # no trial starts before the probe has ended
            assert proc.poll() is None and time.monotonic() < deadline, "the probe never started"
            time.sleep(0.25)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        for b in busy:
            b.kill()
            b.wait()
        if proc.poll() is None:
            proc.kill()
    assert left_running(left) == {}
    assert "its thread was inside Ray, so this driver does not disconnect" in _sweep_log(tmp_path)
    assert proc.returncode == 130, f"{out}\n{err}"
    assert "Traceback" not in out + err and "transport measured" not in out
    assert f"{config} --resume" in out
    runs = all_runs(MlflowClient(tracking_uri=uri), "resume_test")
    assert [r.info.status for r in parents(runs)] == ["KILLED"] and children(runs) == []


def _sweep_log(tmp_path: Path) -> str:
    logs = sorted(tmp_path.rglob("sweep-*.log"))
    return logs[-1].read_text() if logs else ""


@pytest.mark.ray
def test_ctrl_c_again_and_again_while_the_interrupted_sweep_writes_its_report_still_exits_130(tmp_path):
    """Ctrl-C mid-trial, then Ctrl-C again and again, every 0.1 s from the moment the interrupted
    sweep says in its log that it writes its report until it exits: each later signal is ignored
    (service/sweep/signals.py stop_once), so the sweep still exits 130 with the --resume hint and no
    traceback. (Before: a second Ctrl-C in the report's import of matplotlib raised
    KeyboardInterrupt there, and the process died by SIGINT, without the hint.) One trial at W = 1:
    no probe, the cheapest sweep that trains."""
    config = tmp_path / "resume.yaml"
    config.write_text(CONFIG.replace("world_size: [1, 2]", "world_size: [1]"))
    uri = store_uri(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    left = tmp_path / "left-report.json"
    proc = subprocess.Popen(reaped(left, sweep_cmd(config)), cwd=tmp_path, env=sweep_env(uri, ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    signals_sent, lines, err_lines = 0, [], []
    readers = [threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True),
               threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)]
    for r in readers:
        r.start()
    try:
        wait_for_a_trial_mid_training(proc, client)
        deadline = time.monotonic() + 300
        proc.send_signal(signal.SIGINT)
        while "interrupted: writing the report" not in _sweep_log(tmp_path):
            assert proc.poll() is None and time.monotonic() < deadline, "the interrupted sweep wrote no report"
            time.sleep(0.05)
        while proc.poll() is None:  # Ctrl-C, again and again, through the report and the summary
            proc.send_signal(signal.SIGINT)
            signals_sent += 1
            time.sleep(0.1)
        for r in readers:
            r.join(timeout=60)
        out, err = "".join(lines), "".join(err_lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left_running(left) == {}
    assert signals_sent >= 2, "the report was written before a second signal could land"
    assert proc.returncode == 130, f"{out}\n{err}"
    assert "Traceback" not in out + err, f"{out}\n{err}"
    assert f"{config} --resume" in out, out
    assert [r.info.status for r in parents(all_runs(client, "resume_test"))] == ["KILLED"]


@pytest.mark.ray
def test_a_probe_whose_group_cannot_form_is_recorded_on_the_parent_run_and_in_the_report_and_the_sweep_goes_on(tmp_path):
    """The sweep's own transport probe fails for real: gloo is told to bind an interface this
    machine does not have (GLOO_SOCKET_IFNAME), so the probe's group cannot form. The sweep says
    so in one line, records why on its parent run (tag transport_not_measured) and goes on to its
    trial; that trial's W = 2 group cannot form either (gloo waits on it for its own timeout), so
    once it has started the test stops the sweep with Ctrl-C, whose report says why the transport
    was not measured."""
    config = tmp_path / "resume.yaml"
    config.write_text(CONFIG.replace("world_size: [1, 2]", "world_size: [2]"))
    uri = store_uri(tmp_path)
    left = tmp_path / "left-noprobe.json"
    env = {**sweep_env(uri, ROOT), "GLOO_SOCKET_IFNAME": "chk-noif0"}
    proc = subprocess.Popen(reaped(left, sweep_cmd(config)), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stdout:  # the probe's line, then the trial's start: the sweep went on
            lines.append(line)
            if "starting" in line:
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + out
    assert left_running(left) == {}
    failed = next((line for line in lines if line.startswith("transport not measured (")), None)
    assert failed is not None and lines.index(failed) < len(lines) - 1, out[-3000:] + err[-3000:]
    assert proc.returncode == 130 and "Traceback" not in out + err, out[-3000:] + err[-3000:]
    runs = all_runs(MlflowClient(tracking_uri=uri), "resume_test")
    (parent,) = parents(runs)
    why = parent.data.tags["transport_not_measured"]
    assert why.startswith("its probe failed (") and "\n" not in why
    summary = next(tmp_path.rglob("summary.md")).read_text()
    assert f"not measured for this sweep: {why};" in summary
