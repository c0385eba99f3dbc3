"""The sweep as data: trial records read from MLflow, aggregated into the typed rows every plot,
table and recommendation is drawn from (tests compare these with what MLflow holds).

    open_store()      service.tracking.SweepReader (service/tracking/ is the only MLflow package)
    load_sweep()      -> Sweep: the parent run and one Trial per trial record, histories included
    *_data(), summary_rows(), recommendations()   the numbers of the plots, tables and answer

Everything comes from what the sweep recorded (service/tracking/'s contract): one parent run
per sweep, one nested child run per trial carrying its identity as tags (tracking.TrialRecord),
step metrics ``loss``, ``eval_loss``, ``eval_accuracy``, ``step_time_ms``, summary metrics
``samples_per_s``, ``comm_bytes_per_step``, ...; tag ``status`` (ok | nan | failed). So a report
can be rebuilt for a finished sweep, one still running, or one that was interrupted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from service import hook_facts
from service.answer import links, recommend
from service.answer.recommend import BASELINE_CONFIGS, BASELINE_HOOK, LOOPBACK
from service.answer.sequential import Rule

if TYPE_CHECKING:  # service.tracking imports mlflow: only when a sweep is read
    from service.tracking import TrialRecord

SUMMARY_METRICS = (
    "samples_per_s", "step_time_ms_median", "step_time_ms_iqr", "comm_bytes_per_step",
    "compression_ratio", "hook_time_ms", "final_loss", "final_eval_loss", "final_eval_accuracy",
    "nan_detected", "first_nan_step", "step_ratio_vs_baseline", "step_ratio_vs_baseline_iqr",
    "load_avg_1m", "cpu_share", "syncs", "sync_ms", "replica_drift",
    "reduce_scatter_bytes_per_step", "all_gather_bytes_per_step", "memory_per_rank_mb",
)
_HISTORIES = ("loss", "eval_accuracy", "eval_loss", "step_time_ms")
_EMPTY = (np.array([], dtype=np.int64), np.array([], dtype=np.float64))


class ReportError(Exception):
    """A problem the user can fix (unknown id, unreachable store): printed as one line."""


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
    """One trial: its record (identity, status, logged metrics) and its step-metric histories."""

    record: TrialRecord
    loss: tuple[np.ndarray, np.ndarray] = _EMPTY
    eval_accuracy: tuple[np.ndarray, np.ndarray] = _EMPTY
    eval_loss: tuple[np.ndarray, np.ndarray] = _EMPTY
    step_time_ms: tuple[np.ndarray, np.ndarray] = _EMPTY
    time_to_target: recommend.TimeToTarget | None = None   # set by load_sweep
    timing: Trial | None = None    # a split network sweep's trial: its link's timing run (links.py)

    run_id = property(lambda self: self.record.run_id)
    run_name = property(lambda self: self.record.run_name)
    hook = property(lambda self: self.record.hook)
    hook_params = property(lambda self: self.record.hook_params)
    world_size = property(lambda self: self.record.world_size)
    seed = property(lambda self: self.record.seed)
    config = property(lambda self: self.record.config)   # one label per configuration
    state = property(lambda self: links.state(self.record.state, self.timing))  # ok | nan | failed | killed | running
    error = property(lambda self: self.record.tags.get("error"))
    nan_source = property(lambda self: self.record.tags.get("nan_source"))
    # compiled its model (torch.compile): compared with compiled allreduce, its cell's baseline
    compiled = property(lambda self: bool(self.record.knobs.get("compile", False)))
    is_baseline = property(lambda self: self.hook == BASELINE_HOOK and self.config in BASELINE_CONFIGS)

    @property
    def link(self) -> str:
        """"1 Gbit/s" for a trial on an emulated link ("1 Gbit/s at 0.2 cores/host" on hosts with
        their own CPU share, network.host_cpus: a trial's speed is its hosts' as much as its
        link's), "loopback" for one on this host's loopback. (No comma: it is in tag names.)"""
        record = (self.timing or self).record
        if record.link_gbps is None:
            return LOOPBACK
        cpus = record.metrics.get("host_cpus")
        return f"{record.link_gbps:g} Gbit/s" + (f" at {cpus:g} cores/host" if cpus else "")

    @property
    def chunk_size(self) -> int | None:
        return hook_facts.chunk_size(self.hook, self.hook_params)

    def metric(self, key: str) -> float:
        """A summary metric as logged (latest value); NaN when never logged. A joined trial's
        speed metrics are its timing run's (links.from_quality_run)."""
        record = self.record if self.timing is None or links.from_quality_run(key) else self.timing.record
        return record.metrics.get(key, math.nan)

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
    runs: list[Trial] = field(default_factory=list)   # one per MLflow run where trials are joined (links.py)
    tolerance: float = recommend.DEFAULT_TOLERANCE   # report.target_tolerance of the config
    rule: Rule = Rule()            # the gaps' interval: a fixed grid's, or the adaptive seeds' schedule

    @property
    def world_sizes(self) -> list[int]:
        return sorted({t.world_size for t in self.trials})

    @property
    def complete(self) -> bool:
        return (self.parent_status == "FINISHED"
                and all(t.state in ("ok", "nan", "failed") for t in self.trials))


def load_sweep(reader, parent_run_id: str) -> Sweep:
    """The sweep of ``parent_run_id`` from ``reader`` (a tracking.SweepReader); ReportError for
    a sweep it cannot read."""
    from service import tracking

    parent = reader.get_run(parent_run_id)
    config = reader.config_text(parent_run_id)
    try:
        records = reader.trials(parent_run_id)
    except tracking.StoreError as e:
        raise ReportError(str(e)) from None
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
        rule=sequential_rule(parent.data.tags),
        runs=[Trial(r, **{key: reader.history(r.run_id, key) for key in _HISTORIES}) for r in records],
    )
    sweep.trials = links.joined(sweep.runs)
    sweep.trials.sort(key=_trial_order)
    _time_to_target(sweep)
    return sweep


def sequential_rule(tags: dict[str, str]) -> Rule:
    """The parent run's seeds_min / seeds_max tags (an adaptive sweep's seed range) as the
    rule its gaps are judged by; a sweep without them ran a fixed grid."""
    try:
        return Rule(int(tags["seeds_min"]), int(tags["seeds_max"]))
    except (KeyError, ValueError):
        return Rule()


def baselines(trials: list[Trial]) -> dict[tuple, Trial]:
    """(world size, link, compiled, seed) -> the finished trial that cell's figures are against:
    plain allreduce, or where none ran (a sweep of fsdp alone) allreduce under fsdp, as
    recommend.cell_baseline takes it."""
    out: dict[tuple, Trial] = {}
    for t in trials:
        key = (t.world_size, t.link, t.compiled, t.seed)
        if t.state == "ok" and (t.is_baseline or (t.config == recommend.FSDP_BASELINE and key not in out)):
            out[key] = t
    return out


def _time_to_target(sweep: Sweep) -> None:
    """Each trial's time to the target eval loss: the baseline's final eval loss at the same
    world size, link, seed (and compiled or not), plus the sweep's tolerance (service/answer/recommend.py)."""
    targets = {key: t.metric("final_eval_loss") * (1 + sweep.tolerance) for key, t in baselines(sweep.trials).items()}
    for t in sweep.trials:
        target = targets.get((t.world_size, t.link, t.compiled, t.seed))
        if target is None or t.state != "ok" or not len(t.eval_loss[0]):
            continue
        t.time_to_target = recommend.time_to_target(*t.eval_loss, *links.timed_steps(t), target)


def config_order(hook: str, hook_params: dict):
    """allreduce first, then by hook, chunk size, the other parameters (as text: any type)."""
    chunk = hook_facts.chunk_size(hook, hook_params)
    return (hook != BASELINE_HOOK, hook, -1 if chunk is None else chunk,
            sorted((k, str(v)) for k, v in hook_params.items()))


def _trial_order(t: Trial):
    return (t.world_size, link_order(t.link), config_order(t.hook, t.hook_params), t.seed)


def link_order(link: str) -> float:
    """Slowest link first, loopback last."""
    return math.inf if link == LOOPBACK else float(link.split()[0])


def with_link(config: str, link: str) -> str:
    """A configuration's label in plots: with its link when it ran on an emulated one."""
    return config if link == LOOPBACK else f"{config} @{link}"


def mean_std(values: list[float]) -> tuple[float, float, int]:
    """(mean, sample std, count) of the finite values; (nan, nan, 0) where none is."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, 0
    return (float(np.mean(finite)), float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0,
            len(finite))


# --------------------------------------------------------------------------------------------
# The data the plots and tables are drawn from
# --------------------------------------------------------------------------------------------

@dataclass
class SummaryRow:
    """One configuration at one world size, over its seeds. Metrics average the trials that
    ended ok; `states` says what happened to the others."""

    config: str
    hook: str
    hook_params: dict
    world_size: int
    seeds: list[int]
    states: dict[str, int]
    run_ids: list[str]
    stats: dict[str, tuple[float, float, int]]   # metric -> (mean, std, n); incl. loss_gap
    link: str = LOOPBACK
    compiled: bool = False   # its trials compiled their model: its verdict is against compiled allreduce

    @property
    def n_ok(self) -> int:
        return self.states.get("ok", 0)

    @property
    def all_ok(self) -> bool:
        return self.n_ok == sum(self.states.values())

    @property
    def chunk_size(self) -> int | None:
        return hook_facts.chunk_size(self.hook, self.hook_params)

    def mean(self, key: str) -> float:
        return self.stats.get(key, (math.nan, math.nan, 0))[0]

    def std(self, key: str) -> float:
        return self.stats.get(key, (math.nan, math.nan, 0))[1]


def summary_rows(sweep: Sweep) -> list[SummaryRow]:
    """The summary table: one row per (configuration, world size, link), plus `loss_gap` =
    final loss minus allreduce's (compiled allreduce's, for compiled trials) at the same world
    size, link and seed (paired per seed, then averaged) and `time_to_target_s` (over the seeds
    that reached the target)."""
    baseline = {key: t.metric("final_loss") for key, t in baselines(sweep.trials).items()}
    groups: dict[tuple[int, str, str], list[Trial]] = defaultdict(list)
    for t in sweep.trials:
        groups[(t.world_size, t.link, t.config)].append(t)
    rows = []
    for (world_size, link, config), trials in groups.items():
        ok, compiled = [t for t in trials if t.state == "ok"], trials[0].compiled
        stats = {key: mean_std([t.metric(key) for t in ok]) for key in SUMMARY_METRICS
                 if key not in ("nan_detected", "first_nan_step")}
        stats["loss_gap"] = mean_std([t.metric("final_loss") - baseline[(world_size, link, compiled, t.seed)]
                                       for t in ok if (world_size, link, compiled, t.seed) in baseline])
        stats["time_to_target_s"] = mean_std([t.time_to_target.seconds for t in ok
                                               if t.time_to_target and t.time_to_target.seconds is not None])
        stats["first_nan_step"] = mean_std([t.metric("first_nan_step") for t in trials
                                             if t.state == "nan"])
        states: dict[str, int] = defaultdict(int)
        for t in trials:
            states[t.state] += 1
        rows.append(SummaryRow(config=config, hook=trials[0].hook,
                               hook_params=trials[0].hook_params, world_size=world_size,
                               seeds=sorted(t.seed for t in trials), states=dict(states),
                               run_ids=[t.run_id for t in trials], stats=stats, link=link, compiled=compiled))
    rows.sort(key=lambda r: (r.world_size, link_order(r.link), config_order(r.hook, r.hook_params)))
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
        label = with_link(row.config, row.link)
        line = lines.setdefault(label, ThroughputLine(label, row.hook, row.chunk_size, [], [], []))
        line.world_sizes.append(row.world_size)
        line.mean.append(mean)
        line.std.append(std)
    return list(lines.values())


# --------------------------------------------------------------------------------------------
# Which configuration to use (the rule: service/answer/recommend.py)
# --------------------------------------------------------------------------------------------

def recommendations(sweep: Sweep) -> list[recommend.Recommendation]:
    """Per (world size, link, compiled or not): recommend.recommend's answer over the sweep's
    configurations; compiled trials are compared with compiled allreduce, eager with eager."""
    groups: dict[tuple[int, str, bool], dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in sweep.trials:
        groups[(t.world_size, t.link, t.compiled)][t.config].append(t)
    out = []
    for (world_size, link, compiled) in sorted(groups, key=lambda k: (k[0], link_order(k[1]), k[2])):
        candidates = [_candidate(config, trials) for config, trials in groups[(world_size, link, compiled)].items()]
        out.append(recommend.recommend(world_size, link, candidates, sweep.tolerance, sweep.rule, compiled))
    return out


def _candidate(config: str, trials: list[Trial]) -> recommend.Candidate:
    ok = [t for t in trials if t.state == "ok"]
    states: dict[str, int] = defaultdict(int)
    for t in trials:
        states[t.state] += 1
    return recommend.Candidate(
        config=config, hook=trials[0].hook, ok=len(ok) == len(trials),
        states=", ".join(f"{n} {s}" for s, n in sorted(states.items())) + f" of {len(trials)} trial(s)",
        state_counts=dict(states),
        final_eval_loss={t.seed: t.metric("final_eval_loss") for t in ok},
        time_to_target={t.seed: t.time_to_target for t in ok if t.time_to_target is not None},
        spread_s={t.seed: recommend.spread(t.time_to_target.seconds, links.measured_ms(t))
                  for t in ok if t.time_to_target is not None and t.time_to_target.seconds is not None},
        step_ratio=_finite_by_seed(ok, "step_ratio_vs_baseline"),
        step_ratio_iqr=_finite_by_seed(ok, "step_ratio_vs_baseline_iqr"),
        load_avg=mean_std([t.metric("load_avg_1m") for t in ok])[0],
        samples_per_s=mean_std([t.metric("samples_per_s") for t in ok])[0],
        bytes_per_step=mean_std([t.metric("comm_bytes_per_step") for t in ok])[0],
        parallelism=trials[0].record.parallelism,
    )


def _finite_by_seed(trials: list[Trial], metric: str) -> dict[int, float]:
    return {t.seed: t.metric(metric) for t in trials if math.isfinite(t.metric(metric))}

