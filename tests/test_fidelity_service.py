"""Gradient fidelity and projected step times in the service, for real: run_training on 2 gloo
processes, the real hooks, a temporary SQLite MLflow store read back with MlflowClient."""

from __future__ import annotations


import pytest
import torch

import hooks
from service.config import SweepConfig
from tests.dist_utils import run_distributed
from tests.tiny_workload import TINY, tiny_digits

STEPS = 6
FIDELITY_EVERY = 2
WARMUP = 2
# Two spawned ranks import torch and sklearn: seconds on an idle machine, minutes on a loaded one.
pytestmark = pytest.mark.timeout(1500)


def make_cfg(hook: str, fidelity_every: int) -> SweepConfig:
    return SweepConfig.model_validate({
        "name": "fidelity-test",
        "workload": {"name": TINY, "steps": STEPS, "global_batch_size": 32, "lr": 0.05,
                     "eval_every": 100, "warmup_steps": WARMUP},
        "search": {"hooks": [hook], "world_size": [2], "seed": [0]},
        "tracking": {"flush_seconds": 0.5, "fidelity_every": fidelity_every},
    })


CASES = {  # name -> (hook, fidelity_every)
    "allreduce": ("allreduce", FIDELITY_EVERY),
    "pertensor": ("quantization_pertensor", FIDELITY_EVERY),
    "pertensor_off": ("quantization_pertensor", 0),
}


def _ranks(rank, world_size, store, run_ids):
    from service import tracking
    from service.train import TrainingContext, run_training

    out = {}
    for name, (hook, every) in CASES.items():
        cfg = make_cfg(hook, every)
        logger = tracking.MetricLogger(run_ids[name], store, 0.5) if rank == 0 else None
        result = run_training(cfg.trials()[0], cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu",
                              logger=logger))
        out[name] = result.summary
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case trained once on 2 ranks, logged into its own child run of one parent."""
    from service import tracking

    store = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    cfg = make_cfg("allreduce", FIDELITY_EVERY)
    parent = tracking.start_parent_run(cfg, None, tracking_uri=store)
    run_ids = {name: tracking.start_child_run(parent, make_cfg(h, e).trials()[0], make_cfg(h, e), store)
               for name, (h, e) in CASES.items()}
    summaries = run_distributed(_ranks, 2, args=(store, run_ids), timeout_s=1200)
    return store, run_ids, summaries[0]


def _history(store, run_id, key) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    return {m.step: m.value for m in MlflowClient(store).get_metric_history(run_id, key)}


def test_fidelity_is_logged_on_every_nth_step_only(runs):
    store, run_ids, _ = runs
    expected = list(range(FIDELITY_EVERY, STEPS + 1, FIDELITY_EVERY))
    for name in ("allreduce", "pertensor"):
        for key in ("grad_rel_error", "grad_cosine"):
            assert sorted(_history(store, run_ids[name], key)) == expected, (name, key)
    assert _history(store, run_ids["pertensor_off"], "grad_rel_error") == {}
    assert len(_history(store, run_ids["pertensor_off"], "loss")) == STEPS


def test_allreduce_is_exact_and_pertensor_quantization_is_not(runs):
    store, run_ids, summaries = runs
    exact_rel = _history(store, run_ids["allreduce"], "grad_rel_error")
    exact_cos = _history(store, run_ids["allreduce"], "grad_cosine")
    lossy_rel = _history(store, run_ids["pertensor"], "grad_rel_error")
    lossy_cos = _history(store, run_ids["pertensor"], "grad_cosine")
    assert all(v < 1e-6 for v in exact_rel.values()), exact_rel
    assert all(abs(v - 1) < 1e-6 for v in exact_cos.values()), exact_cos
    # uint8 with one min/max per bucket: a visible error, yet the same direction
    assert all(v > 1e-3 for v in lossy_rel.values()), lossy_rel
    assert all(0.5 < v < 1 - 1e-6 for v in lossy_cos.values()), lossy_cos
    # per-step values, not a running mean: the summary is their plain average
    s = summaries["pertensor"]
    assert s["grad_rel_error_mean"] == pytest.approx(sum(lossy_rel.values()) / len(lossy_rel), rel=1e-6)
    assert s["grad_cosine_mean"] == pytest.approx(sum(lossy_cos.values()) / len(lossy_cos), rel=1e-6)
    assert s["grad_fidelity_steps"] == len(lossy_rel)
    assert "grad_rel_error_mean" not in summaries["pertensor_off"]


def test_the_summary_counts_buckets_and_bytes_per_measured_step(runs):
    """raw_bytes_per_step: every gradient once per measured step; hook_calls_per_step: DDP's buckets."""
    store, run_ids, summaries = runs
    n_grad = sum(p.numel() for p in tiny_digits(0).model.parameters())
    for name in ("allreduce", "pertensor_off"):
        s = summaries[name]
        assert s["raw_bytes_per_step"] == 4 * n_grad
        assert s["hook_calls_per_step"] >= 1
        assert s["payload_bytes_per_step"] <= s["raw_bytes_per_step"]
        assert "projected_step_ms_10gbps" not in s and "compute_ms_per_step" not in s  # the old alpha-beta path is gone
