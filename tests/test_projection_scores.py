"""bench/_projection_scores.py: the projection's decisions scored against measurement, on
hand-built cells. A ranking that is wrong fails every score; the right one passes those it is
scored on. (The scores on the committed held-out cells: docs/performance.md, "Decisions from the
error of a ratio".)"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import _projection_scores as scores  # noqa: E402

from service.step_model.bands import error_feedback_of  # noqa: E402
from service.step_model.pairs import PAIR_FILE, Configured, MeasuredPair, PairBands  # noqa: E402

W = 4


def tight(hooks, pct: float) -> PairBands:
    """Every pair of ``hooks`` measured at W with a ratio error of -pct ... +pct %."""
    side = {h: Configured(h, error_feedback_of(h, {"error_feedback": True})) for h in hooks}
    return PairBands(tuple(MeasuredPair(side[a], side[b], W, -pct, pct, 2)
                           for a, b in itertools.combinations(sorted(hooks), 2)), "hand-built")


def cell(measured: dict[str, float], projected: dict[str, float]) -> list[dict]:
    return [{"hook": h, "world_size": W, "projected_ms": projected[h], "measured_ms": m} for h, m in measured.items()]


MEASURED_A = {"allreduce": 100.0, "bf16_compress": 50.0, "topk": 80.0}   # compressing wins by 50 %
MEASURED_B = {"allreduce": 100.0, "bf16_compress": 50.0}


def test_a_wrong_ranking_fails_every_score():
    # A: the projection ranks the three the wrong way round, and its 1 % bands decide it
    a = scores.score_cell(cell(MEASURED_A, {"allreduce": 50.0, "bf16_compress": 100.0, "topk": 80.0}),
                          tight(MEASURED_A, 1.0))
    assert a["decided"] and a["projected_winner"] == "allreduce" and a["measured_winner"] == "bf16_compress"
    assert (a["winner_right"], a["compress_right"], a["kendall_tau"]) == (False, False, -1.0)
    assert a["regret_pct"] == 100.0
    # B: projected a near tie (98 against 100: inside its 5 % band, hatched), measured 2x apart
    b = scores.score_cell(cell(MEASURED_B, {"allreduce": 98.0, "bf16_compress": 100.0}), tight(MEASURED_B, 5.0))
    assert not b["decided"] and b["hatched_right"] is False
    totals = scores.totals([a, b])
    assert {name: totals[name]["passed"] for name in scores.TARGETS} == dict.fromkeys(scores.TARGETS, False)


def test_the_right_ranking_passes_the_scores_it_is_scored_on():
    a = scores.score_cell(cell(MEASURED_A, MEASURED_A), tight(MEASURED_A, 1.0))
    assert a["decided"] and a["winner_right"] and a["compress_right"] and a["kendall_tau"] == 1.0
    assert a["regret_pct"] == 0.0 and a["hatched_right"] is None
    # a near tie projected and measured: hatched, and right to be
    near = {"allreduce": 100.0, "bf16_compress": 98.0}
    b = scores.score_cell(cell(near, {"allreduce": 100.0, "bf16_compress": 99.0}), tight(near, 5.0))
    assert not b["decided"] and b["hatched_right"] is True
    totals = scores.totals([a, b])
    assert all(totals[name]["passed"] for name in scores.TARGETS), totals


def test_the_pairs_bench_re_derives_the_committed_pair_bands_and_scores_them(tmp_path):
    """bench/projection_pairs.py on the committed held-out cells (no trial runs) writes the same
    bands the report decides with, and prints every score beside its target and power."""
    import json
    import subprocess

    out = tmp_path / "pairs.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "projection_pairs.py"), "--out", str(out),
                           "--draws", "20"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    committed = json.loads((PAIR_FILE).read_text())
    assert json.loads(out.read_text())["bands"] == committed["bands"]
    for name in scores.TARGETS:
        assert any(line.startswith(name) for line in done.stdout.splitlines()), name


def test_the_pairs_bench_on_cells_of_one_hook_says_there_is_nothing_to_score(tmp_path):
    """A run of one hook (bench/projection.py --hooks allreduce: no pair to rank) ended in a
    KeyError traceback after its tables; it says so in one line and exits 0."""
    import json
    import subprocess

    from service.step_model.bands import RAW_FILE

    saved = json.loads(RAW_FILE.read_text())
    cells = tmp_path / "cells.json"
    one = [r for r in saved["cell_rows"] if r["hook"] == "allreduce" and "parallelism" not in r]  # DDP's alone
    cells.write_text(json.dumps({**saved, "cell_rows": one}))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "projection_pairs.py"), "--cells", str(cells),
                           "--out", str(tmp_path / "pairs.json"), "--draws", "5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "scores: no held-out cell with two hooks to rank, nothing to score" in done.stdout
