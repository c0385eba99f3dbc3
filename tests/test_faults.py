"""Issue 4 §1-§3, worker side, for real: injected faults (nan_grad, scale_grad, crash), NaN
provenance recorded in MLflow, checkpoints that resume exactly, and a crashed Ray Train
worker whose sweep trial restarts from its checkpoint and continues the same MLflow run.

The 2-rank scenarios run in ONE pair of spawned gloo processes (module fixture): starting a
process that imports torch and sklearn is most of the cost on a busy 2-core machine.
"""

from __future__ import annotations

import dataclasses

import json
import os

import pytest

from tests.stores import store_uri
import torch
import torch.distributed as dist

from service.config import SweepConfig
from service.train import Start, TrainingContext, load_checkpoint_dir, run_training, save_checkpoint_dir
from tests.dist_utils import init_single_rank_group, run_distributed
from tests.test_worker import make_cfg, trial_of

EVERY_HOOK = [
    "allreduce", "allgather_then_aggregate", "fp16_compress", "bf16_compress",
    "quantization_pertensor", {"name": "quantization_perchannel", "chunk_size": 64},
    {"name": "powersgd", "start_iter": 2},
]
RESUME_HOOK = {"name": "powersgd", "start_iter": 2}  # error-feedback memory must survive


def _hook_name(entry) -> str:
    return entry if isinstance(entry, str) else entry["name"]


def nan_cfg() -> SweepConfig:
    return make_cfg(steps=8, hooks=EVERY_HOOK, world_sizes=(2,),
                    faults=[{"kind": "nan_grad", "step": 5, "rank": 1}])


def scale_cfg() -> SweepConfig:
    # |grad| ~ 1e-1 here; x1e7 is far beyond float16's 65504 even after fp16_compress halves it
    return make_cfg(steps=4, hooks=["allreduce", "fp16_compress"], world_sizes=(2,), optimizer="adamw",
                    lr=0.001, faults=[{"kind": "scale_grad", "step": 4, "rank": 0, "factor": 1.0e7}])


def resume_cfg(**extra) -> SweepConfig:
    return make_cfg(steps=9, hooks=[RESUME_HOOK], world_sizes=(2,), optimizer="adamw", lr=0.01,
                    checkpoint={"every": 3, "max_failures": 1}, **extra)


def _scenarios(rank, world_size, nan_dump, scale_dump, resume_dump, checkpoint_dir):
    """Every 2-rank scenario of this module, in one process per rank."""
    out = {"nan": {}, "scale": {}}
    for key, dump in (("nan", nan_dump), ("scale", scale_dump)):
        cfg = SweepConfig.model_validate(dump)
        for trial in cfg.trials():
            out[key][trial.hook] = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))

    cfg = SweepConfig.model_validate(resume_dump)
    trial = cfg.trials()[0]

    def keep(step, state):  # as the Ray wrapper does: each rank writes its part of the directory
        path = os.path.join(checkpoint_dir, f"step_{step}")
        os.makedirs(path, exist_ok=True)
        save_checkpoint_dir(path, state)

    out["uninterrupted"] = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu",
                                        checkpoint_fn=keep))
    dist.barrier()  # both ranks' parts are on disk
    start = Start(checkpoint=load_checkpoint_dir(os.path.join(checkpoint_dir, "step_6"), rank), restarts=1)
    out["resumed"] = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu", start=start))
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("checkpoints"))
    return run_distributed(_scenarios, 2, args=(nan_cfg().model_dump(), scale_cfg().model_dump(),
                                                resume_cfg().model_dump(), directory))


@pytest.mark.parametrize("hook", [_hook_name(e) for e in EVERY_HOOK])
def test_nan_grad_is_model_grad_at_exactly_that_step_for_every_hook(two_ranks, hook):
    """A NaN in rank 1's local gradient at step 5: both ranks stop at 5, and the source is
    model_grad on rank 1, whatever the hook does to NaN (quantizing ones included)."""
    for rank in (0, 1):
        result = two_ranks[rank]["nan"][hook]
        assert result.status == "nan" and result.steps_done == 5
        report = result.nan_report
        assert (report.nan_source, report.first_nan_step, report.nan_rank) == ("model_grad", 5, 1)
        assert report.bucket_index is not None and report.param_names
        assert report.per_rank[1]["flags"]["model_grad"] == 1
        assert report.per_rank[0]["flags"]["model_grad"] == 0  # rank 0's own gradient was fine


def test_scale_grad_overflows_fp16_in_the_hook_while_allreduce_stays_finite(two_ranks):
    fp16 = two_ranks[0]["scale"]["fp16_compress"]
    assert fp16.status == "nan" and fp16.nan_report.nan_source == "hook"
    assert fp16.nan_report.first_nan_step == 4
    fp32 = two_ranks[0]["scale"]["allreduce"]
    assert fp32.status == "ok" and fp32.summary["nan_detected"] == 0 and fp32.steps_done == 4


def test_resume_from_a_checkpoint_continues_exactly(two_ranks):
    """Model, AdamW state, step, data position and PowerSGD's error-feedback memory: the run
    resumed at step 6 takes the same steps 7-9 as the run that never stopped."""
    for rank in (0, 1):
        whole, resumed = two_ranks[rank]["uninterrupted"], two_ranks[rank]["resumed"]
        assert resumed.steps_done == 9 and len(resumed.losses) == 3
        assert resumed.losses == pytest.approx(whole.losses[6:], rel=1e-5, abs=1e-7)
        assert resumed.summary["restarts"] == 1


def test_without_the_hook_state_the_resumed_run_differs(tmp_path):
    """The exactness above depends on the hook's state: dropping PowerSGD's memory (and its
    warm-start matrices) shows up in the loss. Single rank, so it runs in this process."""
    cfg = make_cfg(steps=9, hooks=[RESUME_HOOK], world_sizes=(1,), optimizer="adamw", lr=0.01,
                   checkpoint={"every": 3, "max_failures": 1})
    trial = trial_of(cfg, 1, "powersgd")
    saved = {}
    with single_rank_group():
        whole = run_training(trial, cfg, TrainingContext(rank=0, world_size=1, device="cpu",
                             checkpoint_fn=lambda step, state: saved.setdefault(step, _roundtrip(state, tmp_path))))
        exact = run_training(trial, cfg, TrainingContext(rank=0, world_size=1, device="cpu", start=Start(saved[6])))
        amnesic = run_training(trial, cfg, TrainingContext(rank=0, world_size=1, device="cpu",
                               start=Start(dataclasses.replace(saved[6], hook_state=None))))
    assert exact.losses == pytest.approx(whole.losses[6:], rel=1e-5, abs=1e-7)
    assert amnesic.losses != pytest.approx(whole.losses[6:], rel=1e-5, abs=1e-7)


def _roundtrip(state, tmp_path):
    path = tmp_path / f"step{state.trainer.step}"
    path.mkdir()
    save_checkpoint_dir(str(path), state)
    return load_checkpoint_dir(str(path), 0)


class single_rank_group:
    def __enter__(self):
        torch.set_num_threads(1)
        init_single_rank_group()

    def __exit__(self, *exc):
        dist.destroy_process_group()


def test_provenance_is_recorded_on_the_trials_mlflow_run(tmp_path):
    """nan_source / first_nan_step / nan_rank / bucket / parameter names as tags and metrics,
    and nan_provenance.json as an artifact of the trial's run."""
    from mlflow.tracking import MlflowClient

    from service import tracking

    uri = store_uri(tmp_path)
    cfg = make_cfg(steps=6, world_sizes=(1,), faults=[{"kind": "nan_grad", "step": 3, "rank": 0}])
    trial = trial_of(cfg, 1)
    run_id = tracking.start_child_run(tracking.start_parent_run(cfg, None, tracking_uri=uri), trial, cfg,
                                      tracking_uri=uri)
    with single_rank_group():
        run_training(trial, cfg, TrainingContext(rank=0, world_size=1, device="cpu",
                     logger=tracking.MetricLogger(run_id, uri, flush_seconds=60)))
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.tags["status"] == "nan" and run.data.tags["nan_source"] == "model_grad"
    assert run.data.tags["first_nan_step"] == "3" and run.data.tags["nan_rank"] == "0"
    assert "0.weight" in run.data.tags["nan_params"].split(",")  # the tiny MLP's first layer
    assert run.data.metrics["nan_detected"] == 1 and run.data.metrics["first_nan_step"] == 3
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [1, 2, 3]
    local = client.download_artifacts(run_id, "nan_provenance.json", str(tmp_path))
    report = json.load(open(local))
    assert report["nan_source"] == "model_grad" and report["first_nan_step"] == 3
    assert report["bucket_index"] == int(run.data.tags["nan_bucket_index"])


# ----------------------------------------------------------------------------- Ray


@pytest.mark.ray
def test_a_crashed_worker_restarts_from_its_checkpoint_and_continues_its_run(tmp_path, monkeypatch, two_ranks):
    """Real Ray Tune + Ray Train, through the sweep itself (service.sweep.run_sweep in this
    process): rank 1's process dies (os._exit) at step 8; Ray Train restarts the worker group
    from the step-6 checkpoint (checkpoint.max_failures: 1 reaches the trainer); the trial's
    MLflow run continues: one run, every step logged exactly once, restarts = 1, the trial ok,
    and the same losses as the run that never crashed.

    (This also stands for the CLI-level "crashed trial restarts in the same run" check that
    test_sweep_e2e used to run as a sweep of its own: same sweep path, one Ray start fewer.)"""
    import io

    import ray
    from mlflow.tracking import MlflowClient

    from service.sweep import run_sweep

    uri = store_uri(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # always a local Ray
    # run_sweep sets these for Tune's console output and signal handling: undone after the test
    for var in ("RAY_AIR_NEW_OUTPUT", "TUNE_DISABLE_SIGINT_HANDLER"):
        monkeypatch.setenv(var, os.environ.get(var, ""))
    cfg = resume_cfg(faults=[{"kind": "crash", "step": 8, "rank": 1}],
                     tracking={"transport_probe": False})  # nothing here reads the transport
    cfg = SweepConfig.model_validate({**cfg.model_dump(), "storage_path": str(tmp_path / "ray")})
    trial = cfg.trials()[0]
    progress = io.StringIO()
    try:
        outcome = run_sweep(cfg, tmp_path / "crash.yaml", out=progress)
    finally:
        ray.shutdown()
    assert not outcome.interrupted and outcome.failed == 0, (outcome.rows, progress.getvalue())
    assert [row["status"] for row in outcome.rows] == ["ok"]

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(cfg.name).experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert [r.info.run_name for r in children] == [trial.run_name]  # the restart continued the same run
    run = children[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["fault.0.fired"] == "crash@step8" and run.data.tags["status"] == "ok"
    assert run.data.metrics["restarts"] == 1
    history = client.get_metric_history(run.info.run_id, "loss")
    # none missing, none twice: a restart from step 0 (or an older checkpoint) would log repeats
    assert sorted(m.step for m in history) == list(range(1, 10))
    uninterrupted = two_ranks[0]["uninterrupted"].losses  # same config without the crash
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(uninterrupted, rel=1e-5)
    # Ray Train kept the trial's checkpoints under the sweep's storage_path: every 3 steps,
    # the latest (the restart's) at step 6, none at the final step
    kept = sorted(p.name for p in (tmp_path / "ray").rglob("step_*") if p.is_dir())
    assert kept == ["step_00000003", "step_00000006"], kept
