"""When is a configuration's quality decided? Three verdicts from its paired eval-loss gap, and
the sequential rule that keeps them honest when seeds are added until they decide.

A configuration's per-seed gaps to the baseline give a t-interval. Against the tolerance:

- ``matches``: the interval's upper end is within ``+tolerance``;
- ``worse``: its lower end is beyond ``+tolerance`` (shown worse);
- ``undecided``: the interval holds ``+tolerance`` (no evidence either way).

**The error budget.** A one-look 95% two-sided interval wrongly says ``matches`` at most 2.5%
of the time for a configuration whose true gap is exactly the tolerance (and ``worse`` at most
2.5% of the time for one exactly at it from below). Looking after every added seed and
stopping as soon as the interval clears gives that many more chances to be wrong (4 looks at
95%: about 6.7% false ``matches``, tests/test_sequential.py). So the rule *spends* the 2.5%
over the looks it may take, in proportion to the information each brings (Lan-DeMets' linear
spending in the information fraction n / max): a sweep with seeds from ``min`` to ``max``
spends 2.5% * min / max at its first look and 2.5% / max at each look after it. By the union
bound the chance that *any* look says ``matches`` wrongly is at most 2.5%, whatever the looks'
correlation. A fixed grid of seeds (one look) keeps the plain 95% interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

ALPHA = 0.025          # per side: the one-sided error of a single-look 95% two-sided interval
MAX_SEEDS_TO_SUGGEST = 30


class Verdict(str, Enum):
    """A configuration's quality against the baseline (its value is what summary.csv holds)."""

    MATCHES = "matches"
    WORSE = "worse"
    UNDECIDED = "undecided"
    NAN = "nan"            # some trial went NaN
    FAILED = "failed"      # some trial failed
    BASELINE = "baseline"  # the reference itself

    @property
    def decided(self) -> bool:
        """No more seeds would change it."""
        return self is not Verdict.UNDECIDED


@dataclass(frozen=True)
class Rule:
    """The alpha-spending schedule of a sweep whose configurations are looked at with
    ``min_seeds`` to ``max_seeds`` seeds (equal: a fixed grid, one look)."""

    min_seeds: int = 1
    max_seeds: int = 1
    alpha: float = ALPHA

    @property
    def looks(self) -> int:
        return max(1, self.max_seeds - self.min_seeds + 1)

    def alpha_at(self, seeds: int) -> float:
        """The one-sided level the look at ``seeds`` seeds spends: the first look the share of
        the seeds it has, each later one the share of the seed it adds. (Spending little early,
        as a schedule growing with the look number does, leaves the first look with a t of one
        degree of freedom at a tiny level: at 2 of 2-3 seeds t = 38; docs/performance.md.)"""
        n = min(max(seeds, self.min_seeds), self.max_seeds)
        return self.alpha * (self.min_seeds if n == self.min_seeds else 1) / self.max_seeds

    def quantile(self, seeds: int) -> float:
        """The t quantile of the interval at ``seeds`` seeds (``seeds`` >= 2)."""
        from scipy.stats import t  # scipy comes with scikit-learn

        return float(t.ppf(1 - self.alpha_at(seeds), seeds - 1))

    def text(self) -> str:
        """The rule in plain words, for --dry-run and the report."""
        if self.looks == 1:
            return (f"each configuration's eval-loss gap to the baseline gets a {1 - 2 * self.alpha:.0%} "
                    f"t-interval over its seeds")
        spent = ", ".join(f"{100 * self.alpha_at(n):.2g}%"
                          for n in range(self.min_seeds, self.max_seeds + 1))
        return (f"after {self.min_seeds} seeds, and after each seed added, a configuration's eval-loss "
                f"gap interval is looked at; the {100 * self.alpha:.1f}% chance (per side) of a wrong "
                f"verdict is split over the {self.looks} looks by the seeds each adds ({spent} at "
                f"{self.min_seeds} to {self.max_seeds} seeds), so stopping when it clears keeps false 'matches' at most "
                f"{100 * self.alpha:.1f}%")


def verdict(low: float, high: float, tolerance: float) -> Verdict:
    """``matches`` / ``worse`` / ``undecided`` of an interval against ``+tolerance``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return Verdict.UNDECIDED
    if high <= tolerance:
        return Verdict.MATCHES
    if low > tolerance:
        return Verdict.WORSE
    return Verdict.UNDECIDED


def seeds_to_decide(mean: float, sd: float, tolerance: float, rule: Rule = Rule(), ran: int = 1) -> int | None:
    """About how many seeds in all, more than the ``ran`` it has, an interval of this mean and
    scatter needs under ``rule`` (the sweep's own: a fixed grid's, or the adaptive schedule's,
    whose intervals are wider) to clear ``+tolerance`` (None: more than MAX_SEEDS_TO_SUGGEST,
    the mean sits at it)."""
    distance = abs(tolerance - mean)
    for n in range(max(2, ran + 1), MAX_SEEDS_TO_SUGGEST + 1):
        if rule.quantile(n) * sd / math.sqrt(n) < distance:
            return n
    return None
