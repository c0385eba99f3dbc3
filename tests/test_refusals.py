"""Refusals that arrive (issue 27, item 1).

A start-of-trial refusal is raised inside a Ray Train worker; Ray pickles it to carry it to
the driver. An exception that does not survive a pickle round trip reaches the user as
"WorkerHealthCheckFailedError: A worker health check failed." instead of its own line.
"""
from __future__ import annotations

import importlib
import inspect
import os
import pickle
import pkgutil
import re
from pathlib import Path

import pytest

from tests.stores import store_uri

from tests.reaper import left_running

import service

ROOT = Path(__file__).resolve().parent.parent


def _service_exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of the service package (walked, not listed:
    a new one is covered without touching this test)."""
    found = {}
    for info in pkgutil.walk_packages(service.__path__, prefix="service."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def _an_instance(cls: type[BaseException]) -> BaseException:
    """The class built with a distinct string for every required argument (positional or
    keyword-only), as the service raises it."""
    if "__init__" not in {k for c in cls.__mro__ if c.__module__.startswith("service") for k in vars(c)}:
        return cls("the message")  # BaseException's own constructor
    args, kwargs = [], {}
    for p in inspect.signature(cls).parameters.values():
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        value = f"{p.name} text"
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


def test_the_walk_finds_the_service_exceptions():
    names = {c.__name__ for c in _service_exception_classes()}
    assert {"WorkloadError", "ConfigError", "FieldProblem", "SweepError", "StoreError"} <= names, names


@pytest.mark.parametrize("cls", _service_exception_classes(), ids=lambda c: c.__qualname__)
def test_every_service_exception_survives_a_pickle_round_trip_with_its_message(cls):
    err = _an_instance(cls)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert vars(back) == vars(err)  # the typed fields (a ConfigError's field, a FieldProblem's field)


def test_a_workload_error_keeps_its_one_line_through_pickle():
    from service.train.preflight import WorkloadError

    err = pickle.loads(pickle.dumps(WorkloadError("x", "bad\nthing")))
    assert str(err) == "workload 'x': bad thing"


# ----------------------------------------------------------------------------- through a real sweep

REFUSALS_CONFIG = """
name: refusals
workload: {{name: "tests.dict_workload:refusal_by_seed", steps: 4, global_batch_size: 32, lr: 0.05,
           eval_every: 4, warmup_steps: 1, find_unused_parameters: false}}
search: {{hooks: [allreduce], world_size: [2], seed: {seeds}}}
resources: {{cpus_per_worker: 0.5, max_concurrent_trials: 2}}
tracking: {{flush_seconds: 1.0, transport_probe: false}}
"""
W = "workload 'tests.dict_workload:refusal_by_seed': "
# seed -> the refusal docs/workloads.md documents for it (tests.dict_workload.REFUSALS[seed])
DOCUMENTED = {
    0: W + "not deterministic for seed: rank 1's initial weights differ from rank 0's (4 tensors, first "
           "0.weight); build the model from torch's RNG only (the seed is set for you; seed numpy/random yourself)",
    1: W + "not deterministic for seed: rank 1's training or eval data differ from rank 0's; split and "
           "shuffle the data from the seed only",
    2: W + "inconsistent batches: train_set[0] is a dict with keys label, pixels but train_set[750] is a "
           "dict with keys image, label",
    3: W + "loss_fn takes (x, y) items but train_set[0] is a dict with keys label, pixels; give "
           "batch_loss(model, batch) for other batches",
    4: W + "batch_loss returned a tensor of shape (2,); expected a scalar (0-dim) tensor: reduce it, e.g. "
           "with .mean()",
    5: W + "batch_loss failed on a batch of 2 training samples: KeyError: 'labels'",
    6: W + "2 parameters get no gradient in a training step (eval_head.weight, eval_head.bias) but "
           "workload.find_unused_parameters is false: DDP would fail at the second step; set it to auto or true",
}


def _refusals_on_two_ranks(rank, world_size, dump):
    """Every seed's trial of ``dump`` on this real gloo group: seed -> its refusal's text (None: none)."""
    from service.config import SweepConfig
    from service.train.context import TrainingContext
    from service.train.loop import run_training
    from service.train.preflight import WorkloadError

    cfg = SweepConfig.model_validate(dump)
    out = {}
    for trial in cfg.trials():
        try:
            run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
            out[trial.seed] = None
        except WorkloadError as err:
            out[trial.seed] = str(err)
    return out


def _config(seeds) -> dict:
    import yaml

    return yaml.safe_load(REFUSALS_CONFIG.format(seeds=sorted(seeds)))


def test_every_documented_refusal_is_raised_on_every_rank_with_its_documented_line():
    """Each of the seven refusals, detected in the training loop of a real 2-rank gloo group
    (no Ray: the sweep below carries a few of them through Ray to the table and the runs)."""
    from service.config import SweepConfig
    from tests.dist_utils import run_distributed

    dump = SweepConfig.model_validate(_config(DOCUMENTED)).model_dump()
    ranks = run_distributed(_refusals_on_two_ranks, 2, args=(dump,))
    for rank in (0, 1):
        assert ranks[rank] == DOCUMENTED, rank
    # the docs list exactly these lines (with the example workload's name)
    docs = (ROOT / "docs" / "workloads.md").read_text()
    for line in DOCUMENTED.values():
        assert line.replace("tests.dict_workload:refusal_by_seed", "mypkg.wl:build") in docs, line


# Through Ray: a refusal of the group (rank 1's weights differ: found by comparing across ranks)
# and one of the first training step (parameters without a gradient): each raised inside a Ray
# Train worker and pickled to the driver.
THROUGH_RAY = (0, 6)


@pytest.fixture(scope="module")
def refusals_sweep(tmp_path_factory):
    """One real sweep (local Ray, SQLite MLflow), one trial per refusal of THROUGH_RAY."""
    from tests.test_sweep_e2e import run_sweep_cli

    tmp = tmp_path_factory.mktemp("refusals")
    config = tmp / "refusals.yaml"
    config.write_text(REFUSALS_CONFIG.format(seeds=list(THROUGH_RAY)))
    uri = store_uri(tmp)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return run_sweep_cli(config, tmp, uri, reaper_out=tmp / "left.json"), uri, tmp / "left.json"


@pytest.mark.ray
@pytest.mark.timeout(1500)
def test_refusals_raised_in_ray_workers_arrive_in_the_table_and_on_the_trials_run(refusals_sweep):
    from mlflow.tracking import MlflowClient

    from tests.test_sweep_e2e import child_runs_by_name

    proc, uri, left = refusals_sweep
    out = proc.stdout
    assert proc.returncode == 1, f"{out}\n{proc.stderr}"  # every trial failed, the sweep did not
    assert left_running(left) == {}  # its Ray instance stopped whole, though every trial failed
    assert "Traceback" not in out + proc.stderr and "WorkerHealthCheckFailedError" not in out
    runs = child_runs_by_name(MlflowClient(tracking_uri=uri), "refusals")
    assert set(runs) == {f"allreduce-w2-s{seed}" for seed in THROUGH_RAY}
    for seed in THROUGH_RAY:
        line, name = DOCUMENTED[seed], f"allreduce-w2-s{seed}"
        shown = next(ln for ln in out.splitlines() if ln.startswith(f"  {name}: "))
        # the failing ranks (each refuses alike), each with the documented line and nothing else
        one = rf"rank \d: WorkloadError: {re.escape(line)}"
        assert re.fullmatch(rf"  {re.escape(name)}: {one}(; {one})*", shown), shown
        run = runs[name]
        assert run.info.status == "FAILED" and run.data.tags["status"] == "failed"
        assert run.data.tags["error"].splitlines()[0] == shown.split(": ", 1)[1].strip()


# ----------------------------------------------------------------------------- a model people bring

MOE_CONFIG = """
name: moe
workload: {name: "tests.user_models:tiny_moe", steps: 6, global_batch_size: 32, lr: 0.05, eval_every: 6,
           warmup_steps: 1}
search: {hooks: [allreduce, {name: powersgd, start_iter: 2}], bucket_cap_mb: [25, 0.002], world_size: [2]}
resources: {cpus_per_worker: 0.5, max_concurrent_trials: 2}
tracking: {flush_seconds: 1.0, transport_probe: false}
"""


@pytest.fixture(scope="module")
def moe_sweep(tmp_path_factory):
    """A mixture of experts (experts a batch never routes to get no gradient) through a real
    sweep, with DDP's bucket cap as an axis."""
    from tests.test_sweep_e2e import run_sweep_cli

    tmp = tmp_path_factory.mktemp("moe")
    (tmp / "moe.yaml").write_text(MOE_CONFIG)
    uri = store_uri(tmp)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return run_sweep_cli(tmp / "moe.yaml", tmp, uri, reaper_out=tmp / "left.json"), uri, tmp / "left.json"


@pytest.mark.ray
@pytest.mark.timeout(1500)
def test_a_model_with_parameters_unused_in_training_sweeps_with_find_unused_parameters_on(moe_sweep):
    from mlflow.tracking import MlflowClient

    from tests.test_sweep_e2e import child_runs_by_name

    proc, uri, left = moe_sweep
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    # nothing of its Ray instance left running: a model with unused parameters once left a
    # ray::TrainController behind
    assert left_running(left) == {}
    client = MlflowClient(tracking_uri=uri)
    runs = child_runs_by_name(client, "moe")
    # tracking.transport_probe: false: no probe ran, and the parent run says why (for the report)
    parent = client.get_run(next(iter(runs.values())).data.tags["mlflow.parentRunId"])
    assert "transport measured" not in proc.stdout
    assert parent.data.tags["transport_not_measured"] == "tracking.transport_probe is false"
    assert set(runs) == {"allreduce-w2-s0", "allreduce-b0.002-w2-s0", "powersgd-start_iter2-w2-s0",
                         "powersgd-start_iter2-b0.002-w2-s0"}
    for name, run in runs.items():
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok", name
        assert run.data.tags["find_unused_parameters"].startswith("on (auto): experts."), name
        small = "-b0.002-" in name
        assert run.data.params["bucket_cap_mb"] == ("0.002" if small else "25.0"), name
        assert run.data.tags["trial_config"] == name.rsplit("-w2", 1)[0]  # the report's label
        if small:  # DDP cut the gradient into several buckets
            assert run.data.metrics["hook_calls_per_step"] > 1, name
        # the measured answer as for any model: the step timeline, and the baseline paired beside
        # the trial's own hook (both on a copy of the module, never through the trial's reducer)
        assert "timeline_step_ms" in run.data.metrics, name
        if name.startswith("powersgd"):
            assert run.data.metrics["paired_windows"] >= 1 and run.data.metrics["step_ratio_vs_baseline"] > 0, name
    # the table says which cap each trial ran with
    assert any(ln.startswith("powersgd ") and "bucket_cap_mb=0.002" in ln for ln in proc.stdout.splitlines())
