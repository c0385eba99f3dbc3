"""The sweep report: plots, summary tables and report.html, rebuilt from MLflow alone.

    python -m service.report EXPERIMENT_OR_PARENT_RUN_ID [--out DIR] [--no-attach]

Everything here is derived from what the sweep recorded in MLflow (the contract in issue 3):
one parent run per sweep, one nested child run per trial with params `hook`, the hook's own
parameters, `world_size`, `seed`; step metrics `loss`, `eval_accuracy`; summary metrics
`samples_per_s`, `comm_bytes_per_step`, ...; tag `status` (ok | nan | failed). So a report
can be rebuilt for a finished sweep, one still running, or one that was interrupted.

The layers, top to bottom:
    open_store()      service.tracking.SweepReader: the MLflow reads (tracking.py is the only MLflow module)
    load_sweep()      -> Sweep: the parent run and one Trial per child run, histories included
    *_data()          the numbers every plot and table is drawn from (tests compare these
                      with what MLflow holds)
    service.plots     matplotlib (Agg) drawings of that data
    build_report()    writes every file into out_dir and attaches them to the parent run
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import math
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from service import recommend
from service.recommend import BASELINE_HOOK, LOOPBACK

# Params every trial logs that are not hook parameters (issue 3's contract, plus a few the
# driver may add). Used only when the hooks library cannot say which params a hook takes.
_TRIAL_PARAMS = {
    "hook", "world_size", "seed", "workload", "global_batch_size", "steps", "lr", "optimizer",
    "grad_accumulation", "backend", "torch_version", "ray_version", "eval_every",
    "cpus_per_worker", "use_gpu", "on_nan", "config", "config_path", "git_commit",
    "mlflow_version", "python_version", "warmup_steps", "micro_batch_size", "per_worker_batch_size",
}
SUMMARY_METRICS = (
    "samples_per_s", "step_time_ms_median", "step_time_ms_iqr", "comm_bytes_per_step",
    "compression_ratio", "hook_time_ms", "final_loss", "final_eval_loss", "final_eval_accuracy",
    "nan_detected", "first_nan_step",
)
REPORT_FILES = ("loss_curves.png", "throughput.png", "tradeoff.png", "summary.csv", "summary.md",
                "report.html", "projected_throughput.png")


class ReportError(Exception):
    """A problem the user can fix (unknown id, unreachable store): printed as one line."""


# --------------------------------------------------------------------------------------------
# Reading MLflow
# --------------------------------------------------------------------------------------------

def open_store(tracking_uri: str | None = None):
    """The sweep reader of service.tracking (the only MLflow module), its errors as ReportError."""
    from service import tracking  # imported here: `--help` should not wait for mlflow

    try:
        return tracking.SweepReader(tracking_uri)
    except tracking.StoreError as e:
        raise ReportError(str(e)) from None


# --------------------------------------------------------------------------------------------
# The sweep as data
# --------------------------------------------------------------------------------------------

@dataclass
class Trial:
    """One child run: what it was (hook, params, world size, seed) and what it recorded."""

    run_id: str
    run_name: str
    hook: str
    hook_params: dict[str, str]
    world_size: int
    seed: int
    state: str                     # ok | nan | failed | killed | running
    error: str | None
    nan_source: str | None
    metrics: dict[str, float]      # summary metrics, as logged (latest value)
    loss: tuple[np.ndarray, np.ndarray]
    eval_accuracy: tuple[np.ndarray, np.ndarray]
    config: str = ""               # the run name without -w/-s: one label per configuration
    eval_loss: tuple[np.ndarray, np.ndarray] = (np.array([]), np.array([]))
    step_time_ms: tuple[np.ndarray, np.ndarray] = (np.array([]), np.array([]))
    link: str = LOOPBACK           # the emulated link it ran on (param link_gbps), else loopback
    time_to_target: recommend.TimeToTarget | None = None   # set by load_sweep

    @property
    def chunk_size(self) -> int | None:
        value = self.hook_params.get("chunk_size")
        return int(float(value)) if value not in (None, "", "None") else None

    def metric(self, key: str) -> float:
        return self.metrics.get(key, math.nan)

    @property
    def stop_step(self) -> int | None:
        """Where a NaN trial stopped: first_nan_step if logged, else its last loss step."""
        if self.state != "nan":
            return None
        first = self.metric("first_nan_step")
        if math.isfinite(first):
            return int(first)
        return int(self.loss[0][-1]) if len(self.loss[0]) else None


@dataclass
class Sweep:
    experiment: str
    parent_run_id: str
    parent_name: str
    parent_status: str             # MLflow status of the parent run: RUNNING, FINISHED, ...
    started: str
    tracking_uri: str
    config_name: str | None
    config_text: str | None
    trials: list[Trial] = field(default_factory=list)
    tolerance: float = recommend.DEFAULT_TOLERANCE   # report.target_tolerance of the config

    @property
    def world_sizes(self) -> list[int]:
        return sorted({t.world_size for t in self.trials})

    @property
    def complete(self) -> bool:
        return (self.parent_status == "FINISHED"
                and all(t.state in ("ok", "nan", "failed") for t in self.trials))


def config_label(hook: str, hook_params: dict[str, str], run_name: str = "") -> str:
    """The configuration's name: the trial's run name without its -w/-s part (so
    `quantization_perchannel-c512`, `powersgd-rank4`: only non-default params appear there),
    or, for a run not named by the sweep, the hook with its chunk size and other params."""
    match = re.fullmatch(r"(.+)-w\d+-s\d+(?:-[0-9.]+gbps)?", run_name)  # -{G}gbps: an emulated link
    if match and match.group(1).split("-")[0] == hook:
        return match.group(1)
    label = hook
    if hook_params.get("chunk_size") not in (None, "", "None"):
        label += f"-c{int(float(hook_params['chunk_size']))}"
    others = [f"{k}={v}" for k, v in sorted(hook_params.items()) if k != "chunk_size"]
    return " ".join([label] + others)


def _hook_param_names(hook: str) -> set[str] | None:
    try:
        import hooks

        spec = hooks.available().get(hook)
        return set(spec.params) if spec is not None else None
    except Exception:  # hooks library absent or different: fall back to the params list
        return None


def _trial_state(run) -> str:
    tag = run.data.tags.get("status")
    mlflow_status = run.info.status
    if mlflow_status == "RUNNING":
        return "running"
    if mlflow_status == "KILLED":
        return "killed"
    if mlflow_status == "FAILED":
        return "failed"
    if tag in ("ok", "nan", "failed"):
        return tag
    return "nan" if run.data.metrics.get("nan_detected", 0) >= 1 else "ok"


def load_sweep(reader, parent_run_id: str) -> Sweep:
    parent = reader.get_run(parent_run_id)
    config = reader.config_text(parent_run_id)
    sweep = Sweep(
        experiment=reader.experiment_name(parent.info.experiment_id),
        parent_run_id=parent_run_id,
        parent_name=parent.info.run_name or parent_run_id,
        parent_status=parent.info.status,
        started=datetime.fromtimestamp((parent.info.start_time or 0) / 1000, timezone.utc)
        .strftime("%Y-%m-%d %H:%M UTC"),
        tracking_uri=reader.tracking_uri,
        config_name=config[0] if config else None,
        config_text=config[1] if config else None,
        tolerance=float(parent.data.tags.get("target_tolerance", recommend.DEFAULT_TOLERANCE)),
    )
    for run in reader.child_runs(parent):
        params = run.data.params
        hook = params.get("hook") or (run.info.run_name or "?").split("-")[0]
        names = _hook_param_names(hook)
        hook_params = {k: v for k, v in params.items()
                       if (k in names if names is not None else k not in _TRIAL_PARAMS)
                       and k != "hook"}
        sweep.trials.append(Trial(
            run_id=run.info.run_id,
            run_name=run.info.run_name or run.info.run_id,
            hook=hook,
            hook_params=hook_params,
            world_size=int(float(params.get("world_size", 1))),
            seed=int(float(params.get("seed", 0))),
            state=_trial_state(run),
            error=run.data.tags.get("error"),
            nan_source=run.data.tags.get("nan_source"),
            metrics={k: v for k, v in run.data.metrics.items() if k in SUMMARY_METRICS},
            loss=reader.history(run.info.run_id, "loss"),
            eval_accuracy=reader.history(run.info.run_id, "eval_accuracy"),
            config=config_label(hook, hook_params, run.info.run_name or ""),
            eval_loss=reader.history(run.info.run_id, "eval_loss"),
            step_time_ms=reader.history(run.info.run_id, "step_time_ms"),
            link=link_label(params.get("link_gbps")),
        ))
    sweep.trials.sort(key=_trial_order)
    _time_to_target(sweep)
    return sweep


def link_label(link_gbps: str | None) -> str:
    """"1 Gbit/s" for a trial on an emulated link, "loopback" for one on this host's loopback."""
    if link_gbps in (None, "", "None"):
        return LOOPBACK
    return f"{float(link_gbps):g} Gbit/s"


def _time_to_target(sweep: Sweep) -> None:
    """Each trial's time to the target eval loss: the baseline's final eval loss at the same
    world size, link and seed, plus the sweep's tolerance (service.recommend)."""
    targets = {(t.world_size, t.link, t.seed): t.metric("final_eval_loss") * (1 + sweep.tolerance)
               for t in sweep.trials if t.config == BASELINE_HOOK and t.state == "ok"}
    for t in sweep.trials:
        target = targets.get((t.world_size, t.link, t.seed))
        if target is None or t.state != "ok" or not len(t.eval_loss[0]):
            continue
        t.time_to_target = recommend.time_to_target(*t.eval_loss, *t.step_time_ms, target)


def _config_order(hook: str, hook_params: dict[str, str]):
    chunk = hook_params.get("chunk_size")
    chunk_key = float(chunk) if chunk not in (None, "", "None") else -1.0
    return (hook != BASELINE_HOOK, hook, chunk_key, sorted(hook_params.items()))


def _trial_order(t: Trial):
    return (t.world_size, link_order(t.link), _config_order(t.hook, t.hook_params), t.seed)


def link_order(link: str) -> float:
    """Slowest link first, loopback last."""
    return math.inf if link == LOOPBACK else float(link.split()[0])


def curve_label(t: Trial) -> str:
    """A configuration's label in the plots: with its link when it ran on an emulated one."""
    return t.config if t.link == LOOPBACK else f"{t.config} @{t.link}"


def _mean_std(values: list[float]) -> tuple[float, float, int]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, 0
    return (float(np.mean(finite)), float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
            len(finite))


# --------------------------------------------------------------------------------------------
# The data the plots and tables are drawn from
# --------------------------------------------------------------------------------------------

@dataclass
class LossCurve:
    """One line of loss_curves.png: a configuration at a world size, over its seeds."""

    config: str
    hook: str
    chunk_size: int | None
    world_size: int
    run_ids: list[str]
    steps: np.ndarray              # every step at which some seed logged a finite loss
    mean: np.ndarray               # mean over the seeds with a finite loss at that step
    std: np.ndarray                # sample std over those seeds (0 where only one)
    count: np.ndarray              # how many seeds contribute at that step
    stops: list[tuple[str, int, float, str]]   # (run_id, step, loss there, "nan" | "failed")


def loss_curve_data(sweep: Sweep) -> dict[int, list[LossCurve]]:
    """Per world size, one LossCurve per configuration (seeds averaged, band = ±std)."""
    groups: dict[tuple[int, str], list[Trial]] = defaultdict(list)
    for t in sweep.trials:
        groups[(t.world_size, curve_label(t))].append(t)
    curves: dict[int, list[LossCurve]] = defaultdict(list)
    for (world_size, config), trials in groups.items():
        by_step: dict[int, list[float]] = defaultdict(list)
        stops = []
        for t in trials:
            steps, values = t.loss
            finite = np.isfinite(values)
            for s, v in zip(steps[finite], values[finite]):
                by_step[int(s)].append(float(v))
            if t.state in ("nan", "failed") and finite.any():
                last = int(np.flatnonzero(finite)[-1])
                stop = t.stop_step if t.state == "nan" else int(steps[last])
                stops.append((t.run_id, stop if stop is not None else int(steps[last]),
                              float(values[last]), t.state))
        ordered = sorted(by_step)
        curves[world_size].append(LossCurve(
            config=config, hook=trials[0].hook, chunk_size=trials[0].chunk_size,
            world_size=world_size, run_ids=[t.run_id for t in trials],
            steps=np.array(ordered, dtype=np.int64),
            mean=np.array([np.mean(by_step[s]) for s in ordered]),
            std=np.array([np.std(by_step[s], ddof=1) if len(by_step[s]) > 1 else 0.0
                          for s in ordered]),
            count=np.array([len(by_step[s]) for s in ordered], dtype=np.int64),
            stops=stops,
        ))
    for world_size in curves:
        curves[world_size].sort(key=lambda c: _config_order(c.hook, _params_of(sweep, c)))
    return dict(sorted(curves.items()))


def _params_of(sweep: Sweep, curve: LossCurve) -> dict[str, str]:
    return next(t.hook_params for t in sweep.trials if t.run_id == curve.run_ids[0])


@dataclass
class SummaryRow:
    """One configuration at one world size, over its seeds. Metrics average the trials that
    ended ok; `states` says what happened to the others."""

    config: str
    hook: str
    hook_params: dict[str, str]
    world_size: int
    seeds: list[int]
    states: dict[str, int]
    run_ids: list[str]
    stats: dict[str, tuple[float, float, int]]   # metric -> (mean, std, n); incl. loss_gap
    link: str = LOOPBACK

    @property
    def n_ok(self) -> int:
        return self.states.get("ok", 0)

    @property
    def all_ok(self) -> bool:
        return self.n_ok == sum(self.states.values())

    def mean(self, key: str) -> float:
        return self.stats.get(key, (math.nan, math.nan, 0))[0]

    def std(self, key: str) -> float:
        return self.stats.get(key, (math.nan, math.nan, 0))[1]


def summary_rows(sweep: Sweep) -> list[SummaryRow]:
    """The summary table: one row per (configuration, world size, link), plus `loss_gap` =
    final loss minus allreduce's at the same world size, link and seed (paired per seed, then
    averaged) and `time_to_target_s` (over the seeds that reached the target)."""
    baseline = {(t.world_size, t.link, t.seed): t.metric("final_loss") for t in sweep.trials
                if t.hook == BASELINE_HOOK and not t.hook_params and t.state == "ok"}
    groups: dict[tuple[int, str, str], list[Trial]] = defaultdict(list)
    for t in sweep.trials:
        groups[(t.world_size, t.link, t.config)].append(t)
    rows = []
    for (world_size, link, config), trials in groups.items():
        ok = [t for t in trials if t.state == "ok"]
        stats = {key: _mean_std([t.metric(key) for t in ok]) for key in SUMMARY_METRICS
                 if key not in ("nan_detected", "first_nan_step")}
        stats["loss_gap"] = _mean_std([t.metric("final_loss") - baseline[(world_size, link, t.seed)]
                                       for t in ok if (world_size, link, t.seed) in baseline])
        stats["time_to_target_s"] = _mean_std([t.time_to_target.seconds for t in ok
                                               if t.time_to_target and t.time_to_target.seconds is not None])
        stats["first_nan_step"] = _mean_std([t.metric("first_nan_step") for t in trials
                                             if t.state == "nan"])
        states: dict[str, int] = defaultdict(int)
        for t in trials:
            states[t.state] += 1
        rows.append(SummaryRow(config=config, hook=trials[0].hook,
                               hook_params=trials[0].hook_params, world_size=world_size,
                               seeds=sorted(t.seed for t in trials), states=dict(states),
                               run_ids=[t.run_id for t in trials], stats=stats, link=link))
    rows.sort(key=lambda r: (r.world_size, link_order(r.link), _config_order(r.hook, r.hook_params)))
    return rows


@dataclass
class ThroughputLine:
    config: str
    hook: str
    chunk_size: int | None
    world_sizes: list[int]
    mean: list[float]
    std: list[float]


def throughput_data(sweep: Sweep) -> list[ThroughputLine]:
    """samples/s against world size, one line per configuration (trials that ended ok)."""
    lines: dict[str, ThroughputLine] = {}
    for row in summary_rows(sweep):
        mean, std, n = row.stats["samples_per_s"]
        if n == 0:
            continue
        chunk = row.hook_params.get("chunk_size")
        label = row_label(row)
        line = lines.setdefault(label, ThroughputLine(
            label, row.hook, int(float(chunk)) if chunk not in (None, "", "None") else None,
            [], [], []))
        line.world_sizes.append(row.world_size)
        line.mean.append(mean)
        line.std.append(std)
    return list(lines.values())


@dataclass
class TradeoffPoint:
    config: str
    hook: str
    world_size: int
    bytes_per_step: float
    quality: float                 # eval accuracy (higher is better) or final loss (lower)
    quality_std: float
    on_front: bool = False
    chunk_size: int | None = None


def tradeoff_data(sweep: Sweep) -> tuple[str, dict[int, list[TradeoffPoint]]]:
    """(quality metric name, per world size the points of tradeoff.png with the Pareto front
    marked). Quality is final eval accuracy, or final loss when no trial logged accuracy.
    World size 1 is left out when larger ones exist: it sends nothing."""
    rows = summary_rows(sweep)
    metric = ("final_eval_accuracy" if any(r.stats["final_eval_accuracy"][2] for r in rows)
              else "final_loss")
    points: dict[int, list[TradeoffPoint]] = defaultdict(list)
    for row in rows:
        bytes_mean, _, n_bytes = row.stats["comm_bytes_per_step"]
        quality, quality_std, n_quality = row.stats[metric]
        if n_bytes and n_quality:
            chunk = row.hook_params.get("chunk_size")
            points[row.world_size].append(TradeoffPoint(
                row_label(row), row.hook, row.world_size, bytes_mean, quality, quality_std,
                chunk_size=int(float(chunk)) if chunk not in (None, "", "None") else None))
    if any(w > 1 for w in points):
        points.pop(1, None)
    better = (lambda a, b: a >= b) if metric == "final_eval_accuracy" else (lambda a, b: a <= b)
    for group in points.values():
        for p in group:
            p.on_front = not any(
                q is not p and q.bytes_per_step <= p.bytes_per_step and better(q.quality, p.quality)
                and (q.bytes_per_step < p.bytes_per_step or q.quality != p.quality)
                for q in group)
    return metric, dict(sorted(points.items()))


def row_label(row: SummaryRow) -> str:
    return row.config if row.link == LOOPBACK else f"{row.config} @{row.link}"


# --------------------------------------------------------------------------------------------
# Which configuration to use (the rule: service/recommend.py)
# --------------------------------------------------------------------------------------------

def recommendations(sweep: Sweep) -> list[recommend.Recommendation]:
    """Per (world size, link): service.recommend's answer over the sweep's configurations."""
    groups: dict[tuple[int, str], dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in sweep.trials:
        groups[(t.world_size, t.link)][t.config].append(t)
    out = []
    for (world_size, link) in sorted(groups, key=lambda k: (k[0], link_order(k[1]))):
        candidates = [_candidate(config, trials) for config, trials in groups[(world_size, link)].items()]
        out.append(recommend.recommend(world_size, link, candidates, sweep.tolerance))
    return out


def _candidate(config: str, trials: list[Trial]) -> recommend.Candidate:
    ok = [t for t in trials if t.state == "ok"]
    states: dict[str, int] = defaultdict(int)
    for t in trials:
        states[t.state] += 1
    return recommend.Candidate(
        config=config, hook=trials[0].hook, ok=len(ok) == len(trials),
        states=", ".join(f"{n} {s}" for s, n in sorted(states.items())) + f" of {len(trials)} trial(s)",
        final_eval_loss={t.seed: t.metric("final_eval_loss") for t in ok},
        time_to_target={t.seed: t.time_to_target for t in ok if t.time_to_target is not None},
        spread_s={t.seed: recommend.spread(t.time_to_target.seconds, _measured_ms(t))
                  for t in ok if t.time_to_target is not None and t.time_to_target.seconds is not None},
        samples_per_s=_mean_std([t.metric("samples_per_s") for t in ok])[0],
        bytes_per_step=_mean_std([t.metric("comm_bytes_per_step") for t in ok])[0],
    )


def _measured_ms(t: Trial) -> np.ndarray:
    """Step times without the first ones (warm-up: compilation, first bucket rebuild)."""
    ms = t.step_time_ms[1]
    return ms[min(5, len(ms) // 4):]


def headline(recs: list[recommend.Recommendation]) -> str:
    """The answer in a sentence: the choice at the largest world size that communicates, on
    the slowest link measured."""
    with_comm = [r for r in recs if r.world_size > 1] or recs
    if not with_comm:
        return "No trial has finished yet: nothing to recommend."
    top = max(with_comm, key=lambda r: (r.world_size, -link_order(r.link)))
    where = f"world size {top.world_size}" + ("" if top.link == LOOPBACK else f" on {top.link}")
    if top.choice is None:
        return f"At {where}: {top.reason}."
    return f"Use {top.choice.config} at {where}: {top.reason}."


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

_COLUMNS = [  # (header, metric, formatter of the mean, formatter of the std)
    ("time to target (s)", "time_to_target_s", lambda v: f"{v:.2f}", lambda v: f"{v:.2f}"),
    ("final eval loss", "final_eval_loss", lambda v: f"{v:.4g}", lambda v: f"{v:.2g}"),
    ("final loss", "final_loss", lambda v: f"{v:.4g}", lambda v: f"{v:.2g}"),
    (f"loss gap to {BASELINE_HOOK}", "loss_gap", lambda v: f"{v:+.3g}", lambda v: f"{v:.2g}"),
    ("eval accuracy", "final_eval_accuracy", lambda v: f"{v:.3f}", lambda v: f"{v:.3f}"),
    ("samples/s", "samples_per_s", lambda v: f"{v:,.0f}", lambda v: f"{v:,.0f}"),
    ("step ms (median)", "step_time_ms_median", lambda v: f"{v:.1f}", lambda v: f"{v:.1f}"),
    ("step ms IQR", "step_time_ms_iqr", lambda v: f"{v:.1f}", lambda v: f"{v:.1f}"),
    ("bytes/step", "comm_bytes_per_step", lambda v: _bytes(v), lambda v: _bytes(v)),
    ("compression", "compression_ratio", lambda v: f"{v:.2f}x", lambda v: f"{v:.2f}"),
    ("hook ms", "hook_time_ms", lambda v: f"{v:.2f}", lambda v: f"{v:.2f}"),
]


def _bytes(v: float) -> str:
    if not math.isfinite(v):
        return ""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"


def _cell(row: SummaryRow, metric: str, fmt, fmt_std) -> str:
    mean, std, n = row.stats.get(metric, (math.nan, math.nan, 0))
    if n == 0:
        return ""
    if metric == "loss_gap" and row.hook == BASELINE_HOOK and not row.hook_params:
        return "baseline"
    return fmt(mean) + (f" ± {fmt_std(std)}" if n > 1 and std > 0 else "")


def _states_text(row: SummaryRow) -> str:
    return ", ".join(f"{n} {s}" if n > 1 or len(row.states) > 1 else s
                     for s, n in sorted(row.states.items()))


_VERSUS = ["speed-up vs allreduce", "eval-loss gap vs allreduce (95% CI)",
           "speed-up vs best 16-bit", "eval-loss gap vs best 16-bit (95% CI)"]


def _versus_cells(c: recommend.Candidate | None, rec: recommend.Recommendation | None) -> list[str]:
    """Time-to-target speed-up and paired eval-loss gap against fp32 allreduce and the best
    16-bit hook of the same world size and link."""
    if c is None or rec is None:
        return [""] * 4
    cells = []
    for ref, gap in ((rec.baseline, c.gap), (rec.best_16bit, c.gap_16bit)):
        if ref is None:
            cells += ["", ""]
            continue
        speedup = (f"{ref.seconds / c.seconds:.2f}x" if math.isfinite(ref.seconds) and math.isfinite(c.seconds)
                   else "")
        cells += ["ref" if ref is c else speedup, "ref" if ref is c else (gap.text() if gap else "")]
    return cells


def table_cells(rows: list[SummaryRow], recs: list[recommend.Recommendation] | None = None
                ) -> tuple[list[str], list[list[str]]]:
    header = (["configuration", "world size", "link", "seeds", "status"] + [c[0] for c in _COLUMNS]
              + (_VERSUS if recs is not None else []))
    by_group = {(r.world_size, r.link): r for r in recs or []}
    body = []
    for r in rows:
        cells = ([r.config, str(r.world_size), r.link, str(len(r.seeds)), _states_text(r)]
                 + [_cell(r, metric, fmt, fmt_std) for _, metric, fmt, fmt_std in _COLUMNS])
        if recs is not None:
            rec = by_group.get((r.world_size, r.link))
            candidate = next((c for c in rec.candidates if c.config == r.config), None) if rec else None
            cells += _versus_cells(candidate, rec)
        body.append(cells)
    return header, body


def write_summary_csv(rows: list[SummaryRow], path: Path) -> None:
    """Machine-readable: every mean and std as its own column (empty when not recorded)."""
    metrics = [c[1] for c in _COLUMNS] + ["first_nan_step"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["configuration", "hook", "hook_params", "world_size", "link", "seeds", "trials",
                         "ok", "nan", "failed", "other"]
                        + [f"{m}_{s}" for m in metrics for s in ("mean", "std")])
        for r in rows:
            other = sum(n for s, n in r.states.items() if s not in ("ok", "nan", "failed"))
            values = []
            for m in metrics:
                mean, std, n = r.stats.get(m, (math.nan, math.nan, 0))
                values += [repr(mean) if n else "", repr(std) if n > 1 else ""]
            writer.writerow([r.config, r.hook,
                             ";".join(f"{k}={v}" for k, v in sorted(r.hook_params.items())),
                             r.world_size, r.link, " ".join(map(str, r.seeds)), len(r.run_ids),
                             r.states.get("ok", 0), r.states.get("nan", 0),
                             r.states.get("failed", 0), other] + values)


def summary_markdown(sweep: Sweep, rows: list[SummaryRow], recs: list[recommend.Recommendation]) -> str:
    header, body = table_cells(rows, recs)
    lines = [f"# Sweep `{sweep.experiment}` — parent run `{sweep.parent_run_id}`", "",
             f"**{headline(recs)}**", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
    lines += ["", f"Metrics average the trials that ended ok (mean ± std over seeds). "
              f"Loss gap = final loss minus {BASELINE_HOOK}'s at the same world size and seed. "
              f"{_RULE.format(tolerance=sweep.tolerance)}", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# report.html
# --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.88em;margin:.6em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;vertical-align:top}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
.meta{color:#555;font-size:.9em} .headline{font-size:1.2em;background:#eef7ee;
border-left:5px solid #2a8a2a;padding:.6em 1em} .warn{background:#fff4e0;
border-left:5px solid #e08a00;padding:.5em 1em} .st-nan,.st-failed{color:#b00020;font-weight:bold}
.st-running,.st-killed{color:#a06000} pre{background:#f6f6f6;padding:1em;overflow:auto}
img{max-width:100%;border:1px solid #eee} td.left{text-align:left} .pick{background:#eef7ee}
"""


def _img_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


_RULE = ("Time to target: training seconds (the sum of measured step times, eval excluded) until "
         "the eval loss first reaches allreduce's final eval loss at the same world size, link and "
         "seed plus {tolerance:.0%}. The recommendation ranks by that time among configurations whose "
         "every trial ended ok and whose paired eval-loss gap to allreduce has its 95% interval "
         "within +{tolerance:.0%}; then by throughput, then bytes. A configuration is called faster "
         "only by more than the spread of the times (step-time IQR, seed scatter); otherwise it is "
         "the same speed here and allreduce is kept.")


def render_html(sweep: Sweep, rows: list[SummaryRow], recs: list[recommend.Recommendation],
                images: dict[str, Path], quality_metric: str) -> str:
    e = html.escape
    states: dict[str, int] = defaultdict(int)
    for t in sweep.trials:
        states[t.state] += 1
    out = [f"<!doctype html><html><head><meta charset='utf-8'>"
           f"<title>Sweep report: {e(sweep.experiment)}</title><style>{_CSS}</style></head><body>",
           f"<h1>Sweep report: {e(sweep.experiment)}</h1>",
           f"<p class='meta'>parent run <code>{e(sweep.parent_run_id)}</code> "
           f"({e(sweep.parent_name)}, {e(sweep.parent_status)}), started {e(sweep.started)}; "
           f"{len(sweep.trials)} trial(s): "
           + ", ".join(f"{n} {e(s)}" for s, n in sorted(states.items()))
           + f"; MLflow store <code>{e(sweep.tracking_uri)}</code></p>"]
    if not sweep.complete:
        out.append("<p class='warn'>This sweep is not complete (still running, or interrupted):"
                   " the report shows the trials recorded so far. Rebuild it with "
                   f"<code>python -m service.report {e(sweep.parent_run_id)}</code>.</p>")

    out += ["<h2 id='recommendation'>Which configuration to use</h2>",
            f"<p class='headline'>{e(headline(recs))}</p>",
            "<table><tr><th>world size</th><th>link</th><th>use</th><th>why</th>"
            "<th>runner-up</th><th>avoid</th></tr>"]
    for r in recs:
        avoid = "<br>".join(f"{e(c)}: {e(why)}" for c, why in r.avoid) or "—"
        runner = e(r.runner_up.config) if r.runner_up is not None else "—"
        out.append(f"<tr><td>{r.world_size}</td><td>{e(r.link)}</td><td class='left'><b>"
                   f"{e(r.choice.config) if r.choice else '—'}</b></td>"
                   f"<td class='left'>{e(r.reason)}</td><td class='left'>{runner}</td>"
                   f"<td class='left'>{avoid}</td></tr>")
    out.append(f"</table><p class='meta'>{e(_RULE.format(tolerance=sweep.tolerance))} The parent "
               f"run carries the answer as tags <code>recommended.w&lt;W&gt;.&lt;link&gt;</code>.</p>")

    header, body = table_cells(rows, recs)
    picks = {(r.choice.config, r.world_size, r.link) for r in recs if r.choice is not None}
    out += ["<h2 id='summary'>Summary</h2><table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"]
    for row, cells in zip(rows, body):
        cls = " class='pick'" if (row.config, row.world_size, row.link) in picks else ""
        status_cls = "" if row.all_ok else f" class='st-{e(next(s for s in row.states if s != 'ok'))}'"
        out.append(f"<tr{cls}>" + "".join(
            f"<td{status_cls if i == 4 else ''}>{e(c)}</td>" for i, c in enumerate(cells))
            + "</tr>")
    out.append(f"</table><p class='meta'>Mean ± std over seeds of the trials that ended ok. Loss "
               f"gap: final loss minus {BASELINE_HOOK}'s at the same world size and seed. Speed-up: "
               f"the reference's time to target over this one's; eval-loss gap: relative, paired per "
               f"seed, mean with its 95% t-interval. Step ms IQR: the spread of the measured steps. "
               f"Highlighted: the recommended configuration per world size. Also in summary.csv "
               f"and summary.md.</p>")

    captions = {
        "loss_curves": "Training loss against step, one panel per world size; colour = hook, "
                       "line style = chunk size; bands = ±std over seeds; ✕ = trial went NaN "
                       "and stopped there, + = trial failed there.",
        "throughput": "Samples per second against world size, one line per configuration "
                      "(trials that ended ok; bars = ±std over seeds).",
        "tradeoff": f"{'Final eval accuracy' if quality_metric == 'final_eval_accuracy' else 'Final loss'}"
                    " against bytes per step on the wire (per rank). The line joins the Pareto "
                    "front: the configurations worth choosing; everything else is beaten on "
                    "both axes by one of them.",
    }
    for name, path in images.items():
        out += [f"<h2 id='{name}'>{e(name.replace('_', ' ').capitalize())}</h2>",
                _img_tag(path, name), f"<p class='meta'>{e(captions.get(name, ''))}</p>"]

    out += ["<h2 id='trials'>Trials</h2><table><tr><th>run</th><th>status</th><th>final loss</th>"
            "<th>eval accuracy</th><th>first NaN step</th><th>NaN source</th><th>error</th>"
            "<th>run id</th></tr>"]
    for t in sweep.trials:
        fl, acc, first = (t.metric("final_loss"), t.metric("final_eval_accuracy"),
                          t.metric("first_nan_step"))
        err = (t.error or "").strip().splitlines()
        out.append(
            f"<tr><td>{e(t.run_name)}</td><td class='st-{e(t.state)}'>{e(t.state)}</td>"
            f"<td>{'' if not math.isfinite(fl) else f'{fl:.4g}'}</td>"
            f"<td>{'' if not math.isfinite(acc) else f'{acc:.3f}'}</td>"
            f"<td>{'' if not math.isfinite(first) else int(first)}</td>"
            f"<td class='left'>{e(t.nan_source or '')}</td>"
            f"<td class='left'>{e(err[-1][:200] if err else '')}</td>"
            f"<td class='left'><code>{e(t.run_id)}</code></td></tr>")
    out.append("</table>")

    out.append("<h2 id='config'>Sweep config</h2>")
    if sweep.config_text is not None:
        out.append(f"<p class='meta'>{e(sweep.config_name or '')}, as attached to the parent run"
                   f"</p><pre>{e(sweep.config_text)}</pre>")
    else:
        out.append("<p class='meta'>The parent run holds no config file.</p>")
    if sweep.tracking_uri.startswith("sqlite:"):
        out.append("<p class='meta'>The trials in the MLflow UI: <code>mlflow ui "
                   f"--backend-store-uri {e(sweep.tracking_uri)}</code>, experiment "
                   f"<code>{e(sweep.experiment)}</code> (docs/results.md walks through it).</p>")
    out.append(f"<p class='meta'>Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} by "
               f"<code>python -m service.report {e(sweep.parent_run_id)}</code> from MLflow alone."
               "</p></body></html>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------

def build_report(parent_run_id: str, tracking_uri: str | None = None, out_dir: Path | None = None,
                 attach: bool = True) -> Path:
    """Write every report file for the sweep whose parent run is `parent_run_id` into
    `out_dir` (default results/report-<id8>), attach them to the parent run when `attach`,
    and return the path of report.html. Raises ReportError for problems the user can fix."""
    from service import plots, projection

    from service.tracking import StoreError

    reader = open_store(tracking_uri)
    try:
        parent_run_id = reader.resolve_parent(parent_run_id)
    except StoreError as e:
        raise ReportError(str(e)) from None
    sweep = load_sweep(reader, parent_run_id)
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
    projections = projection.project(sweep)  # hooks.cost at W = 8, 64, 512 (service/projection.py)
    projected = projection.plot(projections, out_dir / projection.IMAGE, title=sweep.experiment)
    if projections:  # trials from before the accounting was logged: the table says so, no plot
        images["projected_throughput"] = projected
    write_summary_csv(rows, out_dir / "summary.csv")
    (out_dir / "summary.md").write_text(summary_markdown(sweep, rows, recs)
                                        + projection.markdown(projections))
    report = out_dir / "report.html"
    report.write_text(render_html(sweep, rows, recs, images, quality_metric).replace(
        "<h2 id='trials'>", projection.html_section(projections) + "\n<h2 id='trials'>", 1))
    if attach:
        try:
            record_answer(reader, sweep, recs)
            reader.attach(parent_run_id, [out_dir / name for name in REPORT_FILES])
        except Exception as e:
            raise ReportError(f"report written to {out_dir}, but attaching it to run "
                              f"{parent_run_id} failed: {str(e).splitlines()[0]}") from None
    return report


def record_answer(reader, sweep: Sweep, recs: list[recommend.Recommendation]) -> None:
    """Into MLflow: each trial's time_to_target_s (absent when never reached) and
    time_to_target_interpolated, and on the parent run the answer per world size and link as
    tags recommended.w{W}.{link} = configuration, so the UI shows it without the report."""
    for t in sweep.trials:
        if t.time_to_target is not None and t.time_to_target.seconds is not None:
            reader.record(t.run_id, metrics={
                "time_to_target_s": t.time_to_target.seconds,
                "time_to_target_interpolated": float(t.time_to_target.interpolated)})
    tags = {r.key: r.choice.config for r in recs if r.choice is not None}
    tags["target_tolerance"] = repr(sweep.tolerance)
    reader.record(sweep.parent_run_id, tags=tags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m service.report",
        description="Rebuild a sweep's report from MLflow alone: loss_curves.png, throughput.png, "
                    "tradeoff.png, summary.csv, summary.md and a self-contained report.html with "
                    "a 'which configuration to use' section. Works for finished, running and "
                    "interrupted sweeps.",
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


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.exit(main())
