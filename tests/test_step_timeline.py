"""A trial's own DDP step timeline (service/train/step_sampling.py, service/step_model/):
run_training on 2 real gloo ranks with the timeline sampled and without, the combined timeline's
shape, its JSON round trip, and rank 0's record on the trial's MLflow run read back. No Ray."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from service.config import SweepConfig
from service.step_model.combine import combine_ranks
from service.step_model.trial import TrialTimeline
from service.train import TrainingContext, run_training
from service.train.step_sampling import timeline_steps, window_steps
from tests.dist_utils import run_distributed
from tests.test_worker import single_rank_group, store  # noqa: F401 - fixtures

# fidelity on 3, 6, 9 and paired timing on 4, 8 (after the 2 warm-up steps): the timeline may take 5, 7, 10
STEPS, SAMPLED = 10, (5, 7, 10)


def _cfg(timeline: int, world_size: int = 2, hook: str = "quantization_pertensor") -> SweepConfig:
    return SweepConfig.model_validate({
        "name": "timeline-test",
        "workload": {"name": "tests.tiny_workload:tiny_noisy", "steps": STEPS, "global_batch_size": 32, "lr": 0.05,
                     "eval_every": 5, "warmup_steps": 2},
        # a hook that decodes each rank's message, in several buckets (DDP's bucket cap at 4 KB)
        "search": {"hooks": [hook], "world_size": [world_size], "seed": [0], "bucket_cap_mb": 0.004},
        "tracking": {"flush_seconds": 0.5, "fidelity_every": 3, "paired_timing_every": 4, "timeline_steps": timeline},
    })


def _on_and_off(rank: int, world_size: int):
    out = {}
    for timeline in (0, 3):
        cfg = _cfg(timeline)
        out[timeline] = run_training(cfg.trials()[0], cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return run_distributed(_on_and_off, 2)


def test_sampling_the_timeline_leaves_the_trajectory_untouched(two_ranks):
    for ranks in two_ranks:
        off, on = ranks[0], ranks[3]
        assert on.losses == off.losses  # every step's agreed loss, bit for bit
        # the final weights' eval (rank 0's) and the bytes, exactly
        for metric in ("final_loss", "final_eval_loss", "final_eval_accuracy", "comm_bytes_per_step"):
            assert on.summary.get(metric) == off.summary.get(metric), metric
        # the fidelity adds its buckets' figures up in float32 as their collectives complete
        # (hooks/fidelity.py's then-step), an order that varies from run to run: two runs with the
        # timeline off gave grad_cosine_mean 0.99981446 and 0.99981456 (their losses bit for bit alike)
        for metric in ("grad_rel_error_mean", "grad_cosine_mean"):
            assert on.summary[metric] == pytest.approx(off.summary[metric], rel=1e-6), metric
        assert "step_ratio_vs_baseline" in on.summary and "step_ratio_vs_baseline" in off.summary
        assert off.timeline is None and "timeline_step_ms" not in off.summary
    assert "final_eval_loss" in two_ranks[0][3].summary


def test_the_combined_timeline_has_every_ddp_bucket_in_order_and_the_compute_split(two_ranks):
    result = two_ranks[0][3]
    recorded = result.timeline
    assert recorded.sampled_steps == SAMPLED  # never a fidelity or a paired-timing step
    assert two_ranks[1][3].timeline == recorded  # every rank combined the same gather
    t = recorded.timeline
    assert t.hook == "quantization_pertensor" and t.world_size == 2 and t.batch == 16
    assert math.isinf(t.link_gbps)  # the ordinary network (loopback)
    assert len(t.buckets) == result.summary["hook_calls_per_step"] > 1  # one entry per DDP bucket
    readies = [b.ready_ms for b in t.buckets]
    assert readies == sorted(readies)
    phases = [t.forward_ms, t.backward_end_ms, t.optimizer_ms]
    phases += [v for b in t.buckets for v in (b.ready_ms, b.encode_ms, b.comm_ms, b.decode.fixed_ms,
                                              b.decode.per_unit_ms)]
    assert all(math.isfinite(v) and v >= 0 for v in phases), phases
    assert t.forward_ms > 0 and t.buckets[0].decode.per_unit_ms > 0  # its decode grows per peer
    # the compute at the rank's micro-batch, at half and at a quarter of it, on the bare module
    assert [p.samples for p in recorded.compute_points] == [16, 8, 4]
    assert min(v for p in recorded.compute_points for v in (p.forward_ms, p.backward_ms)) > 0
    summary = result.summary
    assert summary["timeline_steps"] == 3 and summary["timeline_step_ms"] == pytest.approx(recorded.own_step_ms())
    assert summary["timeline_vs_measured"] > 0


def test_the_recorded_timeline_round_trips_through_its_json(two_ranks):
    recorded = two_ranks[0][3].timeline
    text = json.dumps(recorded.to_json(), allow_nan=False)  # strict JSON: no inf link
    assert TrialTimeline.from_json(json.loads(text)) == recorded
    with pytest.raises(ValueError, match="format"):
        TrialTimeline.from_json({**json.loads(text), "format": 99})


def test_steps_sampled_before_ddp_settled_its_buckets_are_left_out(two_ranks):
    recorded = two_ranks[0][3].timeline
    t = recorded.timeline
    early = replace(t, buckets=(replace(t.buckets[0], numel=sum(b.numel for b in t.buckets)),))  # one bucket
    per_rank = [([early, t, t], []), ([early, t, t], [])]
    combined = combine_ranks(per_rank, (3, 5, 7))
    assert combined.sampled_steps == (5, 7) and combined.timeline.buckets == t.buckets
    assert combined.compute_points == () and combined.compute is None  # no compute window: no split
    assert combine_ranks([([], [])], ()) is None  # nothing sampled (a trial stopped early)


def test_rank_0_records_the_timeline_on_the_trials_run(single_rank_group, store):  # noqa: F811 - fixtures
    from service import tracking

    cfg = _cfg(2, world_size=1, hook="allreduce")
    trial = cfg.trials()[0]
    parent = tracking.start_parent_run(cfg, None, tracking_uri=store)
    run_id = tracking.start_child_run(parent, trial, cfg, tracking_uri=store)
    logger = tracking.MetricLogger(run_id, store, cfg.tracking.flush_seconds)
    result = run_training(trial, cfg, TrainingContext(rank=0, world_size=1, device="cpu", logger=logger))

    reader = tracking.SweepReader(store)
    assert result.timeline is not None and reader.step_timeline(run_id) == result.timeline
    metrics = reader.get_run(run_id).data.metrics
    assert metrics["timeline_step_ms"] == pytest.approx(result.timeline.own_step_ms())
    assert metrics["timeline_vs_measured"] == pytest.approx(result.summary["timeline_vs_measured"])
    assert reader.step_timeline(parent) is None  # a run without one


def test_a_compute_window_follows_every_other_sampled_step():
    assert window_steps((7, 12, 20, 31, 40)) == {7, 20, 40}
    assert window_steps((9,)) == {9} and window_steps(()) == frozenset()


def test_timeline_steps_spread_over_the_trial_after_warm_up_and_skip_what_they_must():
    never = lambda step: False  # noqa: E731
    assert timeline_steps(3, 1, 100, 10, never) == (11, 55, 100)
    assert timeline_steps(1, 1, 20, 0, never) == (12,)
    assert timeline_steps(5, 1, 4, 0, never) == (3, 4)  # never before DDP's buckets settle (static_graph: step 3)
    assert timeline_steps(5, 7, 10, 2, never) == (9, 10)  # a resumed attempt: after its own first two steps
    assert timeline_steps(0, 1, 100, 5, never) == ()
    assert timeline_steps(3, 1, 10, 2, lambda s: s % 3 == 0 or s % 4 == 0) == SAMPLED
