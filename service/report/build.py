"""Building a sweep's report: read it, draw it, write every file, record the answer in MLflow."""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from service.answer import decision, recommend
from service.report.loss_curves import loss_curve_data
from service.answer.data import (ReportError, Sweep, load_sweep, open_store,
                                 recommendations, summary_rows, throughput_data)
from service.report.tradeoff import tradeoff_data
from service.report.render import render_html, summary_markdown, write_summary_csv
from service.text import one_line

PROJECTED_FILES = ("decision_map.png", "projection.csv")  # only when trials recorded their step timeline
REPORT_FILES = ("loss_curves.png", "throughput.png", "tradeoff.png", "summary.csv", "summary.md",
                "report.html", "answer.json") + PROJECTED_FILES


def build_report(parent_run_id: str, tracking_uri: str | None = None, out_dir: Path | None = None,
                 attach: bool = True) -> Path:
    """Write every report file for the sweep whose parent run is `parent_run_id` into
    `out_dir` (default results/report-<id8>), attach them to the parent run when `attach`,
    and return the path of report.html. Raises ReportError for problems the user can fix."""
    from service.report import plots  # here: `--help` and the package import stay light
    from service.config import ConfigError
    from service.config.loading import plan_cell, report_section
    from service.report.projected import projected
    from service.tracking import StoreError

    reader = open_store(tracking_uri)
    try:
        parent_run_id = reader.resolve_parent(parent_run_id)
    except StoreError as e:
        raise ReportError(str(e)) from None
    sweep = load_sweep(reader, parent_run_id)
    try:
        report_cfg = report_section(sweep.config_text)
        plan_at = plan_cell(sweep.config_text, report_cfg)
    except ConfigError as e:
        raise ReportError(f"the sweep's config: {e}") from None
    out_dir = Path(out_dir) if out_dir is not None else Path("results") / f"report-{parent_run_id[:8]}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create {out_dir}: {e.strerror}") from None

    rows = summary_rows(sweep)
    recs = recommendations(sweep)
    quality_metric, tradeoff = tradeoff_data(sweep)
    images = {
        "loss_curves": plots.plot_loss_curves(loss_curve_data(sweep), out_dir / "loss_curves.png",
                                              title=sweep.experiment),
        "throughput": plots.plot_throughput(throughput_data(sweep), out_dir / "throughput.png",
                                            title=sweep.experiment),
        "tradeoff": plots.plot_tradeoff(tradeoff, quality_metric, out_dir / "tradeoff.png",
                                        title=sweep.experiment),
    }
    scale = projected(sweep, recs, reader, report_cfg, out_dir, title=sweep.experiment, plan_at=plan_at)  # service/answer/projection.py
    if scale.image is not None:  # nothing priced (no step timeline recorded): the section says so, no map
        images["decision_map"] = scale.image
    write_summary_csv(rows, recs, out_dir / "summary.csv")
    (out_dir / decision.ARTIFACT).write_text(json.dumps(scale.answer.to_json(), indent=1) + "\n")
    (out_dir / "summary.md").write_text(summary_markdown(sweep, rows, recs, scale) + scale.markdown())
    report = out_dir / "report.html"
    report.write_text(render_html(sweep, rows, recs, images, quality_metric, scale))
    if attach:
        try:
            record_answer(reader, sweep, recs)
            reader.attach(parent_run_id, [p for p in (out_dir / name for name in REPORT_FILES) if p.exists()])
        except Exception as e:
            raise ReportError(f"report written to {out_dir}, but attaching it to run "
                              f"{parent_run_id} failed: {one_line(e, with_type=False)}") from None
    return report


def record_answer(reader, sweep: Sweep, recs: list[recommend.Recommendation]) -> None:
    """Into MLflow: each trial's time_to_target_s (absent when never reached) and
    time_to_target_interpolated (a split network sweep's on each link's timing run: the mean over
    the seeds of its quality runs, links.py), and on the parent run the answer per world size and link as
    tags recommended.w{W}.{link} = configuration and each configuration's quality verdict as
    verdict.w{W}.{link}.{configuration} = matches | worse | undecided | nan | failed | baseline,
    so the UI shows them without the report."""
    reached: dict[str, list[recommend.TimeToTarget]] = defaultdict(list)
    for t in sweep.trials:
        if t.time_to_target is not None and t.time_to_target.seconds is not None:
            reached[(t.timing or t).run_id].append(t.time_to_target)
    for run_id, times in reached.items():
        reader.record(run_id, metrics={"time_to_target_s": statistics.fmean(x.seconds for x in times),
                                       "time_to_target_interpolated": float(any(x.interpolated for x in times))})
    tags = {r.key: r.choice.config for r in recs if r.choice is not None}
    tags.update({f"verdict.w{r.world_size}.{recommend.tag_safe(r.link)}.{_tag_safe_config(c.config)}": c.verdict.value
                 for r in recs for c in r.candidates})
    tags["target_tolerance"] = repr(sweep.tolerance)
    reader.record(sweep.parent_run_id, tags=tags)


def _tag_safe_config(config: str) -> str:
    """A configuration's label as part of an MLflow tag key, which allows only alphanumerics and
    _ - . space : / (a plan's label has = ; ( ) ,): each other character as _."""
    return re.sub(r"[^\w\-. :/]", "_", config)
