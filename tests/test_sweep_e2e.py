"""End to end, for real: `python -m service.sweep` on the smoke preset with a local Ray
instance (started by the command) and a temporary SQLite MLflow store, then everything the
trials recorded read back with MlflowClient.

Slow by nature: Ray start-up plus ~30 s of Ray Train start-up and tear-down per trial.
The smoke sweep itself is conftest's session fixture ``smoke_sweep`` (run once, shared with
the report test at the end of this file). Run alone with: .venv/bin/python -m pytest tests/test_sweep_e2e.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.stores import store_uri
from mlflow.tracking import MlflowClient

from service import report
from service.config import load_config

# A sweep's wall time depends on the machine's load more than on its work: allow a slow,
# shared machine (pyproject's default of 900 s per test is too tight for a 4-trial sweep there;
# the shared smoke sweep runs inside the first test that asks for it, see conftest).
pytestmark = pytest.mark.timeout(1500)

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "tune_configs" / "smoke.yaml"
TRIAL_PARAMS = ("hook", "world_size", "seed", "workload", "global_batch_size", "steps", "lr",
                "optimizer", "grad_accumulation", "backend")


def run_sweep_cli(config: Path, cwd: Path, uri: str, timeout: float = 1400,
                  reaper_out: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m service.sweep CONFIG` on a local Ray; with ``reaper_out``, under tests/reaper.py
    (what the sweep left running is then ``tests.reaper.left_running(reaper_out)``)."""
    from tests.reaper import reaped

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # always a local Ray
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "service.sweep", str(config)]
    return subprocess.run(command if reaper_out is None else reaped(reaper_out, command), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.ray
def test_a_trial_starts_no_ray_actor_it_does_not_use(smoke_sweep):
    """service/sweep/lean_trainer.py and the preemption watcher's setting: each of these was one
    more process per trial, importing ray.train, that nothing in a sweep uses."""
    assert smoke_sweep.proc.returncode == 0, smoke_sweep.proc.stderr[-3000:]
    actors = smoke_sweep.ray_actors
    assert {"ImplicitFunc", "TrainController", "RayTrainWorker"} <= actors, actors  # the sampler saw trials
    assert not actors & {"DatasetManager", "PlacementGroupCleaner", "PreemptionWatcher", "_QueueActor",
                         "_AutoscalingCoordinatorActor"}, actors  # a local instance of fixed size scales nothing
    # Tune reuses one trial process for the sweep's 4 trials (reuse_actors): they import once
    tune_trials = [pid for name, pid in smoke_sweep.ray_processes if name == "ImplicitFunc"]
    assert len(tune_trials) == 1, smoke_sweep.ray_processes


@pytest.mark.ray
def test_smoke_sweep_records_every_trial_in_mlflow(smoke_sweep):
    cfg, _ = load_config(SMOKE)
    trials = cfg.trials()
    steps = cfg.workload.steps
    uri = smoke_sweep.uri

    proc = smoke_sweep.proc
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr

    # What the person at the terminal saw: progress, the table, the MLflow UI command.
    out = proc.stdout
    assert f"/{len(trials)} trials done]" in out
    assert f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1" in out
    assert "/runs?workflowType=machine_learning" in out  # the trials' page in the training view
    assert "to target s" in out  # the table shows each trial's time to target (issue 16)
    table = [ln for ln in out.splitlines() if ln.startswith(("allreduce ", "quantization_perchannel "))]
    assert len(table) == len(trials), out
    assert all(ln.rstrip().endswith("ok") for ln in table), out

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(cfg.name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags.get("config_path", "").endswith("smoke.yaml")
    # The report built at the end of the sweep (issue 6), attached to the parent run.
    assert "Report: " in out and "report.html" in out, out
    attached = smoke_sweep.attached_by_sweep  # before test_report rebuilds and re-attaches it
    assert {"report.html", "summary.md", "summary.csv", "loss_curves.png", "throughput.png",
            "tradeoff.png", "decision_map.png", "projection.csv", "transport.json"} <= attached, attached
    # the sweep's probe names where it ran: each world size above 1, this machine, on loopback
    from service.tracking import SweepReader
    transport = SweepReader(uri).transport(parent.info.run_id)
    assert [(h.world_size, h.hosts, h.loopback) for h in transport.hosts] == [
        (w, 1, True) for w in sorted({t.world_size for t in trials if t.world_size > 1})]

    assert len(children) == len(trials)
    by_name = {r.info.run_name: r for r in children}
    assert set(by_name) == {t.run_name for t in trials}
    for trial in trials:
        run = by_name[trial.run_name]
        where = trial.run_name
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id, where
        assert run.info.status == "FINISHED", where
        assert run.data.tags.get("status") == "ok", where

        params = run.data.params
        for name in TRIAL_PARAMS:
            assert name in params, f"{where}: param {name} missing"
        assert params["hook"] == trial.hook
        assert int(params["world_size"]) == trial.world_size
        assert int(params["seed"]) == trial.seed
        assert int(params["steps"]) == steps
        assert params["backend"] == "gloo"
        for name, value in trial.hook_params.items():
            assert params[name] == str(value), f"{where}: hook param {name}"

        loss = client.get_metric_history(run.info.run_id, "loss")
        loss_steps = sorted(m.step for m in loss)
        assert len(loss_steps) == steps and len(set(loss_steps)) == steps, f"{where}: {loss_steps}"
        assert loss_steps == list(range(loss_steps[0], loss_steps[0] + steps)), where
        assert len(client.get_metric_history(run.info.run_id, "step_time_ms")) == steps, where
        assert client.get_metric_history(run.info.run_id, "eval_accuracy"), where

        metrics = run.data.metrics
        assert metrics["samples_per_s"] > 0, where
        assert metrics["step_time_ms_median"] > 0, where
        assert metrics["comm_bytes_per_step"] >= 0, where
        if trial.world_size > 1:
            assert metrics["comm_bytes_per_step"] > 0, where
        assert metrics["nan_detected"] == 0, where
        # issue 24: the trial's recorded step, priced by the step model where it ran
        assert metrics["timeline_step_ms"] > 0 and metrics["timeline_steps"] >= 1, where
        assert 0.0 <= metrics["final_eval_accuracy"] <= 1.0, where
        assert metrics["final_loss"] == metrics["final_loss"], where  # finite, not NaN
        if trial.hook == "allreduce":
            assert metrics["compression_ratio"] == pytest.approx(1.0), where
        else:  # uint8 per chunk of 512 plus a scale/offset per chunk: well above 3x
            assert metrics["compression_ratio"] > 3.0, where

    # Issue 7: each Tune trial's process asked the sweep's TrialRuns actor for its run and never
    # imported mlflow itself (a second of CPU per trial); it says so in its Tune result.
    reported = [r for path in (smoke_sweep.workdir / "results").rglob("result.json")
                for r in map(json.loads, path.read_text().splitlines())
                if "trial_process_imported_mlflow" in r]
    assert sorted(r["run_id"] for r in reported) == sorted(r.info.run_id for r in children)
    assert not any(r["trial_process_imported_mlflow"] for r in reported), reported


CRASH_CONFIG = """
name: {name}
workload:
  name: mlp_digits
  steps: 20
  global_batch_size: 64
  lr: 0.05
  eval_every: 10
  warmup_steps: 2
search:
  hooks: [allreduce]
  world_size: {world_sizes}
  seed: [0]
resources:
  cpus_per_worker: 0.5
faults:
  - {{kind: crash, step: 12, rank: 1}}
checkpoint:
  every: {every}
  max_failures: {max_failures}
tracking:
  flush_seconds: 1.0
  transport_probe: false
"""


def write_config(tmp_path: Path, **fields) -> Path:
    path = tmp_path / f"{fields['name']}.yaml"
    path.write_text(CRASH_CONFIG.format(**fields))
    return path


def sweep_of(tmp_path_factory, name: str, config_text: str) -> dict:
    """A sweep of ``config_text`` (its ``name:``) run once through the CLI on a fresh SQLite store:
    the process, the store's URI, its child runs by name and its report's folder."""
    tmp = tmp_path_factory.mktemp(name)
    config = tmp / f"{name}.yaml"
    config.write_text(config_text)
    uri = store_uri(tmp)
    proc = run_sweep_cli(config, tmp, uri)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    runs = child_runs_by_name(MlflowClient(tracking_uri=uri), name)
    return {"proc": proc, "uri": uri, "runs": runs, "report": next(tmp.glob(f"results/{name}-*/report"))}


def child_runs_by_name(client: MlflowClient, experiment: str) -> dict:
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=100)
    assert len([r for r in runs if "mlflow.parentRunId" not in r.data.tags]) == 1
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    by_name = {r.info.run_name: r for r in kids}
    assert len(by_name) == len(kids), "one run per trial"
    return by_name


@pytest.mark.ray
def test_a_crashed_trial_out_of_retries_fails_a_nan_trial_does_not_and_the_sweep_carries_on(tmp_path):
    """One sweep, two trials, world size 1 first: its rank 0 dies at step 12 with no retry left
    (FAILED, its error kept); the world-size-2 trial then still runs, and its rank 1's NaN at
    step 5 stops it (stop.on_nan) before the crash's step: a NaN trial is an outcome, not a
    failure (README: exit 0 when every trial finished ok or nan; a NaN trial once counted as
    failed and made the sweep exit 1). Exit 1 here: one trial failed, and only one."""
    config = write_config(tmp_path, name="crash_fails", world_sizes="[1, 2]", every=0, max_failures=0)
    config.write_text(config.read_text().replace("  - {kind: crash, step: 12, rank: 1}",
                                                 "  - {kind: crash, step: 12, rank: 0}\n"
                                                 "  - {kind: nan_grad, step: 5, rank: 1}")
                      + "stop: {on_nan: true}\n")
    uri = store_uri(tmp_path)
    proc = run_sweep_cli(config, tmp_path, uri)
    assert proc.returncode == 1, f"{proc.stdout}\n{proc.stderr}"  # 1: some trial failed
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "2 trials, 1 failed." in proc.stdout, proc.stdout

    runs = child_runs_by_name(MlflowClient(tracking_uri=uri), "crash_fails")
    failed, nan = runs["allreduce-w1-s0"], runs["allreduce-w2-s0"]
    assert failed.info.status == "FAILED"
    assert failed.data.tags["status"] == "failed"
    assert failed.data.tags.get("error"), "the error text is kept on the run"
    assert nan.info.status == "FINISHED" and nan.data.tags["status"] == "nan"
    assert nan.data.metrics["steps_done"] < 12   # stopped at its NaN, before the crash's step
    w1, w2 = [ln.rstrip() for ln in proc.stdout.splitlines() if ln.startswith("allreduce")]  # grid order
    assert w1.endswith("failed") and w2.endswith("nan (model_grad)"), (w1, w2)


def test_a_sweep_of_ok_and_nan_trials_exits_0():
    """The exit status the test above cannot show in the same sweep (it has a failure): rows
    that ended ok or nan count no failure, and the CLI exits 1 only on a failure."""
    from service.sweep.results import SweepOutcome

    assert SweepOutcome("p", "u", rows=[{"status": "ok"}, {"status": "nan"}]).failed == 0
    assert SweepOutcome("p", "u", rows=[{"status": "nan"}, {"status": "failed"}]).failed == 1


# A crashed trial that restarts from its checkpoint in the same run: test_faults'
# test_a_crashed_worker_restarts_from_its_checkpoint_and_continues_its_run, through the same
# sweep path (run_sweep -> Tune -> TorchTrainer with checkpoint.max_failures) in one Ray start.


# --------------------------------------------------------------------------------------------
# On a small REAL sweep (local Ray, the smoke preset, a temporary SQLite store)
# --------------------------------------------------------------------------------------------

@pytest.mark.ray
def test_report_of_a_real_smoke_sweep(smoke_sweep, tmp_path):
    """`python -m service.sweep smoke` for real (conftest's session sweep, shared with
    the tests above), then the report: what the plots and tables are drawn from equals what the
    trials logged, read back with a plain MlflowClient."""
    uri = smoke_sweep.uri
    sweep_run = smoke_sweep.proc
    assert sweep_run.returncode == 0, sweep_run.stdout[-3000:] + sweep_run.stderr[-3000:]

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("smoke")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4

    out = tmp_path / "report"
    html_path = report.build_report(parent.info.run_id, tracking_uri=uri, out_dir=out)
    for name in report.REPORT_FILES:
        assert (out / name).stat().st_size > 0, name
    assert set(report.REPORT_FILES) <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    # loss curves, throughput, tradeoff, and the decision map (real trials record the step
    # timeline the projection prices)
    assert html_path.read_text().count("data:image/png;base64,") == 4

    sweep = report.load_sweep(report.open_store(uri), parent.info.run_id)
    curves = {run_id: c for cs in report.loss_curve_data(sweep).values() for c in cs
              for run_id in c.run_ids}
    rows = {run_id: r for r in report.summary_rows(sweep) for run_id in r.run_ids}
    for child in children:
        run_id, params = child.info.run_id, child.data.params
        history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
        assert len(history) == int(params["steps"])  # one point per step
        curve = curves[run_id]  # one seed: the curve is this trial's loss, point for point
        assert curve.world_size == int(params["world_size"]) and curve.hook == params["hook"]
        assert list(curve.steps) == [m.step for m in history]
        assert list(curve.mean) == [m.value for m in history]
        row = rows[run_id]
        assert row.states == {"ok": 1} and child.data.tags["status"] == "ok"
        for metric in ("samples_per_s", "comm_bytes_per_step", "final_loss",
                       "final_eval_accuracy", "compression_ratio"):
            assert row.mean(metric) == child.data.metrics[metric], metric
    lines = {(line.config, w): m for line in report.throughput_data(sweep)
             for w, m in zip(line.world_sizes, line.mean)}
    assert lines == {(rows[c.info.run_id].config, int(c.data.params["world_size"])):
                     c.data.metrics["samples_per_s"] for c in children}
    _, points = report.tradeoff_data(sweep)
    assert {(p.config, p.bytes_per_step) for p in points[2]} == {
        (rows[c.info.run_id].config, c.data.metrics["comm_bytes_per_step"])
        for c in children if c.data.params["world_size"] == "2"}
