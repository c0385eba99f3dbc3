"""The sweep's speed verdict under a busy machine, for real (issue 23): two sweeps of the same
two configurations (allreduce, bf16_compress; char_lm at world size 2, one seed) through
`python -m service.sweep` with a local Ray and a SQLite MLflow store. The second one has CPU
load (the trial's ranks stopped 60 % of every ms) exactly while the baseline's
trial runs, as another job sharing the machine would.

The training is the same in both (same seed, deterministic gloo): the crossing steps are equal,
so any change in the speed-up is the timing alone. The paired speed-up (summary.csv's
`speedup_vs_baseline`: the baseline timed inside bf16_compress's own trial) must stay within the
unloaded run's spread; the unpaired one (the two trials' own times to target, each timed
alone) must not: in the loaded sweep it exceeds that sweep's paired one by more than the spread,
crediting bf16_compress with the hogs' damage to allreduce.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _hog import HogDuringBaseline, throttle  # noqa: E402

SHARE = 0.6  # of every ms the baseline's ranks are stopped: 2.5x its steps (bench/_hog.py)
CONFIG = """
name: paired_load
workload:
  name: char_lm
  steps: 100
  eval_every: 25
  warmup_steps: 5
search:
  hooks: [allreduce, bf16_compress]
  world_size: [2]
  seed: [0]
resources:
  cpus_per_worker: 1
  max_concurrent_trials: 1
report:
  target_tolerance: 0.02
tracking:
  paired_timing_every: 4
  transport_probe: false
"""


def _sweep(tmp: Path, hog: bool) -> dict[str, dict[str, str]]:
    config = tmp / "paired_load.yaml"
    config.write_text(CONFIG)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1")
    with HogDuringBaseline(uri, "paired_load", throttle(SHARE)).around(hog) as watcher:
        done = subprocess.run([sys.executable, "-m", "service.sweep", str(config)], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert watcher.seen == hog  # the hogs ran, during the baseline's trial
    summary = next((tmp / "results").rglob("summary.csv"))
    return {r["configuration"]: r for r in csv.DictReader(summary.open())}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    quiet, loaded = tmp_path_factory.mktemp("quiet"), tmp_path_factory.mktemp("loaded")
    return {"quiet": (quiet, _sweep(quiet, hog=False)), "loaded": (loaded, _sweep(loaded, hog=True))}


@pytest.fixture(scope="module")
def runs(dirs):
    return {name: rows for name, (_, rows) in dirs.items()}


def _unpaired(rows: dict[str, dict[str, str]]) -> float:
    """The speed-up from the two trials' own times to target, each timed in its own trial."""
    return float(rows["allreduce"]["time_to_target_s_mean"]) / float(rows["bf16_compress"]["time_to_target_s_mean"])


def test_the_paired_speedup_holds_under_load_where_the_unpaired_one_moves(runs):
    quiet, loaded = runs["quiet"]["bf16_compress"], runs["loaded"]["bf16_compress"]
    # the hogs slowed the baseline's own trial: its steps, not bf16_compress's
    slowed = (float(runs["loaded"]["allreduce"]["step_time_ms_median_mean"])
              / float(runs["quiet"]["allreduce"]["step_time_ms_median_mean"]))
    assert slowed > 1.5, slowed
    # the unloaded run's spread: the paired ratio's interquartile range over its windows, relative
    spread = max(float(r["step_ratio_vs_baseline_iqr_mean"]) / float(r["step_ratio_vs_baseline_mean"])
                 for r in (quiet, loaded))
    paired = float(loaded["speedup_vs_baseline"]) / float(quiet["speedup_vs_baseline"])
    assert abs(paired - 1) <= spread, (paired, spread)
    # the unpaired figure credits bf16_compress with the hogs' damage: read against the paired one
    # of the same loaded sweep (the quiet sweep is not quiet under the suite's second worker: in
    # CI on 2026-12-02 it slowed the quiet allreduce too, and the quiet-to-loaded ratio moved 1.13)
    unpaired = _unpaired(runs["loaded"]) / float(loaded["speedup_vs_baseline"])
    assert unpaired - 1 > spread, (unpaired, spread)
    assert unpaired > 1.3


def test_the_verdicts_bench_reads_the_two_runs_back(dirs, tmp_path):
    """bench/verdicts.py compare (what docs/performance.md's tables come from) on these sweeps."""
    out = tmp_path / "verdicts.json"
    arms = [f"{name}={d}" for name, (d, _) in dirs.items()]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "verdicts.py"), "compare", *arms, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    data = json.loads(out.read_text())
    assert {name: arm["trials"] for name, arm in data["arms"].items()} == {"quiet": 2, "loaded": 2}
    assert all(arm["wall_min"] > 0 for arm in data["arms"].values())
    assert "quiet: verdict" in done.stdout and "loaded: verdict" in done.stdout
    bf16 = next(line.split() for line in done.stdout.splitlines() if line.startswith("bf16_compress"))
    # configuration, W, then per arm: verdict, seeds, fixed-rule verdicts (2 seeds, all), paired and unpaired speed-ups
    assert bf16[:2] == ["bf16_compress", "2"] and len(bf16) == 14
