"""``python -m service.report EXPERIMENT_OR_PARENT_RUN_ID [--out DIR] [--no-attach]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m service.report",
        description="Rebuild a sweep's report from MLflow alone: loss_curves.png, throughput.png, "
                    "tradeoff.png, summary.csv, summary.md, a self-contained report.html with "
                    "a 'which configuration to use' section and, where trials recorded their step "
                    "timeline, the projection to other world sizes and links (projection.csv, "
                    "decision_map.png; the config's report.project and report.cluster). Works for "
                    "finished, running and interrupted sweeps.",
        epilog="The MLflow store is MLFLOW_TRACKING_URI when set, else sqlite mlflow.db in the "
               "current directory (the sweep's default).")
    parser.add_argument("sweep", metavar="EXPERIMENT_OR_PARENT_RUN_ID",
                        help="an experiment name (= the config's `name`; its latest sweep is "
                             "used) or a sweep's parent run id (a trial's run id also works)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where to write the files (default: results/report-<run id[:8]>)")
    parser.add_argument("--attach", action=argparse.BooleanOptionalAction, default=True,
                        help="log the files as artifacts of the parent run (default: yes)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or sqlite mlflow.db)")
    args = parser.parse_args(argv)

    from service.report.build import build_report  # after parsing: `--help` waits for no import
    from service.answer.data import ReportError

    try:
        report = build_report(args.sweep, tracking_uri=args.tracking_uri, out_dir=args.out,
                              attach=args.attach)
    except ReportError as e:
        print(f"service.report: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {report.resolve()}")
    if args.attach:
        print("attached to the parent run's artifacts (open it in `mlflow ui`)")
    return 0
