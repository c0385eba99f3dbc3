"""Adaptive seeds (``search.seed: {min: 2, max: 5}``): which trials run next, from the quality
verdicts so far. Pure planning, no Ray: service/sweep/searcher.py feeds it Tune's
results.

Round 1 runs every configuration at the first ``min`` seeds. Each later round adds the next
seed, per (world size, link, compiled or not), to every configuration whose verdict against the baseline is still
``undecided`` — and to the baseline, so every comparison stays paired — until no verdict is
undecided or the configurations have ``max`` seeds. The verdicts are the report's own
(service.answer.recommend with the sequential rule of service/answer/sequential.py), computed
from the outcomes of the rounds planned so far only, so replaying the outcomes of an
interrupted sweep (``--resume``) plans the same rounds again.

A split network sweep's timing runs (TrialSpec.kind, one per configuration, world size and link,
at the first seed) run in round 1 and never decide a verdict: quality is the quality runs'.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from service.config import TrialSpec
from service.answer import recommend
from service.answer.sequential import Rule, Verdict


@dataclass(frozen=True)
class Outcome:
    """How a trial ended, as far as its verdict goes."""

    state: str                 # ok | nan | failed
    final_eval_loss: float = math.nan


def _group(t: TrialSpec) -> tuple[int, float | None, bool]:
    """The trial's cell: its world size, link and whether it compiled (compared among themselves)."""
    return t.world_size, t.link_gbps, t.compile


class SeedRounds:
    """The rounds of one adaptive sweep over ``grid`` (every configuration at every seed from
    0 to max - 1, in run order: SweepConfig.trials())."""

    def __init__(self, grid: list[TrialSpec], min_seeds: int, max_seeds: int, tolerance: float):
        self.rule = Rule(min_seeds, max_seeds)
        self.tolerance = tolerance
        self._grid = grid
        self._planned: list[TrialSpec] = []
        self.round = 0                         # rounds planned so far

    @property
    def planned(self) -> list[TrialSpec]:
        """Every trial of the rounds planned so far, in run order."""
        return list(self._planned)

    def plan(self, outcomes: dict[str, Outcome]) -> list[TrialSpec]:
        """The next round's trials (``[]``: the sweep is done). ``outcomes`` by trial key; only
        those of the rounds planned so far count."""
        if self.round == 0:
            seed_count = self.rule.min_seeds
            chosen = {t.config_label + repr(_group(t)) for t in self._grid}
        else:
            seed_count = self.rule.min_seeds + self.round
            if seed_count > self.rule.max_seeds:
                return []
            chosen = {name + repr(group) for group, name in self._to_continue(outcomes)}
        new_seed = seed_count - 1
        trials = [t for t in self._grid if t.config_label + repr(_group(t)) in chosen
                  and (t.seed == new_seed if self.round else t.seed < seed_count)]
        if not trials:
            return []
        self.round += 1
        self._planned += trials
        return trials

    def verdicts(self, outcomes: dict[str, Outcome]) -> dict[tuple, dict[str, Verdict]]:
        """Per (world size, link, compiled): each configuration's verdict from the planned rounds."""
        groups: dict[tuple, dict[str, list[TrialSpec]]] = defaultdict(lambda: defaultdict(list))
        for t in self._planned:
            if t.kind != "timing":  # a few steps' loss says nothing of the quality
                groups[_group(t)][t.config_label].append(t)
        out = {}
        for group, configs in groups.items():
            candidates = [_candidate(name, trials, outcomes) for name, trials in configs.items()]
            recommend.recommend(group[0], str(group[1]), candidates, self.tolerance, self.rule, compiled=group[2])
            out[group] = {c.config: c.verdict for c in candidates}
        return out

    def _to_continue(self, outcomes: dict[str, Outcome]) -> list[tuple[tuple, str]]:
        """(group, configuration) pairs that get the next seed: the undecided ones, and the
        baseline of a group that has any (a group whose baseline broke cannot pair: it stops)."""
        chosen = []
        for group, verdicts in self.verdicts(outcomes).items():
            baseline = next((name for name, v in verdicts.items() if v is Verdict.BASELINE), None)
            undecided = [name for name, v in verdicts.items() if v is Verdict.UNDECIDED]
            if undecided and baseline is not None:
                chosen += [(group, name) for name in undecided + [baseline]]
        return chosen

    def range_text(self) -> str:
        """'8 to 20 trials' for --dry-run: every configuration at min seeds, to all at max (a
        split network sweep's timing runs, one seed each, in both)."""
        timing = sum(t.kind == "timing" for t in self._grid)
        low = (len(self._grid) - timing) // self.rule.max_seeds * self.rule.min_seeds + timing
        return f"{low} to {len(self._grid)} trials"


def left_to_run(rounds: SeedRounds, done: dict[str, Outcome]) -> list[TrialSpec]:
    """The trials the rounds would still run after ``done`` (the SeedSearcher's replay: rounds are
    planned over the outcomes until one has a trial not yet done); ``[]``: the sweep is complete."""
    while True:
        planned = rounds.plan(done)
        if not planned:
            return []
        missing = [t for t in planned if t.key not in done]
        if missing:
            return missing


def _candidate(name: str, trials: list[TrialSpec], outcomes: dict[str, Outcome]) -> recommend.Candidate:
    """The planned trials of one configuration as a recommend.Candidate (quality only)."""
    ended = {t.seed: outcomes[t.key] for t in trials if t.key in outcomes}
    counts: dict[str, int] = defaultdict(int)
    for o in ended.values():
        counts[o.state] += 1
    counts["running"] += len(trials) - len(ended)
    counts = {k: v for k, v in counts.items() if v}
    return recommend.Candidate(
        config=name, hook=trials[0].hook, ok=counts.get("ok", 0) == len(trials),
        states=", ".join(f"{n} {s}" for s, n in sorted(counts.items())), state_counts=counts,
        final_eval_loss={s: o.final_eval_loss for s, o in ended.items() if o.state == "ok"},
        time_to_target={}, spread_s={}, samples_per_s=math.nan, bytes_per_step=math.nan)
