"""Where a sweep's wall time goes, trial by trial, read back from its MLflow store.

    python bench/trial_phases.py DIR [--experiment NAME] [--out JSON]

DIR holds the sweep's SQLite store (DIR/mlflow.db; e.g. a fresh clone after `make sweep`). Each
trial's run carries the phases its rank 0 and the sweep recorded (service/train/phases.py):
start-up (the trainer's creation until the first step: Ray Train's worker group, process group,
workload and DDP), a compiled trial's compilation, the training steps, the paired-timing and step-timeline windows, evals,
checkpoints, the end of the trial (summary, the timeline's gather) and the tear-down (until
TorchTrainer.fit returned). The sweep's own wall time is its parent run's start to end; what no
trial accounts for (Ray's start, Tune between trials, each trial process's start, the report) is
printed as "outside trials". Printed: one row per trial, the totals and each phase's share, the
mean load average the trials ran under; written to JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_average, table, write_json  # noqa: E402

PHASES = ("startup", "compile", "train", "paired", "timeline", "eval", "checkpoint", "finish", "teardown")


def read(store: Path, experiment: str | None) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    exps = [client.get_experiment_by_name(experiment)] if experiment else client.search_experiments()
    runs = [r for e in exps if e is not None for r in client.search_runs([e.experiment_id], max_results=5000)]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    if not parents:
        raise SystemExit(f"no sweep run in {store}")
    parent = max(parents, key=lambda r: r.info.start_time)
    trials = sorted((r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
                    key=lambda r: r.info.start_time)
    rows = [{"trial": r.info.run_name, **{p: r.data.metrics.get(f"phase_{p}_s") for p in PHASES},
             "load_avg_1m": r.data.metrics.get("load_avg_1m")} for r in trials]
    wall = ((parent.info.end_time or parent.info.start_time) - parent.info.start_time) / 1000.0
    return {"sweep": parent.data.tags.get("mlflow.runName", parent.info.run_id), "wall_s": wall, "trials": rows}


def totals(data: dict) -> dict[str, float]:
    """Each phase some trial recorded (compile: only compiled trials have one), summed; what no trial accounts for."""
    out = {p: sum(r[p] or 0.0 for r in data["trials"]) for p in PHASES
           if any(r[p] is not None for r in data["trials"])}
    out["outside trials"] = data["wall_s"] - sum(out.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="folder with the sweep's mlflow.db")
    ap.add_argument("--experiment", help="the sweep's experiment (default: the latest sweep in the store)")
    ap.add_argument("--out", help="JSON path (default bench/results/trial_phases-*.json)")
    args = ap.parse_args()
    data = read(args.dir / "mlflow.db", args.experiment)
    print(table(["trial", *(f"{p} s" for p in PHASES), "load"],
                [[r["trial"], *(r[p] for p in PHASES), r["load_avg_1m"]] for r in data["trials"]]))
    sums = totals(data)
    print(f"\nsweep {data['sweep']}: {len(data['trials'])} trials, wall {data['wall_s'] / 60:.1f} min")
    print(table(["phase", "seconds", "share of wall"],
                [[p, round(s, 1), f"{100 * s / data['wall_s']:.1f} %"] for p, s in sums.items()]))
    loads = [r["load_avg_1m"] for r in data["trials"] if r["load_avg_1m"] is not None]
    print(f"mean load average over the trials: {statistics.fmean(loads):.2f}" if loads else "")
    data.update(totals=sums, load_now=load_average())
    print(f"wrote {write_json('trial_phases', data, args.out)}")


if __name__ == "__main__":
    main()
