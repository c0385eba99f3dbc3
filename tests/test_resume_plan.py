"""--resume picks the right sweep: the experiment's latest sweep *of the same config*.

Real SQLite MLflow store, runs written through service.tracking as the sweep writes them (the
trial_key tag --resume matches on comes with the run: tracking.identity_tags); no
Ray (the interrupted-sweep path end to end is tests/test_resume.py; the links a --resume measures, at
run_sweep's call, with netem hosts and the test's init_ray stopping it where Ray would start).
"""
from __future__ import annotations

import io
import os
import re

import pytest

from tests.stores import store_uri

from service import tracking
from service.config import SweepConfig
from service.sweep.errors import SweepError
from service.sweep.resume import plan_resume


def make_cfg(steps: int = 20, **resources) -> SweepConfig:
    return SweepConfig.model_validate({
        "name": "resume_plan",
        "workload": {"name": "mlp_digits", "steps": steps, "global_batch_size": 8, "lr": 0.05},
        "search": {"hooks": ["allreduce", "fp16_compress"], "world_size": [1], "seed": [0]},
        "resources": resources,
    })


def interrupted_sweep(cfg: SweepConfig, uri: str, finished: int) -> tuple[str, list[str]]:
    """A parent run whose first ``finished`` trials ended FINISHED and the next one KILLED."""
    parent = tracking.start_parent_run(cfg, None, tracking_uri=uri)
    run_ids = []
    for i, trial in enumerate(cfg.trials()[: finished + 1]):
        run_id = tracking.start_child_run(parent, trial, cfg, tracking_uri=uri)
        tracking.end_run(run_id, "FINISHED" if i < finished else "KILLED", tracking_uri=uri)
        run_ids.append(run_id)
    tracking.end_run(parent, "KILLED", tracking_uri=uri)
    return parent, run_ids


@pytest.fixture
def uri(tmp_path):
    return store_uri(tmp_path)


def test_fingerprint_ignores_speed_settings_but_not_what_trials_compute():
    base = make_cfg()
    assert make_cfg(cpus_per_worker=0.5, max_concurrent_trials=2).fingerprint() == base.fingerprint()
    # what a sweep records beside its trials (not what they compute): a sweep recorded before
    # tracking.transport_probe existed resumes with it at either value
    quiet = base.model_copy(update={"tracking": base.tracking.model_copy(
        update={"transport_probe": False, "timeline_steps": 0, "paired_timing_every": 0})})
    assert quiet.fingerprint() == base.fingerprint()
    assert make_cfg(steps=21).fingerprint() != base.fingerprint()


def test_resume_continues_the_latest_sweep_of_the_same_config_not_a_newer_other_one(uri):
    cfg = make_cfg()
    parent, (done_run, killed_run) = interrupted_sweep(cfg, uri, finished=1)
    other_parent, _ = interrupted_sweep(make_cfg(steps=40), uri, finished=0)  # same name, newer

    plan = plan_resume(cfg, cfg.trials(), uri)
    chosen, reusable, pending = plan.parent_run_id, plan.reusable_runs, plan.pending

    assert chosen == parent != other_parent
    assert [t.key for t in pending] == [cfg.trials()[1].key]
    assert reusable == {cfg.trials()[1].key: killed_run}
    assert list(plan.done) == [cfg.trials()[0].key]   # how the ended trial ended, for adaptive rounds
    assert tracking.run_tags(parent, uri)["sweep_fingerprint"] == cfg.fingerprint()


def test_resume_of_a_changed_config_is_refused_in_one_line(uri):
    interrupted_sweep(make_cfg(), uri, finished=1)
    with pytest.raises(SweepError, match="ran a different config") as err:
        plan_resume(make_cfg(steps=21), make_cfg(steps=21).trials(), uri)
    assert "\n" not in str(err.value)


def test_resume_without_any_sweep_is_refused(uri):
    with pytest.raises(SweepError, match="no earlier sweep"):
        plan_resume(make_cfg(), make_cfg().trials(), uri)


def test_resume_of_a_sweep_with_runs_from_an_older_version_is_refused_in_one_line(uri):
    """Runs without the trial identity tags (an older version wrote them) are not guessed at."""
    cfg = make_cfg()
    parent, _ = interrupted_sweep(cfg, uri, finished=0)
    client = tracking.client(uri)
    client.create_run(client.get_run(parent).info.experiment_id, run_name="fp16_compress-w1-s0",
                      tags={tracking.PARENT_TAG: parent})
    with pytest.raises(SweepError, match="cannot resume: .*older version") as err:
        plan_resume(cfg, cfg.trials(), uri)
    assert "\n" not in str(err.value)


class _RayNotStarted(Exception):
    """Raised by the test's init_ray: the sweep stops where Ray would start, its links measured."""


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_resume_of_a_network_sweep_with_a_plan_measures_the_links_its_plan_round_trains_on(uri, tmp_path,
                                                                                          monkeypatch):
    """At run_sweep's call (service/sweep/run.py), with the real store, the real plan_resume and
    the real link measurement (netem hosts, a gloo exchange): a sweep on two links with search.plan
    was interrupted in its last trial, fp16_compress on 1 Gbit/s. Its --resume has one trial
    pending, on 1 Gbit/s, but its plan round trains at every link the baseline (allreduce) ran:
    0.5 Gbit/s too. Measuring only the pending trials' links (the call without
    plan_round.trials_to_measure) left 0.5 unmeasured, and the plan trial there failed with
    KeyError after training. The test's init_ray stops the sweep where Ray would start: the links
    are measured before it (nothing of Ray is needed to see which)."""
    from service.sweep.run import run_sweep

    cfg = SweepConfig.model_validate({
        "name": "resume_network_plan",
        "workload": {"name": "mlp_digits", "steps": 20, "global_batch_size": 8, "lr": 0.05},
        "search": {"hooks": ["allreduce", "fp16_compress"], "world_size": [2], "seed": [0],
                   "plan": {"cell": {"world_size": 2, "link_gbps": 1}}},
        "network": {"link_gbps": [0.5, 1]}})
    trials = cfg.trials()
    last = next(i for i, t in enumerate(trials) if t.hook == "fp16_compress" and t.link_gbps == 1)
    trials = [t for i, t in enumerate(trials) if i != last] + [trials[last]]  # interrupted last
    parent = tracking.start_parent_run(cfg, None, tracking_uri=uri)
    for i, trial in enumerate(trials):
        run_id = tracking.start_child_run(parent, trial, cfg, tracking_uri=uri)
        tracking.end_run(run_id, "KILLED" if i == len(trials) - 1 else "FINISHED", tracking_uri=uri)
    tracking.end_run(parent, "KILLED", tracking_uri=uri)
    started = []

    def init_ray(cfg, pending):
        started.append([t.key for t in pending])
        raise _RayNotStarted

    out = io.StringIO()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(_RayNotStarted):
        run_sweep(cfg, tmp_path / "sweep.yaml", cfg.trials(), resume=True, out=out, init_ray=init_ray)
    assert started == [[trials[-1].key]], (started, out.getvalue())  # one trial pending, on 1 Gbit/s
    measured = sorted(float(m) for m in re.findall(r"network: link ([\d.]+) Gbit/s \(", out.getvalue()))
    assert measured == [0.5, 1.0], out.getvalue()  # and the baseline's 0.5 Gbit/s link, for the plan round
