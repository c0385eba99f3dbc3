"""The step model's measured error on the *ratio* of two configurations' steps at one cell, and
the one rule that decides a cell from it.

Two configurations priced at the same cell share much of their projection's error (the same
compute, the same machine, the same transport): what says which of the two is faster is the
error of the ratio of their projected steps, which two independent absolute bands
(service/step_model/bands.py) throw away. bench/projection_pairs.py measures it on the held-out
cells bench/projection.py committed (``projection_cells_cluster.json``, the cells of the report's
absolute bands): at every counted (W, link) cell, for every pair of hooks with the same
error-feedback setting (hooks without one pair with both),

    error % = 100 x (projected_a / projected_b) / (measured_a / measured_b) - 100

and keeps, per pair and W, the range of its cells widened by how far one pair's error moved from
one held-out link to the other at that W (the median over every pair: two links per W are too
few to say it per pair). ``projection_pairs_cluster.json`` beside this module holds those bands
and the raw pair cells they come from (:func:`pair_bands` reads it).

The rule (:func:`rule`), the same for measured world sizes (service/answer/recommend.py: the
paired measurement's spread is the error) and projected cells (:func:`decide`): the fastest
configuration is the answer, *decided*, when it beats every other by more than their pair's
error; where the ones it cannot be told from include the baseline, the baseline is kept. At a
projected cell the error of a pair is its ratio band and its seeds' and probe's spread: the
fastest's slowest seed against the other's fastest must stay below 1 at the low end of that
pair's band (:meth:`RatioBand.clears`). A pair the bench did not measure (a hook,
or an error-feedback setting, it never ran) takes the two hooks' absolute bands as independent
(:func:`compose`: the rule of two absolute bands), and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional

from service.step_model.bands import (DDP, ErrorBand, ErrorBands, band_text, label, nearest_checked, pct_range,
                                      sharding_in, sharding_of, where_checked)

PAIR_FILE = Path(__file__).with_name("projection_pairs_cluster.json")  # from the cells the report's bands come from
SHAPE_PAIR_FILE = Path(__file__).with_name("projection_pairs.json")   # this machine's shape (W ranks on its cores): benches
FORMAT = 1


class Configured(NamedTuple):
    """A hook with its error-feedback setting (None: it has none) and, under fsdp, its parameter
    all-gather's format: what a pair band is kept for (a side without a parallelism is ddp's)."""

    hook: str
    error_feedback: Optional[bool]
    parallelism: str = DDP
    all_gather: Optional[str] = None

    def keyed(self) -> "Configured":
        """As bands are keyed (bands.sharding_of): an fsdp side's all-gather fp32 where not given."""
        return Configured(self.hook, self.error_feedback, *sharding_of(self.parallelism, self.all_gather))


@dataclass(frozen=True)
class RatioBand:
    """The error of a projected ratio a / b against the measured one, %: (projected / measured - 1)."""

    low_pct: float
    high_pct: float
    source: str                   # "measured for a / b" | "unmeasured pair: ... taken as independent"
    checked_w: Optional[int] = None
    beyond: bool = False          # the cell has more ranks than any W the pair was checked at
    measured: bool = True

    def inverse(self) -> "RatioBand":
        """The band of b / a: an error e of a / b is 1 / (1 + e) - 1 of its inverse (a band
        reaching -100 %, which says nothing of the ratio, has no upper end once inverted)."""
        return replace(self, low_pct=100.0 * (_over(100.0, 100.0 + self.high_pct) - 1),
                       high_pct=100.0 * (_over(100.0, 100.0 + self.low_pct) - 1))

    def clears(self, ratio: float) -> bool:
        """Is a with ``ratio`` = a's time / b's faster than b whatever the error in this band? The
        measured ratio is at most ratio / (1 + low): below 1."""
        floor = 1.0 + self.low_pct / 100.0
        return floor > 0 and ratio < floor

    def measured_range(self, ratio: float) -> tuple[float, float]:
        """The measured ratios a projected ``ratio`` stands for under this band: (lowest, highest)."""
        return _over(ratio, 1.0 + self.high_pct / 100.0), _over(ratio, 1.0 + self.low_pct / 100.0)

    def text(self) -> str:
        return pct_range(self.low_pct, self.high_pct)

    def where(self) -> str:
        return where_checked(self.checked_w, self.beyond)

    def described(self) -> str:
        return band_text(self.low_pct, self.high_pct, self.checked_w, self.beyond)


def _over(x: float, y: float) -> float:
    return x / y if y > 0 else math.inf


def compose(a: Optional[ErrorBand], b: Optional[ErrorBand], why: str = "") -> RatioBand:
    """The ratio band of two absolute bands taken as independent: a / b's error runs from
    (1 + low_a) / (1 + high_b) - 1 to (1 + high_a) / (1 + low_b) - 1 (no band: no error)."""
    la, ha = (a.low_pct, a.high_pct) if a else (0.0, 0.0)
    lb, hb = (b.low_pct, b.high_pct) if b else (0.0, 0.0)
    source = f"unmeasured pair{why}: the two hooks' absolute bands taken as independent"
    at = a or b
    return RatioBand(100.0 * ((100 + la) / (100 + hb) - 1), 100.0 * ((100 + ha) / (100 + lb) - 1), source,
                     at and at.checked_w, bool(at and at.beyond), measured=False)


@dataclass(frozen=True)
class MeasuredPair:
    """One pair band as the bench measured it: the error of a's step over b's, at ``world_size``."""

    a: Configured
    b: Configured
    world_size: int
    low_pct: float
    high_pct: float
    cells: int


@dataclass(frozen=True)
class PairBands:
    measured: tuple[MeasuredPair, ...]
    provenance: str

    def for_pair(self, a: Configured, b: Configured, world_size: int,
                 absolute: tuple[Optional[ErrorBand], Optional[ErrorBand]] = (None, None)) -> RatioBand:
        """The band of a's projected step over b's at the checked W nearest ``world_size``;
        for a pair the bench did not measure, ``absolute`` (a's and b's bands) composed."""
        a, b = a.keyed(), b.keyed()
        mine = [(m, False) for m in self.measured if (m.a, m.b) == (a, b)]
        mine += [(m, True) for m in self.measured if (m.a, m.b) == (b, a) and a != b]
        if not mine:
            why = "" if not self.measured else f" ({label(*a)} against {label(*b)} was not measured)"
            return compose(*absolute, why)
        checked = sorted({m.world_size for m, _ in mine})
        at = nearest_checked(checked, world_size)
        m, flipped = next((m, f) for m, f in mine if m.world_size == at)
        band = RatioBand(m.low_pct, m.high_pct, f"measured for {label(*m.a)} against {label(*m.b)}", at,
                         world_size > checked[-1])
        return band.inverse() if flipped else band


    def between(self, a: Configured, b: Configured, world_size: int, absolute: ErrorBands) -> RatioBand:
        """:meth:`for_pair` with ``absolute``'s bands of a and b at ``world_size`` for a pair the
        bench did not measure."""
        return self.for_pair(a, b, world_size, (absolute.for_cell(a.hook, a.error_feedback, world_size, a.parallelism,
                                                                   a.all_gather),
                                                absolute.for_cell(b.hook, b.error_feedback, world_size, b.parallelism,
                                                                  b.all_gather)))


def from_json(data: dict) -> PairBands:
    """Pair bands from ``projection_pairs.json``'s form (format 1)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"pair bands format {data.get('format')!r}, this reader reads {FORMAT}")
    measured = tuple(MeasuredPair(Configured(b["a"], b["a_error_feedback"], *sharding_in(b, "a_")),
                                  Configured(b["b"], b["b_error_feedback"], *sharding_in(b, "b_")),
                                  int(b["world_size"]), float(b["low_pct"]), float(b["high_pct"]), int(b["cells"]))
                     for b in data["bands"])
    return PairBands(measured, f"{data['source']} from {data['derived_from']}, {data['measured'][:10]}")


@lru_cache(maxsize=4)
def pair_bands(path: Path = PAIR_FILE) -> PairBands:
    """The pair bands bench/projection_pairs.py wrote; none when it never ran."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return PairBands((), "the ratio error is unmeasured (run bench/projection_pairs.py)")
    return from_json(data)


# --------------------------------------------------------------------------------------------
# The rule


@dataclass(frozen=True)
class Contender:
    """One candidate at a cell: its projected time, and its fastest and slowest seed's."""

    name: str
    projected: float
    fastest: float
    slowest: float


@dataclass(frozen=True)
class Decision:
    """A cell's answer (:func:`rule`): the configuration to use, the runner-up it was weighed
    against, whether the answer won beyond the error, that pair's band (projected cells), the
    answer's lead over the runner-up (``margin``: the runner-up's time over the answer's, less 1;
    below 0 where the baseline is kept against a faster runner-up) and ``error``: the lead the
    fastest needed over that runner-up to be told apart from it."""

    winner: Optional[str]
    runner_up: Optional[str]
    decided: bool
    band: Optional[RatioBand] = None
    margin: float = 0.0
    error: float = 0.0


@dataclass(frozen=True)
class PairCall:
    """The fastest configuration against one other: ``margin`` (the other's time over its own, less
    1) and ``error`` (the margin it needs to be faster whatever the error: the pair's band and
    spread); ``band``: the projected pair's ratio band, where there is one."""

    margin: float
    error: float
    band: Optional[RatioBand] = None

    @property
    def clears(self) -> bool:
        return self.margin > self.error


def rule(ranked: list[str], call: Callable[[str, str], PairCall], baseline: Optional[str] = None) -> Decision:
    """The one rule every answer is decided by, measured or projected (``ranked``: fastest
    first; ``call(a, b)``: a against b). The fastest is the answer when it beats every other
    beyond their pair's error. Otherwise, where the configurations it cannot be told from
    include ``baseline``, the baseline is kept (the fastest its runner-up); where they do not
    (it beats the baseline beyond the error, but not some other compressor), it stays the answer,
    undecided against the one nearest to beating it."""
    if not ranked:
        return Decision(None, None, False)
    best = ranked[0]
    if len(ranked) == 1:
        return Decision(best, None, True)
    calls = {other: call(best, other) for other in ranked[1:]}
    tied = [o for o, c in calls.items() if not c.clears]
    if not tied:  # decided: weighed against the second fastest
        c = calls[ranked[1]]
        return Decision(best, ranked[1], True, c.band, c.margin, c.error)
    # the nearest to beating it: by how far its error lets the measured ratio go
    holder = max(tied, key=lambda o: (1.0 + calls[o].error) / (1.0 + calls[o].margin))
    if baseline is not None and baseline in tied:
        c = calls[baseline]
        return Decision(baseline, best, False, c.band, 1.0 / (1.0 + c.margin) - 1.0, c.error)
    c = calls[holder]
    return Decision(best, holder, False, c.band, c.margin, c.error)


def projected_call(a: Contender, b: Contender, band: RatioBand) -> PairCall:
    """a against b at a projected cell: a's slowest seed over b's fastest must clear the low end
    of the pair's band (:meth:`RatioBand.clears`), which is a margin of a's projected time over
    b's beyond ``error`` = (the seeds' and probe's spread of the ratio) / (1 + low) - 1."""
    floor = 1.0 + band.low_pct / 100.0
    if b.fastest <= 0 or floor <= 0:  # a spread of 100 % or more (b's fastest seed at 0 s): nothing clears it
        return PairCall(b.projected / a.projected - 1.0, math.inf, band)
    spread = (a.slowest / a.projected) / (b.fastest / b.projected)
    error = spread / floor - 1.0
    return PairCall(b.projected / a.projected - 1.0, error, band)


def decide(contenders: Iterable[Contender], band_of: Callable[[str, str], RatioBand],
           baseline: Optional[str] = None) -> Decision:
    """:func:`rule` at a projected cell (``band_of(winner, other)``: the band of the winner's step
    over the other's)."""
    by_name = {c.name: c for c in contenders}
    ranked = sorted(by_name, key=lambda n: by_name[n].projected)
    return rule(ranked, lambda a, b: projected_call(by_name[a], by_name[b], band_of(a, b)), baseline)
