"""service.tracking against a real temporary SQLite MLflow store, read back with MlflowClient."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from service import tracking
from service.config import SweepConfig, TrialSpec


def make_cfg(name: str = "track", **workload) -> SweepConfig:
    return SweepConfig.model_validate({
        "name": name,
        "workload": {"name": "mlp_digits", "steps": 10, "global_batch_size": 32, "lr": 0.05,
                     "eval_every": 5, "warmup_steps": 2, **workload},
        "search": {"hooks": ["allreduce"], "world_size": [1, 2], "seed": [0]},
    })


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the module (creating one costs ~3 s of schema migrations)."""
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root}/mlflow.db", root


@pytest.fixture(scope="module")
def parent(store):
    uri, root = store
    config_file = root / "sweep.yaml"
    config_file.write_text("name: track\n")
    cfg = make_cfg()
    return tracking.start_parent_run(cfg, str(config_file), tracking_uri=uri), cfg, config_file


def test_resolve_tracking_uri_default_is_absolute_sqlite_in_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking.resolve_tracking_uri() == f"sqlite:///{tmp_path}/mlflow.db"


def test_resolve_tracking_uri_uses_the_standard_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.resolve_tracking_uri() == "http://127.0.0.1:5000"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel/x.db")  # Ray moves cwd: make absolute
    assert tracking.resolve_tracking_uri() == f"sqlite:///{tmp_path}/rel/x.db"


def test_parent_run_has_experiment_tags_and_config_artifact(store, parent):
    uri, root = store
    run_id, cfg, config_file = parent
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "track"
    assert run.data.tags["config_path"] == str(config_file)
    assert len(run.data.tags["git_commit"]) == 40  # the project is a git checkout
    assert [a.path for a in client.list_artifacts(run_id)] == ["sweep.yaml"]
    # artifacts live beside the SQLite file, not in whatever directory the process ran in
    assert client.get_experiment(run.info.experiment_id).artifact_location.startswith(f"file://{root}")


def test_child_run_is_nested_named_and_has_every_param(store, parent):
    uri, _ = store
    parent_id, cfg, _ = parent
    trial = next(t for t in cfg.trials() if t.world_size == 2)
    child_id = tracking.start_child_run(parent_id, trial, cfg, tracking_uri=uri)
    run = MlflowClient(uri).get_run(child_id)
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert run.info.run_name == trial.run_name == "allreduce-w2-s0"
    assert run.info.status == "RUNNING"
    params = run.data.params
    expected = {"hook": "allreduce", "world_size": "2", "seed": "0", "workload": "mlp_digits",
                "global_batch_size": "32", "steps": "10", "lr": "0.05", "optimizer": "sgd",
                "grad_accumulation": "1", "backend": "gloo"}
    assert {k: params[k] for k in expected} == expected
    assert params["torch_version"].startswith("2.") and params["ray_version"].startswith("2.")
    assert [r.info.run_id for r in tracking.child_runs(parent_id, tracking_uri=uri)][-1] == child_id


def test_child_run_logs_each_hook_param_by_its_own_name(store, parent):
    uri, _ = store
    parent_id, cfg, _ = parent

    trial = TrialSpec(hook="quantization_perchannel", hook_params={"chunk_size": 128}, world_size=1, seed=3)
    assert trial.run_name == "quantization_perchannel-c128-w1-s3"

    child_id = tracking.start_child_run(parent_id, trial, cfg, tracking_uri=uri)
    params = MlflowClient(uri).get_run(child_id).data.params
    assert params["chunk_size"] == "128" and params["hook"] == "quantization_perchannel"


def test_metric_logger_batches_and_keeps_every_point(store, parent):
    uri, _ = store
    parent_id, cfg, _ = parent
    run_id = tracking.start_child_run(parent_id, cfg.trials()[0], cfg, tracking_uri=uri)
    logger = tracking.MetricLogger(run_id, uri, flush_seconds=3600)
    for step in range(1, 1201):  # 2400 points: more than one 1000-point batch
        logger.log(step, loss=1.0 / step, step_time_ms=float(step))
    client = MlflowClient(uri)
    assert client.get_metric_history(run_id, "loss") == []  # buffered, not yet sent
    logger.log_summary(samples_per_s=123.0, final_loss=0.5)
    logger.close()
    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 1201))
    assert {m.step: m.value for m in history}[4] == pytest.approx(0.25)
    assert len(client.get_metric_history(run_id, "step_time_ms")) == 1200
    assert client.get_run(run_id).data.metrics["samples_per_s"] == 123.0
    assert logger.points_logged == 2402


def test_metric_logger_flushes_when_flush_seconds_pass(store, parent):
    uri, _ = store
    parent_id, cfg, _ = parent
    run_id = tracking.start_child_run(parent_id, cfg.trials()[0], cfg, tracking_uri=uri)
    logger = tracking.MetricLogger(run_id, uri, flush_seconds=0.0)  # every log() is due
    logger.log(1, loss=2.0)
    assert [m.value for m in MlflowClient(uri).get_metric_history(run_id, "loss")] == [2.0]


def test_metric_logger_skips_steps_a_previous_attempt_logged(store, parent):
    uri, _ = store
    parent_id, cfg, _ = parent
    run_id = tracking.start_child_run(parent_id, cfg.trials()[0], cfg, tracking_uri=uri)
    with tracking.MetricLogger(run_id, uri) as first:
        for step in range(1, 8):
            first.log(step, loss=float(step))
    done = tracking.last_logged_steps(run_id, ["loss", "eval_loss"], uri)
    assert done == {"loss": 7, "eval_loss": -1}
    with tracking.MetricLogger(run_id, uri, skip_through=done) as second:  # resumed at step 4
        for step in range(5, 11):
            second.log(step, loss=float(step), eval_loss=1.0)
    steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss"))
    assert steps == list(range(1, 11))
    assert len(MlflowClient(uri).get_metric_history(run_id, "eval_loss")) == 6


@pytest.mark.parametrize("status,error,tag", [
    ("FINISHED", None, "ok"), ("FAILED", "RuntimeError: boom", "failed"), ("KILLED", None, "killed"),
])
def test_end_run_terminates_with_status_tag(store, parent, status, error, tag):
    uri, _ = store
    parent_id, cfg, _ = parent
    run_id = tracking.start_child_run(parent_id, cfg.trials()[0], cfg, tracking_uri=uri)
    tracking.end_run(run_id, status, error, tracking_uri=uri)
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == status
    assert run.data.tags["status"] == tag
    assert run.data.tags.get("error") == error


def test_end_run_finished_keeps_the_workers_status_and_truncates_long_errors(store, parent):
    uri, _ = store
    parent_id, cfg, _ = parent
    run_id = tracking.start_child_run(parent_id, cfg.trials()[0], cfg, tracking_uri=uri)
    tracking.set_tags(run_id, uri, status="nan")
    tracking.end_run(run_id, "FINISHED", tracking_uri=uri)
    assert MlflowClient(uri).get_run(run_id).data.tags["status"] == "nan"

    failed = tracking.start_child_run(parent_id, cfg.trials()[0], cfg, tracking_uri=uri)
    tracking.end_run(failed, "FAILED", "x" * 20000 + "the last line", tracking_uri=uri)
    error = MlflowClient(uri).get_run(failed).data.tags["error"]
    assert len(error) <= 8000 and error.endswith("the last line")
    with pytest.raises(ValueError, match="FINISHED, FAILED, KILLED"):
        tracking.end_run(failed, "DONE", tracking_uri=uri)


def test_a_trials_identity_is_written_with_its_run_and_read_back_typed(store, parent):
    """The trial record (issue 14, item 2): key, configuration label, typed hook params, world
    size, seed and link come from the tags written when the run was created, not from its name;
    of two runs of one trial the newest is the record; a run without those tags is refused."""
    uri, _ = store
    parent_id, _, _ = parent
    cfg = SweepConfig.model_validate({**make_cfg().model_dump(exclude_none=True),
                                      "network": {"link_gbps": 2.5}})
    trial = TrialSpec(hook="powersgd", world_size=2, seed=1, link_gbps=2.5,
                      hook_params={"rank": 4, "start_iter": 10, "error_feedback": True,
                                   "warm_start": True, "orthogonalization_epsilon": 1e-08})
    exp_id = MlflowClient(uri).get_run(parent_id).info.experiment_id
    sub_parent = MlflowClient(uri).create_run(exp_id, run_name="records").info.run_id
    first = tracking.start_child_run(sub_parent, trial, cfg, tracking_uri=uri)
    tracking.end_run(first, "FAILED", error="boom", tracking_uri=uri)
    second = tracking.start_child_run(sub_parent, trial, cfg, tracking_uri=uri)
    [record] = tracking.SweepReader(uri).trials(sub_parent)
    assert record.run_id == second and record.status == "RUNNING" and record.state == "running"
    assert record.key == trial.key and record.run_name == trial.run_name == "powersgd-rank4-w2-s1-2.5gbps"
    assert record.config == "powersgd-rank4"  # the run name without world size, seed and link
    assert record.hook_params == trial.hook_params
    assert type(record.hook_params["rank"]) is int and record.hook_params["error_feedback"] is True
    assert (record.hook, record.world_size, record.seed, record.link_gbps) == ("powersgd", 2, 1, 2.5)
    tracking.end_run(second, "FINISHED", tracking_uri=uri)
    [record] = tracking.SweepReader(uri).trials(sub_parent)
    assert record.ended and record.state == "ok"

    MlflowClient(uri).create_run(exp_id, run_name="allreduce-w1-s0",
                                 tags={"mlflow.parentRunId": sub_parent})  # an older version's run
    with pytest.raises(tracking.StoreError, match="older version") as err:
        tracking.SweepReader(uri).trials(sub_parent)
    assert "\n" not in str(err.value) and "allreduce-w1-s0" in str(err.value)
