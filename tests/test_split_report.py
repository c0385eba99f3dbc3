"""The report of a split network sweep (issue 24 item 3, service/answer/links.py), on a real
MLflow SQLite store shaped as the sweep writes it: per configuration one quality run on loopback
(30 steps) and one timing run per link (10 steps). The report's trials are one per (quality run,
link): quality from the quality run, speed from that link's timing run; the time to target is the
quality run's crossing step priced with the timing run's step times; ``time_to_target_s`` lands on
the timing runs.
"""

from __future__ import annotations

import time

import pytest

from tests.stores import store_uri

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, RunTag  # noqa: E402

from service import report, tracking  # noqa: E402
from service.config import TrialSpec  # noqa: E402
from service.report.build import record_answer  # noqa: E402

STEPS, TIMING_STEPS = 30, 10
# configuration -> (eval loss at steps 10, 20, 30; timing step ms after the first, per link)
RUNS = {"allreduce": ((1.0, 0.5, 0.4), {1.0: 100.0, 2.5: 40.0}),
        "fp16_compress": ((1.0, 0.45, 0.402), {1.0: 50.0, 2.5: 20.0})}


def _run(client, exp_id, parent_id, trial: TrialSpec, metrics: list[Metric]) -> str:
    run = client.create_run(exp_id, run_name=trial.run_name,
                            tags={**tracking.identity_tags(trial), "mlflow.parentRunId": parent_id})
    client.log_batch(run.info.run_id, metrics=metrics, tags=[RunTag("status", "ok")])
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def _metrics(summary: dict, step_ms: list[float], eval_loss: dict[int, float]) -> list[Metric]:
    now = int(time.time() * 1000)
    out = [Metric(k, v, now, 0) for k, v in summary.items()]
    out += [Metric("step_time_ms", ms, now, step) for step, ms in enumerate(step_ms, start=1)]
    out += [Metric("loss", 2.0 / step, now, step) for step in range(1, len(step_ms) + 1)]
    out += [Metric("eval_loss", v, now, step) for step, v in eval_loss.items()]
    return out


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("split")
    uri = store_uri(tmp)
    client = MlflowClient(uri)
    exp_id = client.create_experiment("split", artifact_location=(tmp / "artifacts").as_uri())
    parent_id = client.create_run(exp_id, run_name="sweep-split").info.run_id
    ids = {}
    for hook, (evals, timing) in RUNS.items():
        quality = TrialSpec(hook=hook, hook_params={"error_feedback": False} if hook != "allreduce" else {},
                            world_size=2, seed=0, kind="quality")
        eval_loss = dict(zip((10, 20, 30), evals))
        ids[hook, None] = _run(client, exp_id, parent_id, quality, _metrics(
            {"final_eval_loss": evals[-1], "final_loss": 0.3, "samples_per_s": 9999.0, "step_time_ms_median": 5.0},
            [5.0] * STEPS, eval_loss))
        for gbps, ms in timing.items():
            trial = quality.model_copy(update={"link_gbps": gbps, "kind": "timing"})
            ids[hook, gbps] = _run(client, exp_id, parent_id, trial, _metrics(
                {"final_eval_loss": 1.5, "final_loss": 1.9, "samples_per_s": 64_000.0 / ms,
                 "step_time_ms_median": ms, "comm_bytes_per_step": 1000.0},
                [2 * ms] + [ms] * (TIMING_STEPS - 1), {TIMING_STEPS: 1.5}))
    client.set_terminated(parent_id, "FINISHED")
    reader = report.open_store(uri)
    return {"client": client, "ids": ids, "reader": reader, "sweep": report.load_sweep(reader, parent_id)}


def test_each_quality_run_is_one_trial_per_link_with_its_timing_runs_speed(split):
    sweep, ids = split["sweep"], split["ids"]
    assert len(sweep.runs) == 6 and len(sweep.trials) == 4
    assert sorted((t.config, t.link) for t in sweep.trials) == [
        ("allreduce", "1 Gbit/s"), ("allreduce", "2.5 Gbit/s"),
        ("fp16_compress", "1 Gbit/s"), ("fp16_compress", "2.5 Gbit/s")]
    for t in sweep.trials:
        gbps = float(t.link.split()[0])
        assert t.run_id == ids[t.hook, None] and t.timing.run_id == ids[t.hook, gbps]
        assert t.metric("final_eval_loss") == RUNS[t.hook][0][-1]   # the quality run's, not the timing run's 1.5
        assert t.metric("step_time_ms_median") == RUNS[t.hook][1][gbps]  # the link's, not loopback's 5 ms
        assert t.state == "ok" and len(t.loss[0]) == STEPS and len(t.step_time_ms[0]) == TIMING_STEPS
    rows = report.summary_rows(sweep)
    assert {(r.config, r.link): r.mean("step_time_ms_median") for r in rows} == {
        (h, f"{g:g} Gbit/s"): ms for h, (_, timing) in RUNS.items() for g, ms in timing.items()}
    assert all(r.mean("final_eval_loss") == RUNS[r.hook][0][-1] for r in rows)


def test_time_to_target_is_the_quality_runs_crossing_at_the_links_step_times(split):
    by = {(t.hook, t.link): t.time_to_target for t in split["sweep"].trials}
    # target 0.4 * 1.01 = 0.404; allreduce crosses it at step 29.6 (0.5 at 20, 0.4 at 30);
    # at 1 Gbit/s: steps 1-10 as timed (200 + 9 x 100 ms), then 100 ms a step (its measured mean)
    allreduce = by["allreduce", "1 Gbit/s"]
    assert allreduce.step == pytest.approx(29.6)
    assert allreduce.seconds == pytest.approx((200 + 9 * 100 + 19 * 100 + 0.6 * 100) / 1000)
    fp16 = by["fp16_compress", "2.5 Gbit/s"]  # 0.45 at 20, 0.402 at 30
    crossing = 20 + (0.45 - 0.404) / (0.45 - 0.402) * 10
    assert fp16.step == pytest.approx(crossing)
    assert fp16.seconds == pytest.approx((40 + 9 * 20 + (crossing - 10) * 20) / 1000)
    recs = {r.link: r for r in report.recommendations(split["sweep"])}
    assert set(recs) == {"1 Gbit/s", "2.5 Gbit/s"}
    assert recs["1 Gbit/s"].choice.config == "fp16_compress"


def test_time_to_target_is_recorded_on_the_timing_runs(split):
    record_answer(split["reader"], split["sweep"], report.recommendations(split["sweep"]))
    client, ids = split["client"], split["ids"]
    for (hook, gbps), run_id in ids.items():
        metrics = client.get_run(run_id).data.metrics
        if gbps is None:
            assert "time_to_target_s" not in metrics  # a quality run has no link to time
        else:
            t = next(t for t in split["sweep"].trials if t.timing and t.timing.run_id == run_id)
            assert metrics["time_to_target_s"] == pytest.approx(t.time_to_target.seconds)
