"""Which configuration to use: time to target quality, paired quality gaps with confidence
intervals over seeds, and the ranking the report states.

Users pick a hook to finish training sooner at the quality they already get. So, per world
size and link:

1. **Target.** The baseline (fp32 ``allreduce``) trial's final eval loss at the same world
   size, link and seed, times ``1 + tolerance``.
2. **Time to target** of a trial: the training time (the sum of its measured step times; eval
   is not in them) until its eval loss first reaches the target. Between two evals the
   crossing step is interpolated linearly in eval loss, and the time at that step linearly in
   the cumulated step times (``TimeToTarget.interpolated`` says so); a target met at the first
   eval is dated there (an upper bound).
3. **Quality** of a configuration: its final eval loss relative to the baseline's, paired per
   seed, as a mean with a t-interval over seeds (95% for a fixed grid of seeds; the sequential
   rule's level when seeds were added adaptively: service/answer/sequential.py). Its verdict:
   *matches* when the interval's upper end is within ``+tolerance``, *worse* when its lower end
   is beyond it, *undecided* otherwise, *nan* / *failed* when a trial went NaN or failed; with
   one seed the gap itself decides and the verdict says it is a single-seed one.
4. **Ranking** among configurations whose every trial ended ok, matched, and reached the
   target in every seed (undecided ones are *open*, shown worse ones *avoid*): mean time to target, then throughput, then bytes per step. A
   configuration is called faster than another only when the difference exceeds the spread of
   the two times (:func:`spread`); otherwise they run at the same speed here. The answer is
   decided by the one rule of every answer, measured or projected (service/step_model/pairs.py's
   ``rule``): the fastest when it beats every other that way; else, where the baseline is among
   those it cannot be told from, "keep the baseline".

Everything here is pure data (no MLflow, no plotting): service.report feeds it trials.
"""

from __future__ import annotations


import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

import hooks
from service import hook_facts
from service.config.limits import DEFAULT_TARGET_TOLERANCE
from service.config.trial import COMPILED, FSDP
from service.step_model import pairs
from service.step_model.pairs import PairCall
from service.answer.time_to_target import TimeToTarget, spread, time_to_target  # noqa: F401 (re-exported)
from service.answer.sequential import MAX_SEEDS_TO_SUGGEST, Rule, Verdict, seeds_to_decide, verdict

BASELINE_HOOK = hooks.BASELINE
# plain allreduce's labels, eager and compiled (search.compile): a compiled cell's baseline is the compiled one
BASELINE_CONFIGS = (BASELINE_HOOK, f"{BASELINE_HOOK}-{COMPILED}")
# what an fsdp trial's paired windows time (service/train/paired_timing.py): FSDP's own fp32 comms
FSDP_BASELINE = f"{BASELINE_HOOK}-{FSDP}"
DEFAULT_TOLERANCE = DEFAULT_TARGET_TOLERANCE
LOOPBACK = "loopback"


# --------------------------------------------------------------------------------------------
# Paired quality gaps


@dataclass(frozen=True)
class Gap:
    """A configuration's final eval loss relative to a reference's, paired per seed."""

    mean: float                # mean relative gap (+0.02: 2% higher loss than the reference)
    low: float                 # the rule's t-interval; equal to mean with one seed
    high: float
    seeds: int
    sd: float = 0.0            # sample std of the per-seed gaps

    @property
    def single_seed(self) -> bool:
        return self.seeds == 1

    def matches(self, tolerance: float) -> bool:
        return self.high <= tolerance

    def verdict(self, tolerance: float) -> Verdict:
        """matches / worse / undecided (one seed: the gap itself decides)."""
        return verdict(self.low, self.high, tolerance)

    def text(self) -> str:
        if self.seeds == 1:
            return f"{self.mean:+.2%} (1 seed)"
        return f"{self.mean:+.2%} [{self.low:+.2%}, {self.high:+.2%}] ({self.seeds} seeds)"


def paired_gap(values: dict[int, float], reference: dict[int, float], rule: Rule = Rule()) -> Gap | None:
    """The mean relative gap over the seeds both have, with the rule's t-interval (a fixed
    grid's: 95%)."""
    gaps = [(values[s] - reference[s]) / abs(reference[s]) for s in sorted(set(values) & set(reference))
            if math.isfinite(values[s]) and math.isfinite(reference[s]) and reference[s] != 0]
    if not gaps:
        return None
    mean = statistics.fmean(gaps)
    if len(gaps) == 1:
        return Gap(mean, mean, mean, 1)
    sd = statistics.stdev(gaps)
    half = rule.quantile(len(gaps)) * sd / math.sqrt(len(gaps))
    return Gap(mean, mean - half, mean + half, len(gaps), sd)


# --------------------------------------------------------------------------------------------
# Ranking


@dataclass
class Candidate:
    """One configuration at one (world size, link): its trials' outcomes, by seed."""

    config: str
    hook: str
    ok: bool                                   # every trial ended ok
    states: str                                # e.g. "2 ok" / "1 nan, 1 ok"
    final_eval_loss: dict[int, float]          # seed -> final eval loss
    time_to_target: dict[int, TimeToTarget]    # seed -> when it reached the target
    spread_s: dict[int, float]                 # seed -> spread of that time
    samples_per_s: float
    bytes_per_step: float
    step_ratio: dict[int, float] = field(default_factory=dict)      # seed -> paired step time / baseline's
    step_ratio_iqr: dict[int, float] = field(default_factory=dict)  # seed -> its spread over the windows
    load_avg: float = math.nan                 # the machine's mean 1-minute load average over its trials
    state_counts: dict[str, int] = field(default_factory=dict)   # ok / nan / failed / ... -> trials
    gap: Gap | None = None                     # vs the fp32 baseline
    gap_16bit: Gap | None = None               # vs the best 16-bit hook
    verdict: Verdict = Verdict.UNDECIDED       # quality vs the baseline (set by recommend)
    paired_seconds: dict[int, float] | None = None   # seed -> time to target from the paired ratio
    parallelism: str = "ddp"                   # ddp | fsdp: what its paired windows timed it against

    @property
    def is_baseline(self) -> bool:
        """Plain allreduce (compiled in a compiled cell): what this cell's verdicts are against."""
        return self.hook == BASELINE_HOOK and self.config in BASELINE_CONFIGS

    @property
    def reached_every_seed(self) -> bool:
        return bool(self.time_to_target) and all(t.seconds is not None for t in self.time_to_target.values())

    @property
    def seeds(self) -> frozenset[int]:
        """The seeds this configuration has a time to target for (reached or not)."""
        return frozenset(self.time_to_target)

    @property
    def seconds(self) -> float:
        """Mean time to target over its own seeds (inf when some seed never reached it): paired
        with the baseline's step time when the trials timed it (:func:`pair_with_baseline`). A
        comparison with another configuration uses :meth:`seconds_on` their common seeds."""
        return self.seconds_on(self.seeds)

    def _times(self, seeds) -> list[float] | None:
        """Time to target at each of ``seeds`` (paired where timed); None if one never reached it."""
        if not seeds or any(s not in self.time_to_target or self.time_to_target[s].seconds is None for s in seeds):
            return None
        if self.paired_seconds is not None and all(s in self.paired_seconds for s in seeds):
            return [self.paired_seconds[s] for s in sorted(seeds)]
        return [self.time_to_target[s].seconds for s in sorted(seeds)]

    def seconds_on(self, seeds) -> float:
        """Mean time to target over ``seeds`` (inf: a seed never reached it, or none given)."""
        times = self._times(seeds)
        return statistics.fmean(times) if times else math.inf

    @property
    def seconds_spread(self) -> float:
        return self.spread_on(self.seeds)

    def spread_on(self, seeds) -> float:
        """The spread of the mean time over ``seeds``: step-time noise (paired: the ratio's
        spread over its windows), and the seeds' own scatter."""
        times = self._times(seeds)
        if not times:
            return 0.0
        if self.paired_seconds is not None and all(s in self.paired_seconds for s in seeds):
            noise = statistics.fmean(self.paired_seconds[s] * self.step_ratio_iqr.get(s, 0.0) / self.step_ratio[s]
                                     for s in seeds)
        else:
            noise = statistics.fmean(self.spread_s[s] for s in seeds if s in self.spread_s) if any(
                s in self.spread_s for s in seeds) else 0.0
        scatter = statistics.stdev(times) if len(times) > 1 else 0.0
        return max(noise, scatter)

    @property
    def interpolated(self) -> bool:
        return any(t.interpolated for t in self.time_to_target.values())


def pair_with_baseline(c: Candidate, baseline: Candidate) -> None:
    """Time to target from the paired step ratio: the candidate's crossing step times its step
    time measured against the baseline's in the same trial (service/train/paired_timing.py), in
    the baseline trial's seconds per step at that seed. The machine's load while each trial
    ran cancels out of the ratio; it would not out of two trials' own step times."""
    if c is baseline or not c.reached_every_seed or not baseline.reached_every_seed:
        return
    per_step = {s: t.seconds / t.step for s, t in baseline.time_to_target.items() if t.step}
    seeds = c.time_to_target.keys()
    if all(s in c.step_ratio and s in per_step for s in seeds):
        c.paired_seconds = {s: c.time_to_target[s].step * c.step_ratio[s] * per_step[s] for s in seeds}


def cell_baseline(candidates: list[Candidate]) -> Candidate | None:
    """What a cell's verdicts are against: plain allreduce (compiled in a compiled cell); in a cell
    without it (a sweep of fsdp alone, for a model one rank cannot hold), allreduce under fsdp,
    which takes DDP allreduce's losses to float rounding (tests/test_fsdp_training.py)."""
    return (next((c for c in candidates if c.is_baseline), None)
            or next((c for c in candidates if c.config == FSDP_BASELINE), None))


def timing_baseline(c: Candidate, baseline: Candidate | None, candidates: list[Candidate]) -> Candidate | None:
    """The configuration ``c``'s paired windows ran beside it: the cell's baseline for a ddp
    trial, FSDP's own fp32 comms (allreduce under fsdp) for an fsdp trial, like with like (None:
    not in the cell)."""
    if c.parallelism != FSDP:
        return baseline
    return next((x for x in candidates if x.config == FSDP_BASELINE), None)


def common_seeds(a: Candidate, b: Candidate) -> frozenset[int]:
    """The seeds both configurations ran: the only ones a comparison of the two uses (a seed
    one of them ran alone ran at another time, under whatever load the machine had then)."""
    return a.seeds & b.seeds


def faster(a: Candidate, b: Candidate) -> bool:
    """Is ``a`` faster to the target than ``b`` by more than their spread, on their common seeds?"""
    seeds = common_seeds(a, b)
    return b.seconds_on(seeds) - a.seconds_on(seeds) > max(a.spread_on(seeds), b.spread_on(seeds))


def speedup(c: Candidate, ref: Candidate) -> float:
    """``ref``'s time to target over ``c``'s, both on their common seeds (nan: no common seed
    where both reached the target)."""
    seeds = common_seeds(c, ref)
    mine, theirs = c.seconds_on(seeds), ref.seconds_on(seeds)
    return theirs / mine if math.isfinite(mine) and math.isfinite(theirs) and mine > 0 else math.nan


def _rank_key(c: Candidate, baseline: Candidate | None) -> tuple:
    """Fastest first: by the speed-up against the baseline on the seeds each shares with it (so
    no configuration is ranked on seeds another did not run), then its own mean time."""
    if baseline is not None:
        up = 1.0 if c is baseline else speedup(c, baseline)
        return (-up if math.isfinite(up) else math.inf, c.seconds, -_finite(c.samples_per_s), c.bytes_per_step)
    return (0.0, c.seconds, -_finite(c.samples_per_s), c.bytes_per_step)


@dataclass
class Recommendation:
    world_size: int
    link: str
    choice: Candidate | None
    runner_up: Candidate | None
    baseline: Candidate | None
    best_16bit: Candidate | None
    reason: str
    ranked: list[Candidate] = field(default_factory=list)   # eligible, best first
    candidates: list[Candidate] = field(default_factory=list)  # all, as given
    avoid: list[tuple[str, str]] = field(default_factory=list)  # (config, why): shown bad
    open: list[tuple[str, str]] = field(default_factory=list)   # (config, why undecided and what decides)
    single_seed: bool = False
    compiled: bool = False   # the cell's trials compiled their model (torch.compile): compared among themselves
    decided: bool = False    # the choice beat every other beyond their pair's spread (step_model.pairs.rule)
    margin: float = 0.0      # the choice's lead over the runner-up (runner-up's time / the choice's - 1)
    error: float = 0.0       # the lead the fastest needed over the runner-up to be told apart from it
    decides: dict[str, str] = field(default_factory=dict)   # an open config -> what would decide it

    @property
    def key(self) -> str:
        """The MLflow parent-run tag naming the answer: recommended.w{W}.{link}[.compiled]."""
        return f"recommended.w{self.world_size}.{tag_safe(self.link)}" + (f".{COMPILED}" if self.compiled else "")


def tag_safe(link: str) -> str:
    return link.replace(" ", "").replace("/", "per")


def recommend(world_size: int, link: str, candidates: Iterable[Candidate],
              tolerance: float = DEFAULT_TOLERANCE, rule: Rule = Rule(), compiled: bool = False) -> Recommendation:
    """Rank the candidates of one (world size, link, compiled or not) as the module doc says;
    ``rule`` sets the gaps' interval (service/answer/sequential.py)."""
    candidates = list(candidates)
    baseline = cell_baseline(candidates)
    for c in candidates:
        timed_against = timing_baseline(c, baseline, candidates)
        if timed_against is not None:
            pair_with_baseline(c, timed_against)
    sixteen = [c for c in candidates if hook_facts.sixteen_bit(c.hook) and c.ok]
    best_16bit = min(sixteen, key=lambda c: _rank_key(c, baseline), default=None)
    for c in candidates:
        c.gap = paired_gap(c.final_eval_loss, baseline.final_eval_loss, rule) if baseline else None
        c.gap_16bit = paired_gap(c.final_eval_loss, best_16bit.final_eval_loss, rule) if best_16bit else None
        c.verdict = quality_verdict(c, tolerance, baseline)
    eligible, avoid, open_, deciding = [], [], [], {}
    for c in candidates:
        if c.verdict in (Verdict.NAN, Verdict.FAILED):
            avoid.append((c.config, c.states))
        elif c.verdict is Verdict.WORSE:
            avoid.append((c.config, f"final eval loss {c.gap.text()} vs {baseline.config}, beyond the "
                                    f"{tolerance:.0%} tolerance"))
        elif c.verdict is Verdict.UNDECIDED:
            why, decides = _open_reason(c, tolerance, baseline, rule)
            open_.append((c.config, why))
            deciding[c.config] = decides
        elif c.time_to_target and not c.reached_every_seed:
            never = [s for s, t in sorted(c.time_to_target.items()) if t.seconds is None]
            avoid.append((c.config, f"never reached the target eval loss (seed {', '.join(map(str, never))})"))
        else:
            eligible.append(c)
    ranked = sorted(eligible, key=lambda c: _rank_key(c, baseline))
    single = any(c.gap is not None and c.gap.single_seed for c in candidates)
    rec = Recommendation(world_size, link, None, None, baseline, best_16bit, "", ranked, candidates,
                         avoid, open_, single, compiled, decides=deciding)
    if not ranked:
        rec.reason = "no configuration finished cleanly at a quality matching the baseline"
        return rec
    by_config = {c.config: c for c in ranked}
    d = pairs.rule(list(by_config), lambda a, b: measured_call(by_config[a], by_config[b]),
             baseline.config if baseline in ranked else None)
    rec.choice, rec.runner_up = by_config[d.winner], by_config.get(d.runner_up)
    rec.decided, rec.margin, rec.error = d.decided, d.margin, d.error
    rec.reason = _reason(rec, tolerance)
    return rec


def measured_call(a: Candidate, b: Candidate) -> PairCall:
    """a against b as measured, on their common seeds: the margin of a's time to target over b's,
    and the error it must beat, the larger of the two times' spreads (:func:`faster`)."""
    seeds = common_seeds(a, b)
    mine, theirs = a.seconds_on(seeds), b.seconds_on(seeds)
    if not math.isfinite(mine) or mine <= 0:
        return PairCall(0.0, math.inf)
    if not math.isfinite(theirs):
        return PairCall(math.inf, 0.0)
    return PairCall(theirs / mine - 1.0, max(a.spread_on(seeds), b.spread_on(seeds)) / mine)


def quality_verdict(c: Candidate, tolerance: float, baseline: Candidate | None = None) -> Verdict:
    """The candidate's verdict from its trials' states and its gap to ``baseline`` (the cell's)."""
    if c.state_counts.get("nan"):
        return Verdict.NAN
    if c.state_counts.get("failed") or (not c.ok and not c.state_counts):
        return Verdict.FAILED
    if not c.ok:  # trials still running or killed: not decided yet
        return Verdict.UNDECIDED
    if c is baseline:
        return Verdict.BASELINE
    return c.gap.verdict(tolerance) if c.gap is not None else Verdict.UNDECIDED


def _open_reason(c: Candidate, tolerance: float, baseline: Candidate | None, rule: Rule = Rule()) -> tuple[str, str]:
    """Why a candidate is undecided, and what would decide it (seeds beyond those it ran, under
    the sweep's own interval rule): (the whole reason, what decides it)."""
    if not c.ok:
        return f"{c.states}: not every trial has finished; rerun with --resume", "rerun with --resume"
    if c.gap is None:
        run = f"run {BASELINE_HOOK} at its seeds"
        return f"no seed paired with a finished {BASELINE_HOOK} trial: {run}", run
    needed = seeds_to_decide(c.gap.mean, c.gap.sd, tolerance, rule, c.gap.seeds)
    decide = (f"about {needed} seeds in all ({needed - c.gap.seeds} more) at this scatter would decide it"
              if needed is not None
              else f"more than {MAX_SEEDS_TO_SUGGEST} seeds at this scatter would: its mean is too "
                   f"close to the tolerance for seeds to decide it")
    return f"final eval loss {c.gap.text()} vs {baseline.config} holds +{tolerance:.0%}; {decide}", decide


LOAD_RATIO = 1.5   # trials whose load averages differ more than this ran on a differently busy machine


def _uneven_load(c: Candidate, base: Candidate | None) -> str:
    """A warning when the choice's and the baseline's trials ran under very different load."""
    if base is None or c is base or not (math.isfinite(c.load_avg) and math.isfinite(base.load_avg)):
        return ""
    low, high = sorted((c.load_avg, base.load_avg))
    if high < 1.0 or high < LOAD_RATIO * low:
        return ""
    judged = ("the speed-up is the paired ratio, which that load cancels out of" if c.paired_seconds is not None
              else "their own step times compare the machine's load as much as the hooks")
    return (f"{c.config}'s and {base.config}'s trials ran under different load (load average "
            f"{c.load_avg:.1f} vs {base.load_avg:.1f}): {judged}")


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -math.inf


def _time(c: Candidate) -> str:
    return f"{c.seconds:.2f} s" if math.isfinite(c.seconds) else "—"


def _on_seeds(a: Candidate, b: Candidate) -> str:
    """', seeds 0, 1' when the two ran different seeds: the comparison used only the common ones."""
    seeds = common_seeds(a, b)
    return "" if a.seeds == b.seeds else f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))}"


def _versus(a: Candidate, b: Candidate, verb: str) -> str:
    """'took 1.20 s vs 1.00 s' over the seeds both ran."""
    seeds = common_seeds(a, b)
    x, y = a.seconds_on(seeds), b.seconds_on(seeds)
    if not (math.isfinite(x) and math.isfinite(y)):
        return f"{verb} {_time(a)} vs {_time(b)}"
    return f"{verb} {x:.2f} s vs {y:.2f} s{_on_seeds(a, b)}"


def _speedup_text(c: Candidate, ref: Candidate, what: str) -> str:
    """'1.67x faster than allreduce (1.00 s vs 1.67 s)', on the seeds both ran."""
    up = speedup(c, ref)
    if not math.isfinite(up):
        return f"{ref.config} never reached the target on a seed {c.config} ran"
    seeds = common_seeds(c, ref)
    return f"{up:.2f}x {what} ({ref.seconds_on(seeds):.2f} s{_on_seeds(c, ref)})"


def _reason(rec: Recommendation, tolerance: float) -> str:
    c, runner, base = rec.choice, rec.runner_up, rec.baseline
    where = (f"on {rec.link}" if rec.link != LOOPBACK
             else "on loopback (this machine's ranks share one host: the answer holds only here)")
    if not math.isfinite(c.seconds):
        return (f"no trial logged an eval loss to time the target by; {c.config} has the highest "
                f"throughput {where}")
    parts = []
    if c is base:
        parts.append(f"nothing reached the target faster at equal quality {where}")
        if runner is not None:
            same = not faster(runner, c) and not faster(c, runner)
            parts.append(f"runner-up {runner.config} {_versus(runner, c, 'took')}"
                         + (" (the same speed here: within the step-time spread)" if same else ""))
    else:
        parts.append(f"reaches the target eval loss in {_time(c)} {where}")
        if base is not None:
            parts.append(_speedup_text(c, base, f"faster than {base.config}"))
        if rec.best_16bit is not None and rec.best_16bit is not c:
            parts.append(_speedup_text(c, rec.best_16bit, f"vs {rec.best_16bit.config}"))
        if runner is not None:
            up = speedup(c, runner)
            parts.append(f"runner-up {runner.config} ({up - 1:+.0%}{_on_seeds(c, runner)})" if math.isfinite(up)
                         else f"runner-up {runner.config}")
        if c.gap is not None:
            parts.append(f"quality gap {c.gap.text()}")
    if rec.single_seed:
        parts.append("single-seed verdict: run more seeds to trust the quality comparison")
    if any(x.interpolated for x in rec.ranked[:2]):
        parts.append("times interpolated between evals (eval_every > 1)")
    uneven = _uneven_load(c, base)
    if uneven:
        parts.append(uneven)
    return "; ".join(parts)
