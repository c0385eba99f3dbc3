"""The hf_gpt2 preset through the real sweep (issue 17): local Ray, Ray Train's gloo workers,
a temporary SQLite MLflow store. A short copy of tune_configs/hf_gpt2.yaml (two of its hooks,
8 steps: each trial still costs ~30 s of Ray Train start-up); the whole preset was run by hand,
docs/workloads.md gives its figures."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.stores import store_uri
import yaml

from tests.test_sweep_e2e import run_sweep_cli

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1500),
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                 reason="the .[hf] extra (scripts/setup.sh --test installs it)")]


def test_a_short_hf_gpt2_preset_sweep_trains_and_records_every_trial(tmp_path):
    from mlflow.tracking import MlflowClient

    raw = yaml.safe_load((ROOT / "tune_configs" / "hf_gpt2.yaml").read_text())
    # one eval, at the end (an hf_gpt2 eval is ~3 s here: 9 of a trial's 25 s with three)
    raw["workload"].update(steps=8, eval_every=8, warmup_steps=2, lr_warmup_steps=2)
    raw["search"]["hooks"] = ["allreduce", {"name": "quantized_allreduce", "chunk_size": 512}]
    raw.setdefault("tracking", {})["transport_probe"] = False  # (the smoke sweep probes it)
    config = tmp_path / "hf_short.yaml"
    config.write_text(yaml.safe_dump(raw))
    uri = store_uri(tmp_path)

    proc = run_sweep_cli(config, tmp_path, uri)
    assert proc.returncode == 0, proc.stderr[-3000:]

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("hf_gpt2")
    runs = client.search_runs([experiment.experiment_id])
    children = {r.data.tags["mlflow.runName"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert set(children) == {"allreduce-w2-s0", "quantized_allreduce-c512-w2-s0"}
    for run in children.values():
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok"
        loss = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
        assert sorted(loss) == list(range(1, 9)) and loss[8] < loss[1] - 0.5  # learns from ln 256
        assert {"final_eval_loss", "final_eval_accuracy"} <= set(run.data.metrics)  # hf_gpt2's eval_fn
    exact = children["allreduce-w2-s0"].data.metrics["comm_bytes_per_step"]
    quantized = children["quantized_allreduce-c512-w2-s0"].data.metrics["comm_bytes_per_step"]
    assert quantized < exact / 2  # uint8 codes + scales against fp32 on 40 tensors' buckets
