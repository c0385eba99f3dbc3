"""The main job as a bench: the quant preset (or a shorter cut of it) through `python -m service.sweep`
in a fresh folder, its wall time, where its minutes went and its answer.

    python bench/main_job.py                 # the preset as `make sweep` runs it (20-30 trials)
    python bench/main_job.py --quick         # 10 trials of 60 steps, one seed (~5 min)
    python bench/trees.py OLD --key wall_s --repeat 2 -- main_job.py --quick   # two trees, alternating

The sweep runs with this checkout's code (PYTHONPATH: the tree this script lives in), so
bench/trees.py compares two trees' main jobs side by side (copy this script into a tree that
lacks it: it needs only bench/_common.py and bench/trial_phases.py there). The JSON has
``wall_s`` (the command's wall, Ray's start and the report included), ``trials``, the phases'
totals (bench/trial_phases.py), the mean start-up per trial, and the report's headline.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, load_average, machine, write_json  # noqa: E402
from trial_phases import read, totals  # noqa: E402

PRESET = ROOT / "tune_configs" / "quant.yaml"


def config_text(quick: bool) -> str:
    """The preset; ``quick``: 60 steps and seed 0 only (the same hooks and world sizes: 10 trials)."""
    if not quick:
        return PRESET.read_text()
    raw = yaml.safe_load(PRESET.read_text())
    raw["workload"]["steps"] = 60
    raw["search"]["seed"] = [0]
    return yaml.safe_dump(raw)


def run(quick: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="main-job-") as tmp:
        work = Path(tmp)
        (work / "quant.yaml").write_text(config_text(quick))
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
        env["PYTHONPATH"] = str(ROOT)  # this tree's service/, whichever tree runs the bench
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "service.sweep", "quant.yaml"], cwd=work, env=env,
                              capture_output=True, text=True)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"the sweep failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        data = read(work / "mlflow.db", "quant")
        summary = next((work / "results").rglob("summary.md")).read_text()
    headline = re.search(r"\*\*(.+?)\*\*", summary)
    starts = [r["startup"] for r in data["trials"] if r["startup"] is not None]
    return {"wall_s": wall, "sweep_wall_s": data["wall_s"], "trials": len(data["trials"]), "totals": totals(data),
            "startup_per_trial_s": sum(starts) / len(starts), "headline": headline.group(1) if headline else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="10 trials of 60 steps (the preset's hooks and world sizes, seed 0)")
    ap.add_argument("--out", help="JSON path (default bench/results/main_job-*.json)")
    args = ap.parse_args()
    before = load_average()
    result = run(args.quick)
    after = load_average()
    print(f"main job{' (quick)' if args.quick else ''}: {result['trials']} trials in {result['wall_s'] / 60:.1f} min "
          f"(start-up {result['startup_per_trial_s']:.1f} s per trial); load average {before} -> {after}")
    for phase, seconds in result["totals"].items():
        print(f"  {phase:<15} {seconds:8.1f} s")
    print(f"headline: {result['headline']}")
    path = write_json("main_job", {"settings": vars(args), **result, "machine": machine(),
                                   "load_average_before": before, "load_average_after": after}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
