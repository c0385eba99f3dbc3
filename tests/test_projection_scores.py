"""The projection's decisions scored (bench/_projection_scores.py): regret, Kendall tau,
compress-or-not and the close calls, on hand-made cells whose answers are worked out here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import _projection_scores as scores  # noqa: E402


def rows(projected: dict, measured: dict, w=4, link=1.0) -> list[dict]:
    return [{"hook": h, "world_size": w, "link_gbps": link, "projected_ms": projected[h], "measured_ms": measured[h],
             "counted": True} for h in projected]


def test_kendall_tau_counts_agreeing_pairs():
    assert scores.kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 10, "b": 20, "c": 30}) == pytest.approx(1.0)
    assert scores.kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 30, "b": 20, "c": 10}) == pytest.approx(-1.0)
    # one of three pairs swapped: (2 - 1) / 3
    assert scores.kendall_tau({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 3, "c": 2}) == pytest.approx(1 / 3)
    assert scores.kendall_tau({"a": 1}, {"a": 1}) is None


def test_a_wrong_pick_costs_its_regret_and_the_compress_call_is_judged_where_it_matters():
    # projected: powersgd fastest; measured: quantized_allreduce 100, powersgd 117, allreduce 150
    cell = scores.score_cell(rows({"allreduce": 140.0, "powersgd": 90.0, "quantized_allreduce": 95.0},
                                  {"allreduce": 150.0, "powersgd": 117.0, "quantized_allreduce": 100.0}), (-5.0, 5.0))
    assert cell["projected_winner"] == "powersgd" and cell["measured_winner"] == "quantized_allreduce"
    assert cell["regret_pct"] == pytest.approx(17.0)
    assert cell["compress_right"] is True        # compressing wins, as projected (gap 33 % > 10 %)
    # 90 / 0.95 = 94.7 >= 95 / 1.05 = 90.5: a close call; measured gap 17 % is outside the 10 % band
    assert cell["hatched"] and cell["call_right"] is False
    near = scores.score_cell(rows({"allreduce": 100.0, "fp16_compress": 80.0}, {"allreduce": 100.0, "fp16_compress": 95.0}),
                             (-5.0, 5.0))
    assert near["compress_right"] is None        # a 5 % gap: not a decision to score
    assert not near["hatched"] and near["call_right"] is True   # decided, and the measured winner


def test_only_counted_cells_with_two_hooks_are_scored():
    r = rows({"allreduce": 10.0, "topk": 12.0}, {"allreduce": 10.0, "topk": 11.0})
    r += rows({"allreduce": 10.0}, {"allreduce": 9.0}, w=8)
    r[1] = {**r[1], "counted": False}
    assert scores.score(r, (-5.0, 5.0)) == []
    both = rows({"allreduce": 10.0, "topk": 12.0}, {"allreduce": 10.0, "topk": 11.0}, w=8, link=0.5)
    (only,) = scores.score(r + both, (-5.0, 5.0))
    assert (only["world_size"], only["link_gbps"], only["hooks"]) == (8, 0.5, 2)


def test_the_totals_read_against_the_targets():
    cells = [{"regret_pct": 0.0, "kendall_tau": 1.0, "compress_right": True, "call_right": True, "hatched": False},
             {"regret_pct": 16.0, "kendall_tau": 0.33, "compress_right": None, "call_right": False, "hatched": True},
             {"regret_pct": 4.0, "kendall_tau": 0.8, "compress_right": False, "call_right": True, "hatched": False}]
    t = scores.totals(cells)
    assert t["cells"] == 3 and t["regret_le_5_pct"] == pytest.approx(2 / 3) and t["median_regret_pct"] == 4.0
    assert t["median_tau"] == 0.8 and t["compress_right"] == "1/2" and t["calls_right"] == "2/3" and t["hatched"] == 1
    assert scores.totals([]) == {}
