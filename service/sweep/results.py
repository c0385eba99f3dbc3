"""The end of a sweep: one row per trial read back from MLflow, the table printed from them,
where to read the sweep in the MLflow UI, and the sweep's report."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from service.config import SweepConfig, TrialSpec
from service.sweep.paths import local_base, safe_name
from service.text import format_bytes as _bytes  # the name format_table has always called
from service.text import one_line

log = logging.getLogger("service.sweep")

# Summary metrics shown in the end-of-sweep table (logged by the worker's rank 0).
TABLE_METRICS = ("final_loss", "final_eval_accuracy", "time_to_target_s", "samples_per_s", "comm_bytes_per_step",
                 "compression_ratio")


@dataclass
class SweepOutcome:
    parent_run_id: str
    tracking_uri: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    trials: list[TrialSpec] = field(default_factory=list)   # the grid's, then a plan round's (search.plan)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if r["status"] not in ("ok", "nan"))


def trial_rows(parent_run_id: str, tracking_uri: str, trials: list[TrialSpec],
               ran_only: bool = False) -> list[dict[str, Any]]:
    """One row per trial of the sweep, from its MLflow child run (trials in grid order).
    ``ran_only``: leave out trials without a run (adaptive seeds: those never proposed)."""
    from service import tracking

    by_key = {r.key: r for r in tracking.SweepReader(tracking_uri).trials(parent_run_id)}
    rows = []
    for trial in trials:
        record = by_key.get(trial.key)
        if record is None and ran_only:
            continue
        row: dict[str, Any] = {"trial": trial.run_name, "hook": trial.hook,
                               "params": " ".join([f"{k}={v}" for k, v in {**trial.non_default_params(), **trial.non_default_knobs()}.items()]
                                                  + ([f"link={trial.link_gbps:g}Gbit/s"]
                                                     if trial.link_gbps is not None else [])
                                                  + ([trial.kind] if trial.kind != "full" else [])),
                               "world_size": trial.world_size, "seed": trial.seed}
        if record is None:
            row.update({m: None for m in TABLE_METRICS}, status="not run", nan_source="", run_id=None,
                       error="")
        else:
            row.update({m: record.metrics.get(m) for m in TABLE_METRICS})
            tags = record.tags
            row["status"] = tags.get("status", record.status.lower())  # ok | nan | failed | killed
            row["nan_source"] = tags.get("nan_source", "")
            row["error"] = (tags.get("error") or "").splitlines()[0] if tags.get("error") else ""
            row["run_id"] = record.run_id
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The end-of-sweep table: one row per trial."""
    headers = ["hook", "params", "world", "seed", "final loss", "eval acc", "to target s", "samples/s",
               "bytes/step", "compression", "status"]
    body = []
    for r in rows:
        body.append([
            r["hook"], r["params"] or "-", str(r["world_size"]), str(r["seed"]),
            _num(r["final_loss"], "{:.4f}"), _num(r["final_eval_accuracy"], "{:.3f}"),
            _num(r["time_to_target_s"], "{:.2f}"),
            _num(r["samples_per_s"], "{:,.0f}"), _bytes(r["comm_bytes_per_step"]),
            _num(r["compression_ratio"], "{:.2f}x"),
            f"{r['status']} ({r['nan_source']})" if r.get("nan_source") else r["status"],
        ])
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(headers)]
    right = {2, 3, 4, 5, 6, 7, 8, 9}

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(row) for row in body]
    for r in rows:
        if r.get("error"):
            out.append(f"  {r['trial']}: {r['error']}")
    return "\n".join(out).rstrip()


def mlflow_ui_hint(tracking_uri: str, parent_run_id: str) -> str:
    """Where to read the sweep in the MLflow UI: the command serving a local store, the trials'
    page and the sweep's run (both in the UI's model-training view, not its GenAI overview)."""
    from service import tracking

    experiment_id = tracking.experiment_id_of(parent_run_id, tracking_uri)
    command = tracking.ui_command(tracking_uri)
    lines = [f"MLflow: {command}" if command else f"MLflow: {tracking_uri}",
             f"  trials: {tracking.ui_url(tracking_uri, experiment_id)}",
             f"  sweep:  {tracking.ui_url(tracking_uri, experiment_id, parent_run_id)}"]
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def write_report(cfg: SweepConfig, outcome: SweepOutcome) -> str:
    """Build the sweep's report (service.report: plots, summary, report.html) into
    <storage>/<sweep>/report and attach it to the parent run; returns the line to print.
    A report that cannot be built is a one-line warning: the sweep's results are in MLflow."""
    out_dir = local_base(cfg) / f"{safe_name(cfg.name)}-{outcome.parent_run_id[:8]}" / "report"
    try:
        from service.report import build_report

        path = build_report(outcome.parent_run_id, outcome.tracking_uri, out_dir=out_dir, attach=True)
    except Exception as exc:  # noqa: BLE001 - the report must not fail a finished sweep
        log.exception("report failed")
        return (f"warning: no report: {one_line(exc)} (rebuild it with: "
                f"python -m service.report {outcome.parent_run_id})")
    return f"Report: {path} (also attached to the parent run)"
