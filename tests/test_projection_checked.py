"""The report prices what it was checked on (service/step_model/bands.py, service/answer/projection.py):
the band beside a cell is its hook's with its error-feedback setting at the nearest checked W, a
cell above every checked W says so, the latency is the config's, and a world size the sweep ran
keeps its own quality verdict. Hand-built timelines as in test_projection.py."""

from __future__ import annotations

import json

import pytest

from service.report import cluster_answer, projection_table
from service.answer import projection
from service.answer.projection import Basis, QualityAt
from service.step_model import bands as step_bands
from service.step_model.bands import ErrorBands, MeasuredBand, error_feedback_of
from service.step_model.pairs import PairBands
from tests.test_projection import trial_timeline


def band_file(tmp_path):
    rows = [("topk", True, 2, -4.0, 3.0), ("topk", False, 2, -9.0, 8.0), ("topk", False, 4, -12.0, 6.0),
            ("allreduce", None, 2, -2.0, 2.0), ("allreduce", None, 4, -5.0, 1.0), ("allreduce", None, 8, -7.0, 4.0)]
    path = tmp_path / "projection_error.json"
    path.write_text(json.dumps({
        "format": 2, "source": "bench/projection.py", "measured": "2026-12-02T09:00:00Z", "workload": "char_lm",
        "basis": "loopback, W=2", "cells": "W=2,4,8", "load_average": [1.0, 1.0], "overall": {},
        "bands": [{"hook": h, "error_feedback": ef, "world_size": w, "low_pct": lo, "high_pct": hi,
                   "median_abs_pct": 1.0, "counted": 2, "excluded": 0} for h, ef, w, lo, hi in rows]}))
    return step_bands.error_bands(path)


def test_the_band_is_the_hooks_with_its_error_feedback_at_the_nearest_checked_world_size(tmp_path):
    bands = band_file(tmp_path)
    on, off = bands.for_cell("topk", True, 2), bands.for_cell("topk", False, 2)
    assert (on.low_pct, on.high_pct, off.low_pct, off.high_pct) == (-4.0, 3.0, -9.0, 8.0)
    assert off.source == "measured for topk with error feedback off"
    near = bands.for_cell("allreduce", None, 5)            # log2 5 is nearer 4 than 8
    assert (near.checked_w, near.beyond, near.low_pct) == (4, False, -5.0)
    assert near.where() == "checked at W = 4"
    far = bands.for_cell("allreduce", None, 64)
    assert (far.checked_w, far.beyond) == (8, True) and far.where() == "checked at W = 8, used beyond it"
    topk_far = bands.for_cell("topk", False, 16)          # topk off was checked up to W = 4 only
    assert topk_far.where() == "checked at W = 4, used beyond it" and topk_far.low_pct == -12.0


def test_a_hooks_error_feedback_setting_is_its_runs_or_its_default():
    assert error_feedback_of("allreduce", {}) is None
    assert error_feedback_of("topk", {}) is False and error_feedback_of("topk", {"error_feedback": True}) is True
    assert error_feedback_of("powersgd", {}) is True


def test_the_table_and_the_cluster_answer_say_beyond_the_checked_world_size(tmp_path):
    from types import SimpleNamespace

    bands = band_file(tmp_path)
    b = Basis("allreduce", "allreduce", 1, 64, (trial_timeline(),), (100.0,), True, 1)
    cells = projection.project([b], [4, 64], [10.0], 0.025, bands)
    _, (row,) = projection_table.table(cells)
    assert row[3] == "-5 to +1 % (checked at W = 4); -7 to +4 % (checked at W = 8, used beyond it at W = 64)"
    cell = SimpleNamespace(world_size=64, link_gbps=10.0, latency_ms=0.025)
    answer = cluster_answer.cluster_text(cell, *projection.cell_answer([b], cell, bands))
    assert "error band -7 to +4 % (checked at W = 8, used beyond it)" in answer and "at 25 µs per message" in answer


def test_a_configuration_shows_each_band_once_and_a_one_value_band_as_one_value(tmp_path):
    # allreduce was checked at W = 8 with two cells 0.1 % apart: the table's cells at W = 8, 16
    # and 32 all take that one band. It reads as one value ('-18 %', not '-17.9 to -17.8 %' nor
    # '-18 to -18 %'), once, with where it was checked and the cells that use it beyond.
    rows = [("allreduce", None, 2, -5.0, -2.9), ("allreduce", None, 8, -17.9, -17.8)]
    path = tmp_path / "projection_error.json"
    path.write_text(json.dumps({
        "format": 2, "source": "bench/projection.py", "measured": "2026-12-02T09:00:00Z", "workload": "char_lm",
        "basis": "loopback, W=2", "cells": "W=2,8", "load_average": [1.0], "overall": {},
        "bands": [{"hook": h, "error_feedback": ef, "world_size": w, "low_pct": lo, "high_pct": hi,
                   "median_abs_pct": 1.0, "counted": 2, "excluded": 0} for h, ef, w, lo, hi in rows]}))
    bands = step_bands.error_bands(path)
    b = Basis("allreduce", "allreduce", 1, 64, (trial_timeline(),), (100.0,), True, 1)
    cells = projection.project([b], [8, 16, 32], [10.0, 25.0], 0.025, bands)
    _, (row,) = projection_table.table(cells)
    assert row[3] == "-18 % (checked at W = 8, used beyond it at W = 16, 32)"
    assert bands.for_cell("allreduce", None, 2).described() == "-5 to -3 % (checked at W = 2)"
    assert step_bands.pct_range(-0.4, 0.3) == "+0 %" and step_bands.pct_range(-0.6, 0.4) == "-1 to +0 %"


def test_the_configs_latency_prices_every_round_of_every_collective():
    # One bucket of 1e6 bytes after the backward pass, allreduce at W = 8: 2(W-1) = 14 rounds,
    # each paying the latency: 25 µs more per message is 14 x 25 µs = 0.35 ms more per step.
    b = Basis("allreduce", "allreduce", 1, 64, (trial_timeline(),), (100.0,), True, 1)
    low = projection.project_cell(b, 8, 10.0, 0.0, ErrorBands((), "x")).step_ms
    high = projection.project_cell(b, 8, 10.0, 0.025, ErrorBands((), "x")).step_ms
    assert high - low == pytest.approx(14 * 0.025)


def test_a_world_size_the_sweep_ran_keeps_its_own_quality_verdict():
    # quantization_pertensor: undecided at W = 2 (not matching), matching at W = 4 with fewer
    # steps than allreduce. At W = 2 its own verdict keeps it out; at W = 8 (not run) W = 4's
    # is assumed, and the table says which W each cell's quality is from.
    tl = trial_timeline()
    ar = Basis("allreduce", "allreduce", 4, 64, (tl,), (100.0,), True, 2, (QualityAt(2, (100.0,), True),))
    q = Basis("quantization_pertensor", "quantization_pertensor", 4, 64, (tl,), (50.0,), True, 2,
              (QualityAt(2, (50.0,), False),))
    none = ErrorBands((), "x")
    at2 = projection.winner(projection.project([ar, q], [2], [10.0], 0.025, none), PairBands((), "x"))
    at8 = projection.winner(projection.project([ar, q], [8], [10.0], 0.025, none), PairBands((), "x"))
    assert at2.winner.config == "allreduce" and at2.runner_up is None
    assert at8.winner.config == "quantization_pertensor"
    cells = projection.project([q], [2, 8, 16], [10.0], 0.025, none)
    assert [c.quality.world_size for c in cells] == [2, 4, 4]
    assert projection_table.quality_from(cells) == "W=2 (not matching) at W=2; W=4 at W=8, 16"
    # projection.csv's measured_world_size and matches_quality are the cell's quality W's
    assert [c.row()["measured_world_size"] for c in cells] == [2, 4, 4]
    assert [c.row()["matches_quality"] for c in cells] == [False, True, True]


def sharded_band_file(tmp_path):
    """DDP's bands as every file before fsdp wrote them (no parallelism field) and fsdp's beside
    them, per all-gather format (bench/projection.py --parallelism fsdp)."""
    rows = [("allreduce", None, {}, 4, -3.0, 2.0),
            ("allreduce", None, {"parallelism": "fsdp", "all_gather": "fp32"}, 4, -8.0, -6.0),
            ("quantized_allreduce", False, {}, 4, -1.0, 1.0),
            ("quantized_allreduce", False, {"parallelism": "fsdp", "all_gather": "fp32"}, 4, 4.0, 7.0),
            ("quantized_allreduce", False, {"parallelism": "fsdp", "all_gather": "uint8"}, 4, -20.0, 12.0)]
    path = tmp_path / "projection_error_cluster.json"
    path.write_text(json.dumps({
        "format": 2, "source": "bench/projection.py", "measured": "2026-12-06T09:00:00Z", "workload": "char_lm",
        "basis": "hosts, W=2", "cells": "W=4", "load_average": [1.0, 1.0], "overall": {},
        "bands": [{"hook": h, "error_feedback": ef, **sharding, "world_size": w, "low_pct": lo, "high_pct": hi,
                   "median_abs_pct": 1.0, "counted": 2, "excluded": 0} for h, ef, sharding, w, lo, hi in rows]}))
    return step_bands.error_bands(path)


def test_an_fsdp_trial_takes_its_fsdp_band_and_a_ddp_trial_its_ddp_one(tmp_path):
    bands = sharded_band_file(tmp_path)
    ddp, fsdp = bands.for_cell("allreduce", None, 4), bands.for_cell("allreduce", None, 4, "fsdp")
    assert (ddp.low_pct, ddp.high_pct, ddp.source) == (-3.0, 2.0, "measured for allreduce")
    assert (fsdp.low_pct, fsdp.high_pct) == (-8.0, -6.0)
    assert fsdp.source == "measured for allreduce under fsdp, fp32 all-gather"
    assert bands.for_cell("allreduce", None, 4, "ddp").low_pct == -3.0
    # fsdp's all-gather: fp32 where not given; each format its own band; DDP gathers nothing
    assert bands.for_cell("quantized_allreduce", False, 4, "fsdp").low_pct == 4.0
    assert bands.for_cell("quantized_allreduce", False, 4, "fsdp", "uint8").low_pct == -20.0
    assert bands.for_cell("quantized_allreduce", False, 4, "ddp", "uint8").low_pct == -1.0
    unmeasured = bands.for_cell("quantized_allreduce", False, 4, "fsdp", "bf16")   # the widest, and says so
    assert (unmeasured.low_pct, unmeasured.high_pct) == (-20.0, 12.0)
    assert unmeasured.source == ("widest measured: quantized_allreduce with error feedback off under fsdp, "
                                 "bf16 all-gather was not measured")


def test_the_reports_bases_take_their_trials_parallelism_and_all_gather_to_their_band(tmp_path):
    """projection.bases: an fsdp configuration's basis carries fsdp and its trials' all-gather
    format (hook_params), so its cells (projection.csv, the map, the cluster answer) print the fsdp band."""
    from types import SimpleNamespace

    from service.answer.recommend import TimeToTarget

    def trial(config, parallelism, all_gather, seed):
        record = SimpleNamespace(params={"global_batch_size": "64"}, parallelism=parallelism)
        params = {"chunk_size": 512, "error_feedback": False, **({"all_gather": all_gather} if all_gather else {})}
        return SimpleNamespace(state="ok", config=config, hook="quantized_allreduce", world_size=4, seed=seed,
                               run_id=f"{config}{seed}", record=record, time_to_target=TimeToTarget(1.0, 50.0, False),
                               hook_params=params)

    trials = [trial("quantized_allreduce-c512", "ddp", None, s) for s in (0, 1)]
    trials += [trial("quantized_allreduce-c512-all_gatheruint8-fsdp", "fsdp", "uint8", s) for s in (0, 1)]
    recorded = {t.run_id: trial_timeline() for t in trials}
    by_config = {b.config: b for b in projection.bases(trials, [], recorded.get)}
    ddp, fsdp = by_config["quantized_allreduce-c512"], by_config["quantized_allreduce-c512-all_gatheruint8-fsdp"]
    assert (ddp.parallelism, ddp.all_gather, fsdp.parallelism, fsdp.all_gather) == ("ddp", None, "fsdp", "uint8")
    bands = sharded_band_file(tmp_path)
    cells = {p.config: p.band for p in projection.project([ddp, fsdp], [4], [10.0], 0.025, bands)}
    assert cells[ddp.config].low_pct == -1.0 and cells[fsdp.config].low_pct == -20.0
