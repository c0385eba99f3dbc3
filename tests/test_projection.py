"""Time to target at the scale you will run (service/answer/projection.py, service/report/decision_map.py).

Unit tests on hand-built step timelines (every expected figure worked out beside its assertion):
time to target from a crossing step, a refused cell, projection.csv's columns, the error band
and the decision map's "too close to call". Then the report from a real store: real trials
(run_training on an in-process gloo group of one rank, each recording its step timeline) under a
parent run whose config names report.project and report.cluster; the report is rebuilt from
MLflow alone."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.stores import store_uri
import torch
import torch.distributed as dist

from service import report
from service.report import decision_map
from service.report import cluster_answer, projection_table
from service.answer import projection
from service.config import ConfigError, load_config
from service.config.loading import report_section
from service.answer.projection import Basis
from service.step_model import bands as step_bands
from service.step_model.bands import ErrorBand, ErrorBands, MeasuredBand
from service.step_model.pairs import Configured, MeasuredPair, PairBands
from service.step_model.timeline import BucketTiming, LinearCost, StepTimeline
from service.step_model.transport import KindFit, TransportFit
from service.step_model.trial import ComputePoint, TrialTimeline, pooled_compute
from tests.dist_utils import init_single_rank_group

N = 250_000  # fp32 values: 1e6 bytes; allreduce at W on G Gbit/s: 2(W-1)/W * 1e6 * 8 / (G * 1e9) s


def trial_timeline(compute_ms=40.0, batch=32, hook="allreduce", points=True) -> TrialTimeline:
    """One bucket ready when the backward pass ends, no encode/decode; measured at W=1 (no
    transport), so a cell's step = forward + backward + wire + optimizer. Compute scales per
    sample with no fixed part (points at batch and batch/2 take exactly half the time)."""
    t = StepTimeline(hook=hook, world_size=1, batch=batch, forward_ms=compute_ms / 4,
                     buckets=(BucketTiming(ready_ms=compute_ms / 2, numel=N, encode_ms=0.0, comm_ms=0.0,
                                           decode=LinearCost(0.0)),),
                     backward_end_ms=compute_ms / 2, optimizer_ms=compute_ms / 4)
    pts = (ComputePoint(batch, compute_ms / 4, compute_ms / 2), ComputePoint(batch // 2, compute_ms / 8, compute_ms / 4))
    return TrialTimeline(t, (5,), pts if points else ())


def basis(config="allreduce", crossings=(100.0, 200.0), matches=True, hook=None, **kw) -> Basis:
    tl = trial_timeline(hook=hook or config, **kw)
    return Basis(config, hook or config, 1, 64, (tl,) * len(crossings), crossings, matches, 1)


NO_BANDS = ErrorBands((), "unmeasured")
NO_PAIRS = PairBands((), "unmeasured")  # every pair's ratio band: the two absolute bands composed
LATENCY_MS = 0.005  # 5 µs per message: the expected figures below are worked out at it


def bands_at(world_size: int, **by_hook: tuple[float, float]) -> ErrorBands:
    """Bands measured for each hook (no error-feedback setting) at one world size."""
    return ErrorBands(tuple(MeasuredBand(h, None, world_size, lo, hi) for h, (lo, hi) in by_hook.items()), "x")


def test_time_to_target_is_the_crossing_step_times_the_projected_step():
    # global batch 64 at W=8: 8 samples per rank, a quarter of the measured 32, so compute
    # 40 ms -> 10 ms (forward 2.5, backward 5, optimizer 10: the optimizer is not batch-scaled).
    # Wire at W=8, 10 Gbit/s, 5 µs latency: 2*7*(5e-6 + 1e6/8/1.25e9) = 1.47 ms, after the backward pass.
    p = projection.project_cell(basis(), 8, 10.0, LATENCY_MS, NO_BANDS)
    step = 2.5 + 5.0 + 10.0 + 1000 * 2 * 7 * (5e-6 + 1e6 / 8 / 1.25e9)
    assert p.step_ms == pytest.approx(step)
    assert p.time_to_target_s == pytest.approx(150.0 * step / 1000)  # mean crossing step of the two seeds
    assert projection_table.cell_text(p) == f"{150 * step / 1000:.3g} s ({step:.3g} ms/step)"


def test_a_seed_that_never_reached_the_target_leaves_no_time():
    p = projection.project_cell(basis(crossings=(100.0, None)), 8, 10.0, LATENCY_MS, NO_BANDS)
    assert p.step_ms > 0 and p.time_to_target_s is None
    assert projection_table.cell_text(p).startswith("target not reached (")


def test_a_cell_with_more_ranks_than_samples_is_refused_with_its_reason(tmp_path):
    p = projection.project_cell(basis(), 128, 10.0, LATENCY_MS, NO_BANDS)
    assert p.step_ms is None and "more ranks than the global batch has samples (64)" in p.refused
    # without two compute points the rank's batch cannot change
    q = projection.project_cell(basis(points=False), 8, 10.0, LATENCY_MS, NO_BANDS)
    assert "measured no compute at a second batch size" in q.refused
    rows = list(csv.DictReader(open(projection.write_csv([p], tmp_path / "p.csv"))))
    assert rows[0]["projected_step_ms"] == "" and "more ranks" in rows[0]["refused"]


def test_compute_that_fell_as_the_batch_grew_is_priced_as_fixed_not_refused():
    # a tiny model on a loaded machine: the half batch (16) timed slower than the full one (32);
    # the CI run of 2026-12-02 refused every W=8 cell of the real-store test below for this
    tl = trial_timeline()
    noisy = TrialTimeline(tl.timeline, (5,), (ComputePoint(32, 10.0, 20.0), ComputePoint(16, 11.0, 19.0)))
    scaling = noisy.compute
    assert [scaling.forward.at(n) for n in (8, 16, 32)] == [10.0] * 3            # flat at the measured batch's 10 ms
    assert scaling.backward.at(8) == pytest.approx(18.5)                        # this one grew: 1/16 ms a sample
    priced = noisy.price(64, 8, 10.0, LATENCY_MS / 1000)                      # 8 samples per rank: a new batch
    assert priced.step_ms > 0


def test_projection_csv_has_one_row_per_configuration_and_cell(tmp_path):
    bands = bands_at(8, allreduce=(-8.0, 5.0))
    cells = projection.project([basis(), basis("fp16_compress")], [8, 16], [10.0, 100.0], LATENCY_MS, bands)
    path = projection.write_csv(cells, tmp_path / projection.CSV)
    rows = list(csv.DictReader(open(path)))
    assert tuple(rows[0]) == projection.CSV_COLUMNS
    for column in ("config", "hook", "measured_world_size", "timeline_world_size", "world_size", "link_gbps", "projected_step_ms",
                   "projected_time_to_target_s", "error_low_pct", "error_high_pct"):
        assert column in rows[0]
    assert len(rows) == 2 * 2 * 2
    assert {(r["config"], r["world_size"], r["link_gbps"]) for r in rows} == {
        (c, w, g) for c in ("allreduce", "fp16_compress") for w in ("8", "16") for g in ("10.0", "100.0")}
    ar = next(r for r in rows if r["config"] == "allreduce")
    assert (ar["error_low_pct"], ar["error_high_pct"]) == ("-8", "5")
    fp16 = next(r for r in rows if r["config"] == "fp16_compress")  # unmeasured: the widest band measured
    assert (fp16["error_low_pct"], fp16["error_high_pct"]) == ("-8", "5")
    assert float(ar["projected_time_to_target_s"]) == pytest.approx(150 * float(ar["projected_step_ms"]) / 1000)


def test_error_bands_are_read_from_the_benchs_file(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({
        "format": 1, "source": "bench/projection.py", "measured": "2026-12-02T08:00:00", "workload": "char_lm",
        "basis": "loopback, W=2", "cells": "W=2,3,4", "load_average": [1.0, 1.2],
        "hooks": {"allreduce": {"low_pct": -3.0, "high_pct": 4.0, "median_abs_pct": 2.0, "counted": 9, "excluded": 0},
                  "powersgd": {"low_pct": -20.0, "high_pct": 1.0, "median_abs_pct": 9.0, "counted": 6, "excluded": 3},
                  "topk": {"low_pct": 0.0, "high_pct": 0.0, "median_abs_pct": 0.0, "counted": 0, "excluded": 9}},
        "overall": {"low_pct": -20.0, "high_pct": 4.0, "median_abs_pct": 3.0}}))
    bands = step_bands.error_bands(path)  # format 1: counted at W = 2, error feedback on where a hook has it
    assert bands.for_cell("allreduce", None, 2) == ErrorBand(-3.0, 4.0, "measured for allreduce", 2, False)
    assert bands.for_cell("powersgd", True, 2).source == "measured for powersgd with error feedback on"
    widest = bands.for_cell("topk", False, 2)  # nothing counted: not a measured band
    assert (widest.low_pct, widest.high_pct) == (-20.0, 4.0)
    assert "topk with error feedback off was not measured" in widest.source
    assert "bench/projection.py, 2026-12-02" in bands.provenance
    missing = step_bands.error_bands(tmp_path / "none.json")
    assert missing.for_cell("allreduce", None, 2) is None and "unmeasured" in missing.provenance




def test_the_reports_bands_are_the_cluster_paths_with_error_feedback_off_measured_on_its_own():
    """The report prices every cell by its cluster path (a core per rank), so it reads the bands
    held out through that path (bench/projection.py --host-cpus), where each hook ran with error
    feedback on and off: the presets' setting (off) has its own measured absolute band and its
    own measured ratio band against allreduce, not the widest or two composed."""
    from service.step_model.pairs import PAIR_FILE, pair_bands

    assert step_bands.ERROR_FILE.name == "projection_error_cluster.json"
    bands = step_bands.error_bands()
    off, on = bands.for_cell("bf16_compress", False, 8), bands.for_cell("bf16_compress", True, 8)
    assert off.source == "measured for bf16_compress with error feedback off" and off.checked_w == 8
    assert on.source == "measured for bf16_compress with error feedback on" and (off.low_pct, off.high_pct) != (
        on.low_pct, on.high_pct)
    assert "emulated hosts" in bands.provenance
    ratio = pair_bands(PAIR_FILE).for_pair(Configured("bf16_compress", False), Configured("allreduce", None), 8)
    assert ratio.measured and ratio.source == "measured for bf16_compress with error feedback off against allreduce"
    mixed = pair_bands(PAIR_FILE).for_pair(Configured("bf16_compress", False), Configured("topk", True), 8,
                                           absolute=(off, on))
    assert not mixed.measured  # the bench pairs hooks within one setting: across settings, composed
def test_the_winner_is_the_fastest_matching_configuration_and_close_calls_are_hatched():
    bands = bands_at(8, allreduce=(-10.0, 10.0), fp16_compress=(-10.0, 10.0), topk=(-10.0, 10.0))
    slow = basis("allreduce", crossings=(100.0,))
    fast_but_worse = basis("topk", crossings=(10.0,), matches=False)
    close = basis("fp16_compress", crossings=(95.0,))   # 5 % fewer steps at the same step time
    cell = projection.winner(projection.project([slow, fast_but_worse, close], [8], [10.0], LATENCY_MS, bands), NO_PAIRS)
    # no pair band measured: the two absolute bands composed, -18.2 ... +22.2 % (90/110, 110/90);
    # fp16_compress's time is 0.915 allreduce's (5 % fewer steps, half the wire), not below 0.818:
    # too close to call, so the answer is allreduce, the faster fp16_compress its runner-up
    assert (cell.winner.config, cell.runner_up.config, cell.too_close) == ("allreduce", "fp16_compress", True)
    assert cell.margin == pytest.approx(0.915 - 1, abs=0.002) and cell.error > -cell.margin
    far = basis("fp16_compress", crossings=(50.0,))     # 0.5 p / 0.9 = 0.556 p < 0.909 p
    assert not projection.winner(projection.project([slow, far], [8], [10.0], LATENCY_MS, bands), NO_PAIRS).too_close
    # no band measured, seeds that agree: the margin is taken as it is
    assert not projection.winner(projection.project([slow, close], [8], [10.0], LATENCY_MS, NO_BANDS), NO_PAIRS).too_close


def test_a_pair_whose_measured_ratio_band_clears_is_decided_and_one_holding_a_tie_is_hatched(tmp_path):
    """The same two configurations, the same absolute bands (+-10 %: independent, they tie
    within ~18 %); fp16_compress 5 % fewer steps of 18.27 ms against allreduce's 18.97 (half the
    wire): 0.915 of allreduce's time. Its ratio band against allreduce measured at -5 ... +5 %
    clears it (0.915 < 0.95): decided; measured at -10 ... +3 % it holds the tie (0.915 >= 0.90):
    hatched, naming both. projection.csv says so on every row of the cell."""
    bands = bands_at(8, allreduce=(-10.0, 10.0), fp16_compress=(-10.0, 10.0))
    ar, fp16 = basis("allreduce", crossings=(100.0,)), basis("fp16_compress", crossings=(95.0,))
    cells = projection.project([ar, fp16], [8], [10.0], LATENCY_MS, bands)

    def measured(low: float, high: float) -> PairBands:
        pair = MeasuredPair(Configured("fp16_compress", None), Configured("allreduce", None), 8, low, high, 2)
        return PairBands((pair,), "x")

    assert projection.winner(cells, NO_PAIRS).too_close           # the two absolute bands: a tie
    assert cells[1].time_to_target_s / cells[0].time_to_target_s == pytest.approx(0.915, abs=0.001)
    clears = projection.winner(cells, measured(-5.0, 5.0))
    assert clears.winner.config == "fp16_compress" and not clears.too_close
    assert clears.band.measured and (clears.band.low_pct, clears.band.high_pct) == (-5.0, 5.0)
    holds = projection.winner(cells, measured(-10.0, 3.0))
    assert (holds.winner.config, holds.runner_up.config, holds.too_close) == ("allreduce", "fp16_compress", True)
    # measured the other way round (allreduce over fp16_compress), the band is inverted: the same call
    flipped = PairBands((MeasuredPair(Configured("allreduce", None), Configured("fp16_compress", None), 8,
                                      100 * (100 / 105 - 1), 100 * (100 / 95 - 1), 2),), "x")
    assert not projection.winner(cells, flipped).too_close
    rows = list(csv.DictReader(projection.write_csv(cells, tmp_path / "p.csv", measured(-10.0, 3.0)).open()))
    assert len(rows) == 2 and {(r["cell_winner"], r["cell_runner_up"], r["cell_decided"]) for r in rows} == {
        ("allreduce", "fp16_compress", "false")}


def test_quality_from_the_largest_world_size_and_the_step_from_the_smallest_above_one():
    from types import SimpleNamespace

    from service.answer.recommend import TimeToTarget

    def trial(w, seed, step):
        record = SimpleNamespace(params={"global_batch_size": "64"}, parallelism="ddp")
        return SimpleNamespace(state="ok", config="allreduce", hook="allreduce", world_size=w, seed=seed,
                               run_id=f"w{w}s{seed}", record=record, time_to_target=TimeToTarget(1.0, step, False),
                               hook_params={})

    trials = [trial(w, s, 10.0 * w + s) for w in (1, 2, 4) for s in (0, 1)]
    recorded = {t.run_id: trial_timeline() for t in trials}
    (b,) = projection.bases(trials, [], recorded.get)
    assert (b.measured_world_size, b.timeline_world_size) == (4, 2)
    assert b.crossing_steps == (40.0, 41.0)
    assert b.timelines == (recorded["w2s0"], recorded["w2s1"])
    assert not b.matches_quality  # no recommendation judged it
    del recorded["w2s1"]  # a W=2 trial without a timeline: the next world size up
    assert projection.bases(trials, [], recorded.get)[0].timeline_world_size == 4
    only_one = {k: v for k, v in recorded.items() if k.startswith("w1")}
    assert projection.bases(trials, [], only_one.get)[0].timeline_world_size == 1
    assert projection.bases(trials, [], {}.get) == []


def test_the_crossing_steps_are_those_of_the_seeds_every_configuration_ran():
    """Adaptive seeds give the baseline (and the undecided) a third seed: the projection compares
    crossing steps on the seeds all ran, as the measured answer compares times."""
    from types import SimpleNamespace

    from service.answer.recommend import TimeToTarget

    def trial(config, seed, step):
        record = SimpleNamespace(params={"global_batch_size": "64"}, parallelism="ddp")
        return SimpleNamespace(state="ok", config=config, hook=config, world_size=2, seed=seed,
                               run_id=f"{config}{seed}", record=record, time_to_target=TimeToTarget(1.0, step, False),
                               hook_params={})

    trials = [trial("allreduce", s, step) for s, step in ((0, 10.0), (1, 12.0), (2, 50.0))]
    trials += [trial("bf16_compress", s, step) for s, step in ((0, 10.0), (1, 12.0))]
    recorded = {t.run_id: trial_timeline() for t in trials}
    by_config = {b.config: b for b in projection.bases(trials, [], recorded.get)}
    assert by_config["allreduce"].crossing_steps == (10.0, 12.0)   # seed 2 shown in the tables, not compared
    assert by_config["allreduce"].crossing_step == by_config["bf16_compress"].crossing_step == 11.0


def test_seeds_whose_timelines_disagree_make_a_close_call():
    # W=8 (8 of the measured 32 samples), 10 Gbit/s: a seed of compute 40 ms prices at forward 2.5
    # + backward 5 + optimizer 10 (not batch-scaled) + wire 1.47 = 18.97 ms; one of 80 ms at 36.47.
    # allreduce has one of each (median 27.72 ms) and crosses at step 100: 2.77 s; fp16 one fast
    # seed, 105 steps: 1.99 s, the winner; but allreduce's fast seed alone is 1.90 s: too close.
    fast, slow = trial_timeline(compute_ms=40.0), trial_timeline(compute_ms=80.0)
    wide = Basis("allreduce", "allreduce", 1, 64, (fast, slow), (100.0, 100.0), True, 1)
    one = Basis("fp16_compress", "fp16_compress", 1, 64, (fast,), (105.0,), True, 1)
    cell = projection.winner(projection.project([wide, one], [8], [10.0], LATENCY_MS, NO_BANDS), NO_PAIRS)
    assert cell.winner.step_ms == pytest.approx((18.97 + 36.47) / 2, abs=0.01)
    assert (cell.winner.config, cell.runner_up.config, cell.too_close) == ("allreduce", "fp16_compress", True)
    narrow = Basis("allreduce", "allreduce", 1, 64, (slow, slow), (100.0, 100.0), True, 1)
    assert not projection.winner(projection.project([narrow, one], [8], [10.0], LATENCY_MS, NO_BANDS), NO_PAIRS).too_close


def test_default_cells_and_the_maps_grid_keep_a_sample_per_rank():
    assert projection.default_world_sizes(64) == [8, 16, 32, 64]
    assert projection.default_world_sizes(4) == [8]  # refused cell by cell, with the reason
    assert projection.map_world_sizes(64) == [2, 4, 8, 16, 32, 64]
    cfg = report_section("report:\n  project: {link_gbps: 40}\n")
    assert projection.cells(cfg.project, 32) == ([8, 16, 32], [40.0])


def test_report_project_and_cluster_are_checked_in_the_config(tmp_path):
    cfg = report_section("report:\n  cluster: {world_size: 64, link_gbps: 10}\n  project:\n    world_size: [8, 512]\n")
    assert (cfg.cluster.world_size, cfg.cluster.link_gbps) == (64, 10.0)
    assert cfg.project.world_size == [8, 512] and cfg.project.link_gbps is None
    for bad, says in (("cluster: {world_size: 0, link_gbps: 10}", "world_size"),
                      ("cluster: {world_size: 8}", "link_gbps"),
                      ("project: {link_gbps: [10, 10]}", "twice"),
                      ("project: {link_gbps: [1000]}", "at most 400"),
                      ("project: {world_sizes: [8]}", "world_sizes")):
        with pytest.raises(ConfigError, match=says) as e:
            report_section(f"report:\n  {bad}\n")
        assert "\n" not in str(e.value)
    assert cfg.cluster.latency_ms == cfg.project.latency_ms == 0.025  # the stated default (docs/hooks.md)
    with pytest.raises(ConfigError, match="latency_ms"):
        report_section("report:\n  cluster: {world_size: 8, link_gbps: 10, latency_ms: -1}\n")
    preset, _ = load_config("quant")
    assert preset.report.cluster is not None  # make sweep's report answers for a cluster too


# --------------------------------------------------------------------------------------------
# From a real store

CONFIG = """
name: projection-test
workload: {name: "tests.tiny_workload:tiny_digits", steps: 16, global_batch_size: 32, lr: 0.05,
           eval_every: 4, warmup_steps: 2}
search:
  hooks: [allreduce, fp16_compress, {name: quantized_allreduce, chunk_size: 256}]
  world_size: [1]
  seed: [0]
tracking: {flush_seconds: 0.5, timeline_steps: 3}
report:
  target_tolerance: 0.05
  project: {world_size: [8, 64], link_gbps: [10, 100], latency_ms: 0.05}
  cluster: {world_size: 16, link_gbps: 25, latency_ms: 0.1}
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from service import tracking
    from service.train import TrainingContext, run_training

    tmp = tmp_path_factory.mktemp("mlflow")
    uri, path = store_uri(tmp), tmp / "projection.yaml"
    path.write_text(CONFIG)
    cfg, _ = load_config(str(path))
    torch.set_num_threads(1)
    init_single_rank_group()
    try:
        parent = tracking.start_parent_run(cfg, str(path), tracking_uri=uri)
        for trial in cfg.trials():
            run_id = tracking.start_child_run(parent, trial, cfg, uri)
            with tracking.MetricLogger(run_id, uri, 0.5) as logger:
                run_training(trial, cfg, TrainingContext(rank=0, world_size=1, device="cpu", logger=logger))
            tracking.end_run(run_id, "FINISHED", tracking_uri=uri)
        # the transport the sweep measures before its trials (service/sweep/transport.py): a
        # made-up machine, so that the test can tell its figures from the trials' own comm
        tracking.log_transport(parent, uri, TRANSPORT.to_json())
        tracking.end_run(parent, "FINISHED", tracking_uri=uri)
    finally:
        dist.destroy_process_group()
    return {"uri": uri, "parent": parent}


TRANSPORT = TransportFit({k: (KindFit(2, 0.5, 2e-5, 0.0),) for k in ("allreduce", "allgather", "all_to_all")},
                         (), {2: 1.0})


@pytest.fixture(scope="module")
def built(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    page = report.build_report(store["parent"], store["uri"], out).read_text()
    return out, page


def test_the_report_projects_every_configuration_from_its_recorded_timeline(store, built):
    from service.answer.data import load_sweep, open_store, recommendations

    out, _ = built
    rows = list(csv.DictReader(open(out / projection.CSV)))
    assert {r["config"] for r in rows} == {"allreduce", "fp16_compress", "quantized_allreduce-c256"}
    # report.project's cells, and report.cluster's (W = 16 on 25 Gbit/s): its rows carry the headline's answer
    assert {(int(r["world_size"]), float(r["link_gbps"])) for r in rows} == {(8, 10.0), (8, 100.0), (64, 10.0),
                                                                            (64, 100.0), (16, 25.0)}
    for r in rows:
        assert r["measured_world_size"] == r["timeline_world_size"] == "1"
        if r["world_size"] == "64":  # 32 samples over 64 ranks
            assert "more ranks than the global batch" in r["refused"] and r["projected_step_ms"] == ""
        else:
            assert float(r["projected_step_ms"]) > 0 and not r["refused"]
    # the figures are the model's: recomputed here from the run's own step_timeline.json
    reader = open_store(store["uri"])
    sweep = load_sweep(reader, store["parent"])
    trial = next(t for t in sweep.trials if t.config == "allreduce")
    transport = reader.transport(store["parent"])
    assert transport == TRANSPORT  # transport.json read back from the parent run
    # report.project's 50 µs, the collectives' transport from transport.json, the compute points
    # pooled over the three configurations' trials (trial.pooled_compute)
    pooled = pooled_compute(reader.step_timeline(t.run_id) for t in sweep.trials)
    own = pooled[[t.run_id for t in sweep.trials].index(trial.run_id)]
    priced = own.price(32, 8, 10.0, 0.05e-3, transport).step_ms
    assert priced != pytest.approx(own.price(32, 8, 10.0, 0.05e-3).step_ms)
    row = next(r for r in rows if r["config"] == "allreduce" and r["world_size"] == "8" and r["link_gbps"] == "10.0")
    assert float(row["projected_step_ms"]) == pytest.approx(priced, rel=1e-5)
    if trial.time_to_target.step is not None:
        assert float(row["projected_time_to_target_s"]) == pytest.approx(trial.time_to_target.step * priced / 1000, rel=1e-5)
    bases = projection.bases(sweep.trials, recommendations(sweep), reader.step_timeline)
    assert {b.config for b in bases} == {r["config"] for r in rows}


def test_the_report_shows_the_decision_map_and_answers_for_the_cluster(store, built):
    from service.report import plots
    from service.tracking import SweepReader

    out, page = built
    image = plots.plt.imread(out / decision_map.IMAGE)
    assert image.shape[0] > 300 and image.shape[1] > 600
    assert "id='decision_map'" in page and "Projected time to target at scale" in page
    assert "Projected for W=16 on 25 Gbit/s at 100 µs per message (report.cluster)" in page
    summary = (out / "summary.md").read_text()
    here, cluster = summary.splitlines()[2:4]
    assert here.startswith("- **Here: ") and cluster.startswith("- **Your cluster (W = 16 on 25 Gbit/s, report.cluster): ")
    assert "Projected for W=16 on 25 Gbit/s" in summary.split("### How this was priced")[1]
    # one latency for every projected figure: report.cluster's where the sweep names a cluster
    assert "latency 100 µs per message, report.cluster.latency_ms" in summary
    assert "### Transport measured for this sweep (transport.json)" in summary
    assert "| allreduce | 2 | 500.0 µs | 20.000 ms |" in summary
    # the per-bucket plan for report.cluster: this tiny model has one bucket, so none beats uniform
    assert "### A per-bucket plan for W=16 on 25 Gbit/s (report.cluster)" in summary
    assert "No per-bucket plan beats a uniform configuration here: the model has one bucket" in summary
    # and it names the headline's answer (answer.json's), saying in one sentence why its own figures differ
    named = json.loads((out / "answer.json").read_text())["cluster"]["answer"]
    assert f": {'keep' if named == 'allreduce' else 'use'} {named}" in cluster
    plan_section = summary.split("### A per-bucket plan for W=16 on 25 Gbit/s (report.cluster)")[1]
    assert plan_section.strip().startswith(f"The answer at this cell: **{named}**"), summary
    assert "Transport measured for this sweep (transport.json)</h3>" in page and "500.0 µs" in page
    assert "quality from W=1" in summary
    # projection.csv: every row of a cell says that cell's one answer, the map's and the headline's rule
    rows = list(csv.DictReader((out / projection.CSV).open()))
    for at in {(r["world_size"], r["link_gbps"]) for r in rows}:
        answers = {(r["cell_winner"], r["cell_runner_up"], r["cell_decided"]) for r in rows
                   if (r["world_size"], r["link_gbps"]) == at}
        assert len(answers) == 1 and next(iter(answers))[2] in ("true", "false"), (at, answers)
    attached = {a.path for a in SweepReader(store["uri"]).client.list_artifacts(store["parent"])}
    assert {decision_map.IMAGE, projection.CSV} <= attached
    assert "projected_throughput.png" not in attached  # the old alpha-beta plot is gone


def test_report_cluster_transport_prices_the_cluster_answer_and_the_map_with_that_clusters_hosts(store, built, tmp_path):
    """report.cluster.transport: a transport.json of the cluster's hosts (python -m service.probe)
    prices the cluster cell and the map in place of the sweep's own probe, and the headline says
    which hosts priced it; without one it says this machine's probe stood in."""
    from service.answer.data import load_sweep, open_store, recommendations
    from service.report.projected import projected
    from service.step_model.transport import ProbeHosts

    _, page = built
    summary = (built[0] / "summary.md").read_text()
    assert "priced as hosts like this one" in summary.splitlines()[3]
    assert "transport: this sweep's own probe" in summary.split("### How this was priced")[1]
    # a cluster of fast hosts: a twentieth of the sweep's fixed cost, a hundredth of its per-byte cost
    fast = TransportFit({k: (KindFit(16, 0.025, 2e-7, 0.0),) for k in ("allreduce", "allgather", "all_to_all")},
                        (), {16: 2.0}, (ProbeHosts(16, 16, 1, 1.0, "Cluster CPU", False),))
    path = tmp_path / "transport.json"
    path.write_text(json.dumps(fast.to_json()))
    # a sweep about to run refuses a missing file; its recorded config, read back for a report, does
    # not ask for it (the sweep copied it onto its parent run)
    missing = CONFIG.replace("cluster: {world_size: 16, link_gbps: 25, latency_ms: 0.1}",
                             f"cluster: {{world_size: 16, link_gbps: 25, transport: {tmp_path / 'none.json'}}}")
    (tmp_path / "missing.yaml").write_text(missing)
    with pytest.raises(ConfigError, match="not a transport.json"):
        load_config(str(tmp_path / "missing.yaml"))
    assert report_section(missing).cluster.transport == str(tmp_path / "none.json")
    reader = open_store(store["uri"])
    sweep = load_sweep(reader, store["parent"])
    recs = recommendations(sweep)
    own = report_section("report:\n  cluster: {world_size: 16, link_gbps: 25, latency_ms: 0.1}\n")
    given = report_section(f"report:\n  cluster: {{world_size: 16, link_gbps: 25, latency_ms: 0.1, transport: {path}}}\n")
    (tmp_path / "own").mkdir(), (tmp_path / "given").mkdir()
    mine = projected(sweep, recs, reader, own, tmp_path / "own")
    theirs = projected(sweep, recs, reader, given, tmp_path / "given")
    assert theirs.pricing.transport_source() == (f"transport: your cluster's probe ({path}), probed W = 16 across 16 "
                                                 "hosts, 1 rank(s) per host of 1 core(s) (Cluster CPU)")
    assert theirs.answer.cluster.transport_from_cluster and not mine.answer.cluster.transport_from_cluster
    # the cluster cell priced with the cluster's transport: faster than with the sweep's (0.5 ms, 2e-5 ms/B)
    assert theirs.cluster != mine.cluster
    assert theirs.plan is not None and mine.plan is not None
    # the projection table (report.project's cells) is priced the same way as the cluster cell: the
    # cluster's probe, at report.cluster's latency
    assert all(a.step_ms < b.step_ms for a, b in zip(theirs.cells, mine.cells) if a.step_ms is not None)


def test_a_failed_transport_probe_is_recorded_on_the_parent_run_and_the_report_says_why(tmp_path):
    """service/sweep/transport.py records a failed probe's one-line reason on the parent run (a tag,
    through service/tracking/); the report says that reason rather than blaming an old sweep or a
    single world size, and a later measurement (a resumed sweep's) drops it."""
    from service import tracking
    from service.answer.data import load_sweep, open_store
    from service.report.projected import projected
    from service.report.render import render_html

    uri, path = store_uri(tmp_path), tmp_path / "projection.yaml"
    path.write_text(CONFIG)
    cfg, _ = load_config(str(path))
    parent = tracking.start_parent_run(cfg, str(path), tracking_uri=uri)
    reason = "its probe failed (RuntimeError: the W=2 probe reported no samples)"
    tracking.log_transport_failure(parent, uri, reason)
    reader = open_store(uri)
    sweep = load_sweep(reader, parent)
    scale = projected(sweep, [], reader, cfg.report, tmp_path)
    assert scale.transport is None and scale.transport_failure == reason
    scale.cells = projection.project([basis()], [8], [10.0], LATENCY_MS, NO_BANDS)  # something projected
    for text in (scale.markdown(), render_html(sweep, [], [], {}, "final_loss", scale)):
        assert f"not measured for this sweep: {reason};" in text
        assert "a sweep from before it was measured" not in text
    tracking.log_transport(parent, uri, TRANSPORT.to_json())
    assert reader.transport_failure(parent) is None and reader.transport(parent) == TRANSPORT


def test_a_sweep_without_step_timelines_says_there_is_nothing_to_project():
    from service.report.projected import EMPTY, Projected

    md = Projected([]).markdown()
    assert EMPTY in md and "## Projected time to target at scale" in md


def _probe(allreduce_fixed_ms: float, allreduce_p25_ms: float) -> TransportFit:
    """A W = 2 probe: allreduce's fixed cost per collective read at its median and its lower
    quartile; allgather's 0.3 ms both ways; 1 ms per MB sent."""
    from hooks.wire import KINDS, wire_bytes
    from service.step_model.transport import Sample, fit

    def ms(kind, nbytes, fixed):
        return fixed + 1e-6 * wire_bytes(kind, nbytes, 2)

    return fit([Sample(k, 2, b, ms(k, b, allreduce_fixed_ms if k == "allreduce" else 0.3), 11,
                       p25_ms=ms(k, b, allreduce_p25_ms if k == "allreduce" else 0.3))
                for k in KINDS for b in (4096, 65536, 1 << 20, 8 << 20)], {2: 1.0})


def test_a_cell_is_decided_only_where_both_readings_of_the_transport_probe_agree():
    """The probe's repeats on 2 shared cores are bimodal (docs/performance.md 8c): its median reads
    allreduce's fixed cost at either mode by chance. A cell whose winner changes between the
    median's reading and the lower quartile's is too close to call, whatever the bands say; one
    both readings agree on is decided."""
    ar, gather = basis("allreduce", crossings=(100.0,)), basis("allgather_then_aggregate", crossings=(100.0,))
    exact = bands_at(8, allreduce=(0.0, 0.0), allgather_then_aggregate=(0.0, 0.0))

    def cell(transport):
        return projection.winner(projection.project([ar, gather], [8], [1000.0], LATENCY_MS, exact, transport), NO_PAIRS)

    bimodal, steady = _probe(3.0, 0.05), _probe(3.0, 3.0)
    assert bimodal.ms("allreduce", 0, 2) == pytest.approx(3.0) and bimodal.quartile().ms("allreduce", 0, 2) == pytest.approx(0.05)
    decided, close = cell(steady), cell(bimodal)
    assert decided.winner.config == close.runner_up.config == "allgather_then_aggregate"  # the medians' pick
    assert not decided.too_close
    assert close.too_close and close.winner.config == "allreduce"  # too close: the baseline is kept
    # the quartile's reading alone picks the other one: that is the spread the call must survive
    low = projection.winner(projection.project([ar, gather], [8], [1000.0], LATENCY_MS, exact,
                                               bimodal.quartile()), NO_PAIRS)
    assert low.winner.config == "allreduce"
    text = cluster_answer.cluster_text(SimpleNamespace(world_size=8, link_gbps=1000.0, latency_ms=LATENCY_MS), close)
    assert "too close to call" in text and "the seeds' and the transport probe's spread" in text
    # a probe from before the quartile was recorded: the seeds' spread alone, as before
    old = replace(bimodal, samples=tuple(replace(s, p25_ms=None) for s in bimodal.samples))
    assert old.quartile() is None and not cell(old).too_close


def test_the_map_the_star_the_csv_and_answer_json_are_priced_one_way(store, built):
    """report.project's latency (50 µs) and report.cluster's (100 µs) differ: the map, the star,
    the projection table and the cluster answer are all priced at the cluster's, with one
    transport, so the map's cell under the star is the cluster answer itself."""
    from service.answer.data import load_sweep, open_store, recommendations
    from service.report.projected import projected

    out, _ = built
    reader = open_store(store["uri"])
    sweep = load_sweep(reader, store["parent"])
    cfg = report_section(sweep.config_text)
    scale = projected(sweep, recommendations(sweep), reader, cfg, out)
    assert scale.pricing.latency_ms == cfg.cluster.latency_ms == 0.1 != cfg.project.latency_ms
    under_star = scale.map_cells[(cfg.cluster.world_size, cfg.cluster.link_gbps)]
    star, _ = projection.cell_answer(scale.bases, cfg.cluster, transport=scale.pricing.transport)
    assert under_star.winner.step_ms == pytest.approx(star.winner.step_ms)
    assert (under_star.winner.config, under_star.decided) == (star.winner.config, star.decided)
    written = json.loads((out / "answer.json").read_text())["cluster"]
    assert (written["answer"], written["decided"]) == (star.winner.config, star.decided)
    csv_8 = next(c for c in scale.cells if (c.config, c.world_size, c.link_gbps) == ("allreduce", 8, 10.0))
    map_8 = projection.project_cell(next(b for b in scale.bases if b.config == "allreduce"), 8, 10.0,
                                    cfg.cluster.latency_ms, transport=scale.pricing.transport)
    assert csv_8.step_ms == pytest.approx(map_8.step_ms)


def test_the_plan_round_designs_with_the_transport_the_plan_section_shows(store, tmp_path):
    """search.plan with report.cluster.transport: the plan round (service/sweep/plan_round.py) and
    the report's plan section price the plan with the same transport, the cluster's probe, so the
    report never calls a plan it trained 'not yet trained'."""
    from service.answer.data import load_sweep, open_store, recommendations
    from service.report.projected import projected
    from service.sweep import plan_round

    fast = TransportFit({k: (KindFit(16, 0.025, 2e-7, 0.0),) for k in ("allreduce", "allgather", "all_to_all")},
                        (), {16: 2.0})
    path = tmp_path / "transport.json"
    path.write_text(json.dumps(fast.to_json()))
    text = CONFIG.replace("cluster: {world_size: 16, link_gbps: 25, latency_ms: 0.1}",
                          f"cluster: {{world_size: 16, link_gbps: 25, latency_ms: 0.1, transport: {path}}}")
    text = text.replace("  seed: [0]\n", "  seed: [0]\n  plan: {cell: cluster}\n")
    (tmp_path / "plan.yaml").write_text(text)
    cfg, _ = load_config(str(tmp_path / "plan.yaml"))
    designed = plan_round.design(cfg, store["parent"], store["uri"])
    reader = open_store(store["uri"])
    sweep = load_sweep(reader, store["parent"])
    shown = projected(sweep, recommendations(sweep), reader, cfg.report, tmp_path).plan
    assert designed.plan is not None and shown.plan is not None
    assert designed.plan.step_ms == pytest.approx(shown.plan.step_ms)
    with_sweeps = plan_round.answer(projection.bases(sweep.trials, recommendations(sweep), reader.step_timeline),
                                    cfg.report.cluster, reader.transport(store["parent"]))
    assert with_sweeps.plan.step_ms != pytest.approx(designed.plan.step_ms)  # the sweep's own probe prices otherwise


ANSWER_PROBE = """<script>
window.addEventListener('load', () => {
  const text = s => Array.from(document.querySelectorAll(s)).map(e => e.textContent.trim());
  const plan = Array.from(document.querySelectorAll('h3')).find(h => h.textContent.startsWith('A per-bucket plan'));
  let after = plan ? plan.nextElementSibling : null;
  while (after && after.tagName !== 'P') after = after.nextElementSibling;
  const probe = document.createElement('pre');
  probe.id = 'answer-probe';
  probe.textContent = JSON.stringify({headline: text('p.headline'), plan: after ? after.textContent : '',
                                      page: document.documentElement.scrollWidth});
  document.body.appendChild(probe);
});
</script></body>"""


def test_every_part_of_the_report_names_the_one_answer_in_headless_chromium(store, built, tmp_path):
    """At 1400 px: the headline's sentences, the plan section and projection.csv's cluster rows
    say what answer.json says, for the world size the sweep ran and for report.cluster."""
    from tests.test_report import run_chromium

    out, page = built
    answer = json.loads((out / "answer.json").read_text())
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", ANSWER_PROBE))
    dom = run_chromium(["--window-size=1400,3000", "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
                       tmp_path)
    assert "answer-probe" in dom.stdout, dom.stderr[-2000:]
    seen = json.loads(dom.stdout.split('<pre id="answer-probe">', 1)[1].split("</pre>", 1)[0].replace("&quot;", '"'))
    assert seen["page"] <= 1400, seen
    here, cluster = seen["headline"][:2]
    measured = answer["measured"]["1"]
    assert here == f"Here: {'keep' if measured['answer'] == 'allreduce' else 'use'} {measured['answer']} at W = 1 on loopback."
    named = answer["cluster"]["answer"]
    assert cluster.startswith(f"Your cluster (W = 16 on 25 Gbit/s, report.cluster): "
                              f"{'keep' if named == 'allreduce' else 'use'} {named}")
    assert seen["plan"].startswith(f"The answer at this cell: {named} "), seen["plan"]
    rows = [r for r in csv.DictReader((out / projection.CSV).open()) if (r["world_size"], r["link_gbps"]) == ("16", "25.0")]
    assert rows and {(r["cell_winner"], r["cell_decided"]) for r in rows} == {
        (named, str(answer["cluster"]["decided"]).lower())}


def test_a_failed_probe_is_named_even_where_nothing_was_projected():
    from service.report.projected import EMPTY, Projected

    md = Projected([], transport_failure="its probe failed (ControllerError: x)").markdown()
    assert EMPTY in md and "not measured for this sweep: its probe failed (ControllerError: x);" in md
