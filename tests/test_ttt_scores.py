"""bench/ttt_scores.py: time to target projected from a sweep's smallest W scored against a larger
W it measured, on hand-built rows: a wrong ranking fails every score, the right one passes, and
the error splits into the step's and the crossing step's. (The scores on a fresh `make sweep`:
docs/performance.md, "Time to target scored".)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import ttt_scores  # noqa: E402


def row(config: str, hook: str, projected_s: float, measured_s: float, crossing_below=100.0, crossing_here=100.0,
        step_ms=None, matches=True) -> dict:
    step = 1000.0 * projected_s / crossing_below
    return {"config": config, "hook": hook, "error_feedback": None if hook == "allreduce" else False,
            "projected_s": projected_s, "measured_s": measured_s, "projected_step_ms": step,
            "measured_step_ms": step_ms or 1000.0 * measured_s / crossing_here, "crossing_below": crossing_below,
            "crossing_here": crossing_here, "matches_below": matches, "seed_steps_ms": [step, step], "seeds": [0, 1]}


MEASURED = {"allreduce": 30.0, "bf16_compress": 20.0, "quantized_allreduce": 25.0}


def test_the_right_ranking_passes_and_a_wrong_one_fails_every_score():
    hooks = list(MEASURED)
    right = [row(h, h, MEASURED[h] * 1.05, MEASURED[h]) for h in hooks]
    wrong = [row(h, h, 1000.0 / MEASURED[h], MEASURED[h]) for h in hooks]  # the order reversed
    by = lambda rows: {r["config"]: r for r in rows}  # noqa: E731
    good = ttt_scores.score({r["config"]: r["projected_s"] for r in right}, MEASURED, by(right))
    bad = ttt_scores.score({r["config"]: r["projected_s"] for r in wrong}, MEASURED, by(wrong))
    assert good["winner_right"] and good["regret_pct"] == 0.0 and good["kendall_tau"] == 1.0
    assert good["compress_right"] is True  # bf16 measured 50 % ahead: decisive, and projected so
    assert not bad["winner_right"] and bad["regret_pct"] == pytest.approx(50.0) and bad["kendall_tau"] == -1.0
    assert bad["compress_right"] is False


def test_the_error_splits_into_the_step_and_the_quality_assumed_from_below():
    # projected 10 % slow on the step, and the crossing step assumed from below 20 % early
    r = row("bf16_compress", "bf16_compress", projected_s=0.8 * 1.1 * 20.0, measured_s=20.0, crossing_below=80.0,
            crossing_here=100.0, step_ms=200.0)
    r["projected_step_ms"] = 220.0
    ttt_scores.errors([r])
    assert r["step_error_pct"] == pytest.approx(10.0) and r["crossing_error_pct"] == pytest.approx(-20.0)
    assert r["error_pct"] == pytest.approx(100.0 * (1.1 * 0.8 - 1.0))


def test_pair_errors_are_the_projected_ratio_over_the_measured():
    rows = [row("allreduce", "allreduce", 33.0, 30.0), row("bf16_compress", "bf16_compress", 20.0, 20.0)]
    [p] = ttt_scores.pair_errors(rows)
    assert (p["a"], p["b"]) == ("allreduce", "bf16_compress")
    assert p["error_pct"] == pytest.approx(100.0 * ((33 / 20) / (30 / 20) - 1.0))


def test_a_store_without_a_sweep_is_one_line(tmp_path):
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "bench" / "ttt_scores.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == f"error: no mlflow.db in {tmp_path}"


def test_an_unmeasured_pair_is_decided_under_the_absolute_bands_composed_not_under_no_error():
    """Error feedback off was never measured on the machine's shape: the pair takes the two
    absolute bands as independent, as the report does. It once got a 0 % band (no error at all),
    so a 12 % lead was 'decided'."""
    from service.step_model.bands import SHAPE_ERROR_FILE, error_bands

    rows = [row("allreduce", "allreduce", 30.0, 30.0), row("topk", "topk", 33.6, 33.0)]  # topk off: unmeasured
    cell = ttt_scores.decide(rows, 4)
    band = cell["decision"].band
    assert not cell["decided"] and not band.measured and "unmeasured pair" in band.source
    shape = error_bands(SHAPE_ERROR_FILE)
    a, b = shape.for_cell("allreduce", None, 4), shape.for_cell("topk", False, 4)
    assert band.low_pct == pytest.approx(100.0 * ((100 + a.low_pct) / (100 + b.high_pct) - 1))
