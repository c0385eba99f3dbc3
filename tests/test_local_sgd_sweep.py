"""post_local_sgd and diloco through a real sweep (`python -m service.sweep`, local Ray, Ray Train
workers, a SQLite MLflow store), beside allreduce: their runs, names and metrics, the exchange in
the step timeline, and the report ranking and projecting them like every hook. One sweep of three
trials (module fixture), shared by the tests here."""

from __future__ import annotations

import csv
import json

import pytest
from mlflow.tracking import MlflowClient

from tests.test_sweep_e2e import sweep_of

CONFIG = """
name: local_sgd_sweep
workload: {name: mlp_digits, steps: 24, global_batch_size: 64, lr: 0.05, eval_every: 4, warmup_steps: 2}
search:
  hooks:
    - allreduce
    - {name: post_local_sgd, period: 4}
    - {name: diloco, period: 8, outer_hook: quantization_perchannel}
  world_size: [2]
  seed: [0]
resources: {cpus_per_worker: 0.5}
tracking: {flush_seconds: 1.0, transport_probe: false, timeline_steps: 3}
report:
  cluster: {world_size: 32, link_gbps: 1}
"""
NAMES = ("allreduce-w2-s0", "post_local_sgd-p4-w2-s0", "diloco-p8-quantization_perchannel-c512-w2-s0")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return sweep_of(tmp_path_factory, "local_sgd_sweep", CONFIG)


@pytest.mark.ray
def test_each_configuration_is_a_trial_named_by_its_period_with_its_exchanges_recorded(sweep):
    runs = sweep["runs"]
    assert set(runs) == set(NAMES)
    base, local, diloco = (runs[n].data.metrics for n in NAMES)
    assert runs[NAMES[1]].data.params["period"] == "4"
    assert local["syncs"] == 6 and diloco["syncs"] == 3  # 24 steps
    for m in (local, diloco):
        assert m["sync_ms"] > 0 and m["replica_drift"] > 0 and "syncs" not in base
    # the exchange's bytes averaged over the steps: post-local SGD allreduces the parameters every
    # 4 steps, the same bytes allreduce sends for the gradient every step
    assert local["comm_bytes_per_step"] == pytest.approx(base["comm_bytes_per_step"] / 4, rel=1e-9)
    assert diloco["comm_bytes_per_step"] < base["comm_bytes_per_step"] / 8 / 2  # uint8, every 8 steps


@pytest.mark.ray
def test_the_step_timeline_samples_local_steps_and_times_the_exchange_apart(sweep):
    client = MlflowClient(tracking_uri=sweep["uri"])
    for name, period in ((NAMES[1], 4), (NAMES[2], 8)):
        run = sweep["runs"][name]
        path = client.download_artifacts(run.info.run_id, "step_timeline.json")
        data = json.loads(open(path).read())
        assert data["sync"]["period"] == period and data["sync"]["comm_ms"] > 0
        assert not any(step % period == 0 for step in data["sampled_steps"])
    assert data["sync"]["hook"] == "quantization_perchannel"


@pytest.mark.ray
def test_the_report_ranks_and_projects_them_beside_the_per_step_hook(sweep):
    out = sweep["report"]
    summary = (out / "summary.md").read_text()
    for label in ("post_local_sgd-p4", "diloco-p8-quantization_perchannel-c512"):
        assert f"| {label} | 2 | loopback |" in summary
    assert "| syncs | sync ms (median) |" in summary
    rows = list(csv.DictReader(open(out / "projection.csv")))
    cluster = {r["config"]: r for r in rows if (r["world_size"], r["link_gbps"]) == ("32", "1.0")}
    assert set(cluster) == {"allreduce", "post_local_sgd-p4", "diloco-p8-quantization_perchannel-c512"}
    # post-local SGD's exchange is allreduce's collective on the same parameters, every 4 steps, and
    # its local steps send nothing. (diloco's uint8 outer hook is an allgather: at W = 32 it may cost
    # more than allreduce, as the allgather-based quantizers do beyond W = 8.)
    steps = {c: float(r["projected_step_ms"]) for c, r in cluster.items()}
    assert steps["post_local_sgd-p4"] < steps["allreduce"]
    answer = json.loads((out / "answer.json").read_text())
    assert answer["cluster"]["answer"] in cluster and {r["cell_winner"] for r in cluster.values()} == {answer["cluster"]["answer"]}
