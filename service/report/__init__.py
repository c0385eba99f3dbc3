"""The sweep report: plots, summary tables and report.html, rebuilt from MLflow alone
(``python -m service.report``).

    data.py       trial records (service.tracking.SweepReader) -> Sweep, aggregated into typed rows
    loss_curves.py  the loss curves over seeds, and the minus-allreduce pairs on the seeds both ran
    tradeoff.py   the trade-off's points (quality against bytes) on the seeds every configuration ran
    recommend.py  which configuration to use: time to target, paired quality gaps, the ranking
    render.py     markdown / CSV tables, the headline, report.html from templates/report.html.j2
    build.py      build_report: every file written into a folder and attached to the parent run
    projection.py  time to target at (W, link) cells, priced by the step model from trials' timelines
    projected.py  the projected section of the report (projection.csv, the cluster's answer)
    decision_map.py  the decision map: the projected winner per (W, link) cell
    plots.py      the report's figures (loss curves, throughput, trade-off)
    cli.py        the command line

The names below are the package's interface (service.sweep builds the report at the end of a
sweep; tests read the data the plots are drawn from).
"""

from service.report.build import PROJECTED_FILES, REPORT_FILES, build_report
from service.report.cli import main
from service.report.loss_curves import LossCurve, loss_curve_data
from service.answer.data import (ReportError, Sweep, Trial, load_sweep, open_store, recommendations,
                                 summary_rows, throughput_data)
from service.report.tradeoff import TradeoffPoint, tradeoff_data
from service.report.render import headline

__all__ = ["PROJECTED_FILES", "REPORT_FILES", "LossCurve", "ReportError", "Sweep", "Trial", "TradeoffPoint", "build_report",
           "headline", "load_sweep", "loss_curve_data", "main", "open_store", "recommendations",
           "summary_rows", "throughput_data", "tradeoff_data"]
