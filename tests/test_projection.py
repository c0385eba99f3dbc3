"""service.projection: the report's projected-throughput table and plot, from a real store.

Real trials (run_training on an in-process gloo group of one rank, the real hooks and their
accounting) log into a temporary SQLite MLflow store under one parent run; the projection is
rebuilt from MLflow alone and checked against hooks.cost for the logged accounting."""

from __future__ import annotations

import datetime
import math

import pytest
import torch
import torch.distributed as dist

import hooks
from service import projection, report
from service.config import SweepConfig
from tests.dist_utils import free_port

pytestmark = pytest.mark.timeout(1500)  # three short trainings: minutes on a loaded machine

HOOKS = ["allreduce", "fp16_compress", {"name": "quantized_allreduce", "chunk_size": 256}]


def make_cfg() -> SweepConfig:
    return SweepConfig.model_validate({
        "name": "projection-test",
        "workload": {"name": "tests.tiny_workload:tiny_digits", "steps": 5,
                     "global_batch_size": 32, "lr": 0.05, "eval_every": 100, "warmup_steps": 2},
        "search": {"hooks": HOOKS, "world_size": [1], "seed": [0]},
        "tracking": {"flush_seconds": 0.5},
    })


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    from service import tracking
    from service.train import run_training

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        cfg = make_cfg()
        parent = tracking.start_parent_run(cfg, None, tracking_uri=uri)
        for trial in cfg.trials():
            run_id = tracking.start_child_run(parent, trial, cfg, uri)
            with tracking.MetricLogger(run_id, uri, 0.5) as logger:
                run_training(trial, cfg, rank=0, world_size=1, device="cpu", logger=logger)
            tracking.end_run(run_id, "FINISHED", tracking_uri=uri)
        tracking.end_run(parent, "FINISHED", tracking_uri=uri)
    finally:
        dist.destroy_process_group()
    return {"uri": uri, "parent": parent, "client": MlflowClient(uri)}


@pytest.fixture(scope="module")
def projections(store):
    sweep = report.load_sweep(report.open_store(store["uri"]), store["parent"])
    return sweep, projection.project(sweep)


def test_table_equals_cost_model_for_logged_accounting(store, projections):
    sweep, projs = projections
    assert [p.config for p in projs] == ["allreduce", "fp16_compress", "quantized_allreduce-c256"]
    client = store["client"]
    logged = {t.config: client.get_run(t.run_id).data.metrics for t in sweep.trials}
    compute = logged["allreduce"]["compute_ms_per_step"]  # the baseline's, for every configuration
    header, rows = projection.table(projs)
    for p, row in zip(projs, rows):
        m = logged[p.config]
        assert m["hook_calls_per_step"] >= 1 and m["raw_bytes_per_step"] > 0
        stats = {"calls": m["hook_calls_per_step"], "raw_bytes": m["raw_bytes_per_step"],
                 "payload_bytes": m["payload_bytes_per_step"],
                 "allreduce_calls": m["allreduce_calls_per_step"]}
        params = {"chunk_size": 256} if p.hook == "quantized_allreduce" else {}
        for w in projection.WORLD_SIZES:
            for gbps in projection.LINKS_GBPS:
                step_s = hooks.cost.projected_step_seconds(compute / 1000, p.hook, stats, 1, w, gbps, **params)
                assert p.step_ms[(w, gbps)] == pytest.approx(1000 * step_s, rel=1e-12)
                # weak scaling: the measured per-rank batch (32 at W=1) on each of w ranks
                assert p.samples_per_s[(w, gbps)] == pytest.approx(32 * w / step_s, rel=1e-12)
                cell = row[header.index(f"W={w} @{gbps} Gbit/s")]
                assert cell.startswith(f"{32 * w / step_s:,.0f}")
        # the trial's own logged projection at its world size (1: no communication) agrees
        assert m["projected_step_ms_10gbps"] == pytest.approx(m["compute_ms_per_step"])


def test_compression_pays_off_where_the_model_says(projections):
    _, projs = projections
    by = {p.config: p for p in projs}
    base, qar = by["allreduce"], by["quantized_allreduce-c256"]
    for key in base.step_ms:
        assert base.speedup[key] == pytest.approx(1.0)
        # quantized_allreduce sends ~a quarter of the bytes in 2x the messages: it wins exactly
        # where its projected step is shorter
        assert (qar.speedup[key] > 1) == (qar.step_ms[key] < base.step_ms[key])
    assert projection.pays_off(base) == "baseline"
    text = projection.pays_off(qar)
    assert "at 10 Gbit/s" in text and "at 100 Gbit/s" in text
    wins_10 = [w for w in projection.WORLD_SIZES if qar.speedup[(w, 10)] > 1]
    assert wins_10, "a quarter of the bytes must win somewhere on 10 Gbit/s"


def test_report_has_the_projection_table_and_plot(store, tmp_path):
    out = tmp_path / "report"
    page = report.build_report(store["parent"], tracking_uri=store["uri"], out_dir=out).read_text()
    from service import plots

    image = plots.plt.imread(out / projection.IMAGE)
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert "Projected throughput at scale" in page
    assert page.count("data:image/png;base64,") == 4  # loss, throughput, tradeoff, projection
    md = (out / "summary.md").read_text()
    assert "## Projected throughput at scale" in md
    assert "| quantized_allreduce-c256 | 1 |" in md
    attached = {a.path for a in store["client"].list_artifacts(store["parent"])}
    assert projection.IMAGE in attached


def test_sweep_without_accounting_gets_an_empty_projection(tmp_path):
    md = projection.markdown([])
    assert "No trial logged" in md
    path = projection.plot([], tmp_path / "p.png")
    assert path.stat().st_size > 0


def test_swept_params_of_the_compressors_reach_the_cost_model(tmp_path):
    """MLflow hands params back as strings: a swept topk ratio or qsgd chunk size must price
    the bytes that trial sent, not the hook's defaults. The trial record carries them typed,
    as the config had them (identity tags written when the run was created)."""
    from service import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = SweepConfig.model_validate({
        "name": "projection-params", "workload": {"name": "mlp_digits", "steps": 10},
        "search": {"hooks": [{"name": "topk", "ratio": 0.1, "error_feedback": True},
                             {"name": "qsgd", "levels": 7, "chunk_size": 64},
                             {"name": "signsgd", "chunk_size": 128, "majority_vote": True}],
                   "world_size": [1], "seed": [0]}})
    parent = tracking.start_parent_run(cfg, None, tracking_uri=uri)
    for trial in cfg.trials():
        tracking.start_child_run(parent, trial, cfg, tracking_uri=uri)
    records = {r.hook: r for r in tracking.SweepReader(uri).trials(parent)}
    stats = {"calls": 1, "raw_bytes": 4 * 100_000, "payload_bytes": 0, "allreduce_calls": 0}
    for hook, kwargs in [("topk", {"ratio": 0.1}), ("qsgd", {"levels": 7, "chunk_size": 64}),
                         ("signsgd", {"chunk_size": 128})]:
        params = records[hook].hook_params
        assert {k: params[k] for k in kwargs} == kwargs
        assert all(type(params[k]) is type(v) for k, v in kwargs.items()), params
        got = projection.projected_step_ms(hook, params, stats, 10.0, 8, 10.0)
        expect = 10.0 + 1000 * hooks.cost.hook_seconds(hook, 100_000, 8, 10.0, **kwargs)
        assert got == pytest.approx(expect)
    assert projection.projected_step_ms("topk", records["topk"].hook_params, stats, 0.0, 8, 10.0) > \
        projection.projected_step_ms("topk", {}, stats, 0.0, 8, 10.0)


def test_compute_of_a_trial_on_an_emulated_link_is_its_step_less_the_wire_time():
    """On a shaped link the buckets' hooks wait at the same time, so the worker's
    compute_ms_per_step (step - summed hook time) is 0; the projection takes the step less the
    model's wire time at the link the trial measured instead (bench/network.py: summed hook time
    1.3-1.9x the communication window there)."""
    bucket = 4_273_157 * 4
    metrics = {"compute_ms_per_step": 0.0, "step_time_ms_median": 320.0, "hook_calls_per_step": 2.0,
               "raw_bytes_per_step": 2.0 * bucket, "payload_bytes_per_step": 2.0 * bucket,
               "allreduce_calls_per_step": 2.0, "link_measured_gbps": 0.96, "link_measured_latency_ms": 0.04}
    stats = {"calls": 2.0, "raw_bytes": 2.0 * bucket, "payload_bytes": 2.0 * bucket, "allreduce_calls": 2.0}
    wire_ms = 1000 * hooks.cost.projected_comm_seconds("allreduce", stats, 1, 2, 0.96, latency_s=4e-5)
    assert 270 < wire_ms < 300  # 34 MB through a ring of 2 at 0.96 Gbit/s
    assert projection.trial_compute_ms("allreduce", {}, metrics, 2) == pytest.approx(320.0 - wire_ms)
    # on loopback (no measured link) the worker's own figure stands
    loopback = {k: v for k, v in metrics.items() if not k.startswith("link_")}
    assert projection.trial_compute_ms("allreduce", {}, {**loopback, "compute_ms_per_step": 31.0}, 2) == 31.0
    # a link slower than the step allows: never negative
    assert projection.trial_compute_ms("allreduce", {}, {**metrics, "step_time_ms_median": 100.0}, 2) == 0.0


def test_a_step_repriced_on_a_slower_link_overlaps_allreduce_transport_and_keeps_the_rest():
    cost = hooks.cost
    # 2 allreduces of 8.5 MB per step at W=2: 17 MB sent per rank per step
    ar = {"allreduce_calls": 2, "allreduce_bytes": 17e6}
    fast = cost.wire_seconds_by_kind(ar, 1, 2, 8.0, 0.0)
    slow = cost.wire_seconds_by_kind(ar, 1, 2, 1.0, 0.0)
    assert slow["allreduce"] == pytest.approx(17e6 / 125e6) and slow["allgather"] == 0.0
    # the allreduce moved its bytes at 4 Gbit/s on the fast link (transport 34 ms, CPU-bound, more
    # than the 17 ms of wire there): on 1 Gbit/s the 136 ms of wire hides it; the rest of the step stays
    step = cost.projected_step_from_measured(0.100, ar, 1, 2, 8.0, 0.0, 1.0, 0.0, 8 / 4e9)
    assert step == pytest.approx(0.100 - 0.034 + 0.136)
    # a link faster than that transport changes nothing
    assert cost.projected_step_from_measured(0.100, ar, 1, 2, 8.0, 0.0, 100.0, 0.0, 8 / 4e9) == pytest.approx(0.100)
    # an allgather's fast-link time stays: only its wire time changes
    ag = {"allgather_calls": 1, "allgather_bytes": 4e6}
    step = cost.projected_step_from_measured(0.050, ag, 1, 2, 8.0, 0.0, 1.0, 0.0, 8 / 4e9)
    assert step == pytest.approx(0.050 - 4e6 / 1e9 + 4e6 / 125e6)
