"""The report's per-bucket plan for ``report.cluster``: designed from the sweep's step timelines
(service/step_model/planner.py) among the configurations whose quality matched the baseline's,
shown beside the best uniform configuration with the sentence a user pastes into
``search.hooks`` to prove it by a trial. Designed, not trained: the sweep has not measured it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Optional

from hooks.plan import NAME as PLAN
from hooks.registry import spec
from service.report.projection import Basis
from service.report.recommend import BASELINE_HOOK
from service.step_model.bands import ErrorBands, error_bands
from service.step_model.pairs import Configured, PairBands, pair_bands
from service.step_model.planner import Plan, design, layout
from service.step_model.price import Cell, CellRefused
from service.step_model.transport import TransportFit
from service.step_model.trial import TrialTimeline

HEADING = "A per-bucket plan for W={w} on {gbps:g} Gbit/s ({source})"


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
        band = pairs.between(Configured(b.hook, b.error_feedback), Configured(base.hook, base.error_feedback),
                             world_size, bands)
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


def markdown(a: Optional[PlanAnswer], cell=None, source: str = "report.cluster",
             cluster_winner: Optional[str] = None) -> list[str]:
    """The section's lines for summary.md (nothing without a cell: report.cluster or search.plan's);
    ``cluster_winner``: the configuration the cluster's answer names at this same cell, if any."""
    if a is None:
        return []
    heading = HEADING.format(w=cell.world_size, gbps=cell.link_gbps, source=source) if cell else "A per-bucket plan"
    lines = [f"### {heading}", ""]
    if a.plan is None:
        return lines + [f"No plan: {a.why_not}.", ""]
    p = a.plan
    lines += ["| bucket | MB (fp32) | configuration |", "|---|---:|---|"]
    lines += [f"| {i} | {4 * n / 1e6:.2f} | {c} |" for i, (n, c) in enumerate(zip(a.numels, p.choices))]
    rule = f"searched: {p.searched}; {_margin_rule(a)}"
    pricing = pricing_sentence(p.choices[0] if p.is_uniform else p.uniform, cluster_winner)
    if p.is_uniform:
        same = "" if p.choices[0] == BASELINE_HOOK else f"; {BASELINE_HOOK} everywhere {_priced(a, (BASELINE_HOOK,), p.baseline_step_ms)}"
        return lines + ["", f"No per-bucket plan beats a uniform configuration here: {_why_uniform(a)}; "
                            f"projected step {_priced(a, p.choices, p.step_ms)}{same} ({rule}). {pricing}", ""]
    mine, theirs = a.time_to_target_s(p.choices, p.step_ms), a.time_to_target_s((p.uniform,), p.uniform_step_ms)
    ttt = ("" if mine is None or theirs is None else
           f" Time to target {mine:.3g} s against {theirs:.3g} s, assuming the plan crosses at the slowest "
           "crossing step of the configurations it mixes (a trial of it measures its own).")
    lines += ["", f"Projected step {p.step_ms:.3g} ms against {p.uniform_step_ms:.3g} ms for {p.uniform} "
                  f"everywhere: {p.gain_pct:+.1f} % shorter; {BASELINE_HOOK} everywhere {p.baseline_step_ms:.3g} ms "
                  f"({rule}).{ttt} {pricing}", ""]
    if a.trained is None:
        return lines + ["Designed from the timelines, not yet trained. To prove it by a trial, add to "
                        f"search.hooks: `{hook_entry(a)}` (or set search.plan to train it in a last round).", ""]
    return lines + [_trained_text(a, cell), ""]


def _priced(a: PlanAnswer, choices: tuple[str, ...], step_ms: float) -> str:
    """'59 ms, time to target 5.9 s' (the step alone where a configuration it runs never crossed)."""
    seconds = a.time_to_target_s(choices, step_ms) if a.crossings else None
    return f"{step_ms:.3g} ms" + ("" if seconds is None else f", time to target {seconds:.3g} s")


def pricing_sentence(pick: str, cluster_winner: Optional[str]) -> str:
    """The one sentence that says why this section's figures are not the cluster's answer's, and
    whether the two name the same configuration: a plan mixes buckets on one backward pass, so
    it prices every configuration with the baseline's compute and by its step; the cluster's
    answer (the headline's, the projection table's, the map's) prices each with its own trials'
    compute, what the error bands were measured on, and ranks by time to target."""
    how = (f"a plan mixes buckets on one backward pass, so here every configuration is priced with "
           f"{BASELINE_HOOK}'s compute and compared by its step, where the projection prices each with its own "
           "trials' compute (the backward as its hook slowed it on this machine, what its error band was "
           "measured on) and ranks by time to target")
    if cluster_winner is None:
        return f"Why these figures are not the projection table's: {how}."
    if cluster_winner == pick:
        return f"Why these figures are not those of the cluster's answer above, which names {pick} too: {how}."
    return f"The cluster's answer above names {cluster_winner}, this section {pick}: {how}."


def _trained_text(a: PlanAnswer, cell) -> str:
    """What the plan's own trials showed: quality, and the step measured where the cell is this machine's."""
    t, p = a.trained, a.plan
    quality = "matched" if t.matches else "did not match (its verdict is in the table above)"
    where = f"W={t.quality_world_size}" + ("" if cell is None or cell.world_size == t.quality_world_size
                                            else f" (the quality W={cell.world_size} assumes)")
    text = f"Proven by a trial: {t.config} trained at the baseline's seeds; its quality {quality} {BASELINE_HOOK}'s at {where}."
    own = "" if t.projected_own_ms is None else f", {t.projected_own_ms:.3g} ms from its own timeline"
    if t.measured_ms is None or t.uniform_measured_ms is None:
        return text + (f" The cell is not one this machine measured: projected {p.step_ms:.3g} ms as designed{own}.")
    gain = 100.0 * (1.0 - t.measured_ms / t.uniform_measured_ms)
    return text + (f" Measured here at the cell: step {t.measured_ms:.3g} ms against {t.uniform_measured_ms:.3g} ms for "
                   f"{p.uniform} everywhere ({gain:+.1f} % shorter); projected {p.step_ms:.3g} ms as designed{own} "
                   f"(error {100.0 * (p.step_ms / t.measured_ms - 1):+.1f} %).")


def _margin_rule(a: PlanAnswer) -> str:
    """The band rule with each candidate's margin."""
    each = ", ".join(f"{c} {m:.1f} %" for c, m in sorted((a.margins or {}).items()))
    return (f"a bucket leaves {BASELINE_HOOK} only where it saves more of the step than the spread of the model's "
            f"error on its configuration's step over {BASELINE_HOOK}'s at this W ({each or 'none measured'})")


def _why_uniform(a: PlanAnswer) -> str:
    choice = a.plan.choices[0]
    if len(a.numels) == 1:
        return f"the model has one bucket ({choice})"
    if choice == BASELINE_HOOK:
        return f"compressing no bucket saves more than its margin ({choice} everywhere)"
    return f"every bucket's communication is exposed ({choice} everywhere)"


def html_parts(lines: list[str]) -> Optional[dict]:
    """The section's markdown lines as the HTML report draws them: heading, the bucket table,
    paragraphs (None: no section)."""
    if not lines:
        return None
    table = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    return {"heading": lines[0].lstrip("# "), "header": table[0] if table else [],
            "rows": [r for r in table[2:]], "paragraphs": [line.replace("`", "") for line in lines[1:]
                                                        if line and not line.startswith("|")]}
