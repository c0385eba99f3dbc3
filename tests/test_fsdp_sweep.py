"""fsdp trials through a real sweep (`python -m service.sweep`, local Ray, Ray Train workers, a
SQLite MLflow store) beside a ddp one: a worker killed mid-trial restarts every trial from its
checkpoint in the same run; the runs carry fsdp's metrics, step timeline and paired timing
against FSDP's own fp32 comms; the report shows fsdp beside ddp and projects it to the cluster.
One sweep of three trials (module fixture), shared by the tests here."""

from __future__ import annotations

import csv
import json

import pytest
from mlflow.tracking import MlflowClient

from tests.test_sweep_e2e import sweep_of

STEPS = 9
CONFIG = f"""
name: fsdp_sweep
workload: {{name: mlp_digits, steps: {STEPS}, global_batch_size: 64, lr: 0.05, eval_every: 4, warmup_steps: 2}}
search:
  parallelism: [ddp, fsdp]
  hooks:
    - allreduce
    - {{name: quantized_allreduce, all_gather: uint8}}     # fsdp's alone: DDP gathers no parameters
  world_size: [2]
  seed: [0]
resources: {{cpus_per_worker: 0.5}}
faults: [{{kind: crash, step: 5, rank: 1}}]               # every trial loses rank 1's process once
checkpoint: {{every: 3, max_failures: 1}}
tracking: {{flush_seconds: 1.0, transport_probe: false, timeline_steps: 3, paired_timing_every: 3}}
report:
  cluster: {{world_size: 32, link_gbps: 1}}
"""
DDP, FSDP, UINT8 = "allreduce-w2-s0", "allreduce-fsdp-w2-s0", "quantized_allreduce-c512-all_gatheruint8-fsdp-w2-s0"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return sweep_of(tmp_path_factory, "fsdp_sweep", CONFIG)


@pytest.mark.ray
def test_a_killed_worker_restarts_each_trial_from_its_checkpoint_in_the_same_run(sweep):
    client = MlflowClient(tracking_uri=sweep["uri"])
    runs = sweep["runs"]
    assert set(runs) == {DDP, FSDP, UINT8}
    for name, run in runs.items():
        assert run.data.params["parallelism"] == ("ddp" if name == DDP else "fsdp")
        assert run.data.tags["fault.0.fired"] == "crash@step5" and run.data.tags["status"] == "ok", name
        assert run.data.metrics["restarts"] == 1, name
        history = client.get_metric_history(run.info.run_id, "loss")
        # from the step-3 checkpoint: none missing, none logged twice
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), name
    # fsdp + allreduce trains as ddp + allreduce does, restart and all
    losses = {n: [m.value for m in sorted(client.get_metric_history(runs[n].info.run_id, "loss"),
                                          key=lambda m: m.step)] for n in (DDP, FSDP)}
    assert losses[FSDP] == pytest.approx(losses[DDP], rel=1e-4)


@pytest.mark.ray
def test_fsdp_runs_record_their_collectives_memory_timeline_and_paired_ratio(sweep):
    client = MlflowClient(tracking_uri=sweep["uri"])
    ddp, fsdp, uint8 = (sweep["runs"][n].data.metrics for n in (DDP, FSDP, UINT8))
    for m in (fsdp, uint8):
        assert m["reduce_scatter_bytes_per_step"] > 0 and m["all_gather_bytes_per_step"] > 0
        assert m["comm_bytes_per_step"] == pytest.approx(m["reduce_scatter_bytes_per_step"]
                                                         + m["all_gather_bytes_per_step"])
        assert m["memory_per_rank_mb"] < ddp["memory_per_rank_mb"]
    assert uint8["all_gather_bytes_per_step"] < fsdp["all_gather_bytes_per_step"] / 3  # a byte a value, and scales
    # timed beside FSDP's own fp32 comms in the same trial; allreduce under fsdp is that baseline
    assert uint8["step_ratio_vs_baseline"] > 0 and "step_ratio_vs_baseline" not in fsdp
    path = client.download_artifacts(sweep["runs"][UINT8].info.run_id, "step_timeline.json")
    data = json.loads(open(path).read())
    kinds = [c["kind"] for c in data["timeline"]["sharded"]]
    assert data["timeline"]["buckets"] == [] and "reduce_scatter" in kinds and "all_gather" in kinds


@pytest.mark.ray
def test_the_report_shows_fsdp_beside_ddp_and_projects_it_to_the_cluster(sweep):
    out = sweep["report"]
    summary = (out / "summary.md").read_text()
    for label in ("allreduce", "allreduce-fsdp", "quantized_allreduce-c512-all_gatheruint8-fsdp"):
        assert f"| {label} | 2 | loopback |" in summary
    assert "| reduce-scatter bytes/step | all-gather bytes/step | memory/rank (MB) |" in summary
    rows = list(csv.DictReader(open(out / "projection.csv")))
    cluster = {r["config"]: r for r in rows if (r["world_size"], r["link_gbps"]) == ("32", "1.0")}
    assert set(cluster) == {"allreduce", "allreduce-fsdp", "quantized_allreduce-c512-all_gatheruint8-fsdp"}
    # each priced from its own recorded step: fsdp's from its collectives, at W = 32's bytes
    assert all(float(r["projected_step_ms"]) > 0 for r in cluster.values())
    answer = json.loads((out / "answer.json").read_text())
    assert answer["cluster"]["answer"] in cluster
    assert {r["cell_winner"] for r in cluster.values()} == {answer["cluster"]["answer"]}


# ----------------------------------------------------------------------------- fsdp alone
# A model one rank cannot hold is swept under fsdp only: no DDP allreduce to judge quality by.
FSDP_ONLY = """
name: fsdp_only
workload: {name: mlp_digits, steps: 16, global_batch_size: 64, lr: 0.05, eval_every: 4, warmup_steps: 2}
search:
  parallelism: [fsdp]
  hooks: [allreduce, {name: quantized_allreduce, all_gather: uint8}]
  world_size: [2]
  seed: [0, 1]
resources: {cpus_per_worker: 0.5}
tracking: {flush_seconds: 1.0, transport_probe: false}
"""


@pytest.fixture(scope="module")
def fsdp_only(tmp_path_factory):
    return sweep_of(tmp_path_factory, "fsdp_only", FSDP_ONLY)


@pytest.mark.ray
def test_a_sweep_of_fsdp_alone_is_judged_against_allreduce_under_fsdp(fsdp_only):
    out = fsdp_only["report"]
    rows = {r["configuration"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    assert set(rows) == {"allreduce-fsdp", UINT8.rsplit("-w2", 1)[0]}
    base, uint8 = rows["allreduce-fsdp"], rows[UINT8.rsplit("-w2", 1)[0]]
    assert base["verdict"] == "baseline" and float(base["loss_gap_mean"]) == 0.0
    # uint8 parameters and gradients: the same loss to a few 1e-4, decided at two seeds
    assert uint8["verdict"] == "matches" and abs(float(uint8["loss_gap_mean"])) < 1e-2
    assert float(base["time_to_target_s_mean"]) > 0 and float(uint8["time_to_target_s_mean"]) > 0
    answer = json.loads((out / "answer.json").read_text())
    assert answer["measured"]["2"]["answer"] in rows and answer["open"] == []
