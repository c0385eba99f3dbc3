"""The per-bucket plan for a cell, designed from the sweep's step timelines
(service/step_model/planner.py) among the configurations whose quality matched the baseline's:
one more candidate under the answer's rule (decision.py). The sweep's plan round trains it
(service/sweep/plan_round.py); the report renders it (service/report/plan_section.py)."""


from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Optional

from hooks.plan import NAME as PLAN
from hooks.registry import spec
from service.answer.projection import Basis
from service.answer.recommend import BASELINE_HOOK
from service.step_model.bands import ErrorBands, error_bands
from service.step_model.pairs import PairBands, pair_bands
from service.step_model.planner import Plan, design, layout
from service.step_model.price import Cell, CellRefused
from service.step_model.transport import TransportFit
from service.step_model.trial import TrialTimeline



@dataclass(frozen=True)
class PlanAnswer:
    """What the section says: the plan (None where none could be designed) and why not."""

    plan: Optional[Plan] = None
    numels: tuple[int, ...] = ()
    configs: Optional[dict[str, dict]] = None   # configuration -> its hook entry for search.hooks
    margins: Optional[dict[str, float]] = None   # configuration -> its ratio band's width at the cell's W, %
    why_not: str = ""
    crossings: Optional[dict[str, Optional[float]]] = None   # configuration -> its crossing step at the cluster's W
    trained: Optional["TrainedPlan"] = None   # the plan as the sweep's plan round trained it (search.plan)

    def time_to_target_s(self, choices: tuple[str, ...], step_ms: float) -> Optional[float]:
        """Seconds to the target at the slowest crossing step of the configurations ``choices``
        mixes (an assumption until a trial measures the plan); None where one never crossed."""
        steps = [self.crossings[c] for c in set(choices)]
        return None if any(s is None for s in steps) else max(steps) * step_ms / 1000.0


def _representative(basis: Basis, cell: Cell) -> TrialTimeline:
    """The seed whose step priced at ``cell`` is the (lower) median of the basis's seeds: the
    one the cluster's answer stands on (a seed's compute fit is noisy, and priced at another
    batch the seeds of one configuration can differ by a fifth)."""
    def priced(t: TrialTimeline) -> float:
        try:
            return t.price(basis.global_batch, cell.world_size, cell.link_gbps, cell.latency_s, cell.transport).step_ms
        except CellRefused:
            return t.own_step_ms()

    ranked = sorted(basis.timelines, key=priced)
    return ranked[(len(ranked) - 1) // 2]


def _entry(basis: Basis, timeline: TrialTimeline) -> dict:
    """The configuration as a search.hooks entry: its hook and the parameters off their defaults."""
    defaults = spec(basis.hook).params
    params = {k: v for k, v in timeline.timeline.hook_params.items() if k in defaults and v != defaults[k]}
    return {"name": basis.hook, **params}


@dataclass(frozen=True)
class TrainedPlan:
    """The designed plan's own trials (the plan round's): its configuration label, its quality at
    the cell's W, and at the cell where this machine measured it (its W and emulated link) the
    measured median step of it and of the best uniform configuration; its own timeline priced at
    the cell."""

    config: str
    matches: bool
    quality_world_size: int                    # where its quality was measured (the cell's W, else its largest)
    projected_own_ms: Optional[float]          # its trials' timelines priced at the cell (median)
    measured_ms: Optional[float] = None        # None: the cell is not one this machine measured
    uniform_measured_ms: Optional[float] = None


def plan_params(a: PlanAnswer) -> dict:
    """The plan's full hook parameters (as a trial of it records them)."""
    import hooks
    from service.config import HookEntry

    entry = HookEntry.model_validate(plan_entry(a))
    return dict(hooks.validate(entry.name, **entry.combos()[0]))


def measured_steps(trials: list, cell) -> dict[str, float]:
    """Per configuration, the median over its ok trials at ``cell``'s W and emulated link of their
    median step (ms): what this machine measured there (none where the cell is not a link it ran)."""
    steps: dict[str, list[float]] = {}
    for t in trials:
        gbps = (t.timing or t).record.link_gbps
        if t.state == "ok" and t.world_size == cell.world_size and gbps is not None and gbps == cell.link_gbps:
            steps.setdefault(t.config, []).append(t.metric("step_time_ms_median"))
    return {c: statistics.median(v) for c, v in steps.items()}


def _trained(a: PlanAnswer, bases: list[Basis], cell: Cell, measured: dict[str, float]) -> Optional[TrainedPlan]:
    """The designed plan's trials among ``bases`` (by its hook parameters), None where it has none."""
    params = plan_params(a)
    mine = next((b for b in bases if b.hook == PLAN and b.timelines
                 and b.timelines[0].timeline.hook_params == params), None)
    if mine is None:
        return None
    try:
        own = statistics.median(t.price(mine.global_batch, cell.world_size, cell.link_gbps, cell.latency_s,
                                        cell.transport).step_ms for t in mine.timelines)
    except CellRefused:
        own = None
    quality = mine.quality_at(cell.world_size)
    return TrainedPlan(mine.config, quality.matches, quality.world_size, own, measured.get(mine.config),
                       measured.get(a.plan.uniform))


def _margins(chosen: list[Basis], base: Basis, world_size: int, bands: ErrorBands, pairs: PairBands) -> dict[str, float]:
    """Per configuration, the width of the model's error on its step over the baseline's at
    ``world_size`` (its measured pair band; unmeasured, the two absolute bands composed): what a
    bucket it runs must save before it leaves the baseline. The width, not the low end the
    map's rule reads: the pair bands were measured on whole steps of one hook, so their bias says
    nothing of one bucket swapped, their spread does."""
    margins = {}
    for b in chosen:
        if b is base:
            continue
        band = pairs.between(b.configured, base.configured, world_size, bands)
        margins[b.config] = band.high_pct - band.low_pct
    return margins


def answer(bases: list[Basis], cluster, transport: Optional[TransportFit] = None,
           bands: Optional[ErrorBands] = None, measured: Optional[dict[str, float]] = None,
           pairs: Optional[PairBands] = None) -> Optional[PlanAnswer]:
    """The plan at ``cluster`` (None without one): candidates are the baseline and every
    configuration that matched its quality at the cluster's W, measured at the baseline's W."""
    if cluster is None:
        return None
    base = next((b for b in bases if b.config == BASELINE_HOOK), None)
    if base is None:
        return PlanAnswer(why_not=f"the sweep has no {BASELINE_HOOK} timeline to plan against")
    # a plan trained by the sweep's plan round is not a candidate of the next plan
    chosen = [b for b in bases if b.config == BASELINE_HOOK or
              (b.hook != PLAN and b.quality_at(cluster.world_size).matches
               and b.timeline_world_size == base.timeline_world_size)]
    cell = Cell(cluster.world_size, cluster.link_gbps, cluster.latency_ms / 1000.0, transport)
    options = {b.config: _representative(b, cell) for b in chosen}
    if len(options) < 2:
        return PlanAnswer(why_not=f"no configuration matched {BASELINE_HOOK}'s quality at W={cluster.world_size} "
                                  "(a plan mixes only those that did; more seeds or a wider report.target_tolerance "
                                  "can decide the undecided)")
    same = {c: t for c, t in options.items() if layout(t.timeline) == layout(options[BASELINE_HOOK].timeline)}
    if len(same) < 2:
        return PlanAnswer(why_not="no configuration that matched the baseline's quality recorded the same buckets")
    margins = _margins([b for b in chosen if b.config in same], base, cluster.world_size,
                       bands or error_bands(), pair_bands() if pairs is None else pairs)
    baseline = same[BASELINE_HOOK]
    compute = baseline.compute
    if compute is None:
        return PlanAnswer(why_not=f"{BASELINE_HOOK}'s trials measured no compute at a second batch size")
    try:
        plan = design(BASELINE_HOOK, {c: t.timeline for c, t in same.items()}, compute, base.global_batch, cell, margins)
    except (CellRefused, ValueError) as exc:
        return PlanAnswer(why_not=str(exc))
    entries = {c: _entry(next(b for b in chosen if b.config == c), t) for c, t in same.items()}
    crossings = {b.config: b.quality_at(cluster.world_size).crossing_step for b in chosen}
    a = PlanAnswer(plan, layout(baseline.timeline), entries, margins=margins, crossings=crossings)
    if plan.is_uniform:
        return a
    return replace(a, trained=_trained(a, bases, cell, measured or {}))


def plan_entry(a: PlanAnswer) -> dict:
    """The plan as a search.hooks entry: the plan hook, the most common choice its default and
    every other bucket by index (a uniform plan: that configuration's own entry)."""
    default = statistics.mode(a.plan.choices)
    buckets = {i: a.configs[c] for i, c in enumerate(a.plan.choices) if c != default}
    return {"name": PLAN, "buckets": buckets, "default": a.configs[default]} if buckets else a.configs[default]


def hook_entry(a: PlanAnswer) -> str:
    """The plan as a search.hooks entry (flow YAML)."""
    def flow(value) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
        return str(value).lower() if isinstance(value, bool) else str(value)

    return flow(plan_entry(a))
