"""Adaptive seeds and paired timing, measured on a preset (issue 23 item 6).

    python bench/verdicts.py run adaptive DIR       # the preset as it is (search.seed: {min, max})
    python bench/verdicts.py run fixed DIR          # the same, seeds 0 .. max-1 for everyone
    python bench/verdicts.py run adaptive_hog DIR   # adaptive, CPU hogs while the baseline's trials run
    python bench/verdicts.py compare adaptive=DIR fixed=DIR adaptive_hog=DIR [--out JSON]

Each ``run`` is one real sweep (`python -m service.sweep`, local Ray, its own SQLite store
DIR/mlflow.db, report under DIR/results/) and takes as long as the preset does; run the arms one
after another on an otherwise idle machine (their wall times are compared). Any sweep directory
with an mlflow.db and a results/ report can be an arm (e.g. a fresh clone of the project after
`make sweep`). ``compare`` reads the arms back and prints: trials and wall time (the sweep run's
start to end in MLflow) per arm; per configuration and world size, each arm's verdict, seeds,
the verdicts a fixed grid would reach on the same trials (the plain 95 % interval on seeds 0-1,
"fixed 2", and on all the seeds the arm ran, "fixed all"), its paired speed-up
(`speedup_vs_baseline`) and the unpaired one (the two configurations' own times to target, each
timed in its own trials).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, load_average, machine, table, write_json  # noqa: E402
from _hog import HogDuringBaseline, busy  # noqa: E402

ARMS = ("adaptive", "fixed", "adaptive_hog")
HOGS = 4  # busy processes while the baseline runs: more than this machine has cores


def _config(preset: str, arm: str, directory: Path) -> tuple[Path, str]:
    """The preset as a file for this arm (fixed: the seed range as a list); its experiment name."""
    import yaml

    from service.config.loading import resolve_config_path

    data = yaml.safe_load(resolve_config_path(preset).read_text())
    seeds = data["search"]["seed"]
    if arm == "fixed" and isinstance(seeds, dict):
        data["search"]["seed"] = list(range(seeds["max"]))
    path = directory / f"{arm}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data["name"]


def run_arm(arm: str, directory: Path, preset: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    config, experiment = _config(preset, arm, directory)
    uri = f"sqlite:///{directory / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(ROOT))
    before, t0 = load_average(), time.monotonic()
    with HogDuringBaseline(uri, experiment, busy(HOGS)).around(arm == "adaptive_hog") as hog:
        rc = subprocess.call([sys.executable, "-m", "service.sweep", str(config)], cwd=directory, env=env)
    print(f"{arm}: exit {rc} in {(time.monotonic() - t0) / 60:.1f} min; load {before} -> {load_average()}"
          + (f"; hogs ran {hog.hogged_s / 60:.1f} min" if arm == "adaptive_hog" else ""))


def _arm(directory: Path) -> dict:
    """An arm read back: trials, wall time, load, and summary.csv's rows by (config, W)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{directory / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=1000)]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags and r.info.end_time]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    wall = sum(r.info.end_time - r.info.start_time for r in parents) / 60000.0
    loads = [r.data.metrics["load_avg_1m"] for r in children if "load_avg_1m" in r.data.metrics]
    summary = max(directory.glob("results/*/report/summary.csv"), key=lambda p: p.stat().st_mtime)
    rows = {(r["configuration"], r["world_size"]): r for r in csv.DictReader(summary.open())}
    latest = max(parents, key=lambda r: r.info.start_time).info.run_id
    return {"trials": len(children), "wall_min": wall, "rows": rows, "views": rule_views(directory, latest),
            "load_avg_1m": sum(loads) / len(loads) if loads else float("nan")}


def rule_views(directory: Path, parent_run_id: str) -> dict[tuple[str, str], dict[str, str]]:
    """The arm's trials judged as a fixed grid would judge them: the plain 95 % interval on
    seeds 0..1 ("fixed 2") and on every seed it ran ("fixed all"). The training is a function of
    (configuration, world size, seed) (gloo is deterministic), so a fixed grid's own run would
    train exactly these trials; only its timing would differ."""
    from service import tracking
    from service.answer.data import load_sweep, recommendations
    from service.answer.sequential import Rule

    sweep = load_sweep(tracking.SweepReader(f"sqlite:///{directory / 'mlflow.db'}"), parent_run_id)
    views: dict[tuple[str, str], dict[str, str]] = {}
    trials = list(sweep.trials)
    for name, keep in (("fixed 2", lambda t: t.seed < 2), ("fixed all", lambda t: True)):
        sweep.trials, sweep.rule = [t for t in trials if keep(t)], Rule()
        for rec in recommendations(sweep):
            for c in rec.candidates:
                views.setdefault((c.config, str(rec.world_size)), {})[name] = c.verdict.value
    return views


def _float(text: str) -> float:
    return float(text) if text else float("nan")


def _unpaired(rows: dict, key: tuple[str, str]) -> float:
    base = rows.get(("allreduce", key[1]))
    return _float(base["time_to_target_s_mean"]) / _float(rows[key]["time_to_target_s_mean"]) if base else float("nan")


def compare(arms: dict[str, Path], out: str | None) -> None:
    data = {name: _arm(d) for name, d in arms.items()}
    print(table(["arm", "trials", "wall (min)", "mean load (1 min)"],
                [[n, a["trials"], a["wall_min"], a["load_avg_1m"]] for n, a in data.items()]))
    keys = sorted({k for a in data.values() for k in a["rows"]}, key=lambda k: (int(k[1]), k[0]))
    headers = ["configuration", "W"]
    for n in data:
        headers += [f"{n}: verdict", "seeds", "fixed 2", "fixed all", "speed-up paired", "unpaired"]
    body = []
    for key in keys:
        row = [key[0], int(key[1])]
        for a in data.values():
            r, view = a["rows"].get(key), a["views"].get(key, {})
            row += ([r["verdict"], r["seeds"].replace(" ", ","), view.get("fixed 2", "-"), view.get("fixed all", "-"),
                     _float(r["speedup_vs_baseline"]), _unpaired(a["rows"], key)]
                    if r else ["-", "-", "-", "-", None, None])
        body.append(row)
    print()
    print(table(headers, body))
    path = write_json("verdicts", {"machine": machine(), "load_average_after": load_average(),
                                   "arms": {n: {"dir": str(arms[n]), "trials": a["trials"], "wall_min": a["wall_min"],
                                                "load_avg_1m": a["load_avg_1m"], "rows": list(a["rows"].values()),
                                                "fixed_rule_verdicts": {f"{c}-w{w}": v for (c, w), v in a["views"].items()}}
                                            for n, a in data.items()}}, out)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one arm's sweep into DIR")
    run.add_argument("arm", choices=ARMS)
    run.add_argument("dir", type=Path)
    run.add_argument("--preset", default="quant", help="a preset name or config path (default quant)")
    cmp_ = sub.add_parser("compare", help="read arms back: NAME=DIR ...")
    cmp_.add_argument("arms", nargs="+", metavar="NAME=DIR")
    cmp_.add_argument("--out", help="JSON path (default bench/results/verdicts.json)")
    args = parser.parse_args()
    if args.command == "run":
        run_arm(args.arm, args.dir.resolve(), args.preset)
    else:
        compare({a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in args.arms}, args.out)


if __name__ == "__main__":
    main()
