"""Time to target at the scale you will run: every configuration projected to (world size, link)
cells it never ran on, through the one step model (service/step_model/), with its measured error.

For each configuration, its *basis* (:func:`bases`): the time-to-target crossing step of each
seed at the largest world size it ran at (W_m; ``recommend.time_to_target``) and the step
timelines (``step_timeline.json``: service/step_model/trial.py) its ok trials recorded at its smallest
world size above 1 (where ranks share this machine least). At a cell (W, link):

    projected step ms   = median over the basis trials of TrialTimeline.price(global batch, W, link)
    projected time (s)  = mean crossing step over the seeds x projected step ms / 1000

* The global batch is kept (``workload.global_batch_size``): a rank's forward and backward shrink
  as the batch splits over more ranks, by the fixed + per-sample cost the trials measured at two
  micro-batch sizes (the medians over every basis trial at the same W: ``trial.pooled_compute``);
  a cell with more ranks than samples is refused with its reason.
* Quality (crossing steps, verdict) at a W the sweep ran is that W's own: a measured verdict wins
  over another W's. At any other W it is W_m's, assumed there: every projected figure says which
  W its quality is from.
  The crossing step is a count of optimizer steps at that global batch; evals are left out as in
  the measured time to target, and warm-up steps are priced as steady ones.
* Collectives' transport (the CPU work moving their bytes) is the sweep's, measured once before
  its trials (``transport.json``: service/step_model/transport.py) where the sweep has one, else
  each trial's recorded comm scaled; their wire at the cell's link.
* Collectives are priced at the cell's latency (``latency_ms`` of report.project / report.cluster,
  default and its reason in docs/hooks.md), not at a constant of the model.
* Beside every projected figure, the model's error measured on held-out emulated cells by
  bench/projection.py for its hook with its error-feedback setting (under fsdp: its fsdp band,
  with its all-gather format), at the checked W nearest the cell's (``service/step_model/projection_error.json``: ``bands.error_bands``, the one place the
  report takes it from); a cell above every checked W says so.
* Which configuration wins a cell, and whether the measurement can tell (:func:`winner`): the
  rule of service/step_model/pairs.py, on the error of the *ratio* of two configurations'
  projected steps that bench/projection_pairs.py measured for that pair (two absolute bands taken
  as independent where the pair was not measured), each seed priced with the transport probe's
  median and with its lower quartile (``TransportFit.quartile``: where the probe's repeats are
  bimodal the median is either mode by chance). The same rule everywhere a cell is decided:
  projection.csv (``cell_winner``, ``cell_runner_up``, ``cell_decided``), the decision map and
  the cluster's answer.

Cells: ``report.project`` (default: W from 8 in powers of two up to the global batch x 10, 25,
100 Gbit/s) and ``report.cluster`` (the one the headline answers for). The decision map
(service/report/decision_map.py) prices a wider grid the same way.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Optional

from service.answer.recommend import BASELINE_HOOK
from service.answer.sequential import Verdict
from service.step_model.bands import ErrorBand, ErrorBands, error_bands, error_feedback_of, sharding_of
from service.step_model.bands import band_text as one_band
from service.step_model.pairs import Configured, Contender, PairBands, RatioBand, decide, pair_bands
from service.step_model.price import CellRefused
from service.step_model.transport import TransportFit
from service.step_model.trial import TrialTimeline, pooled_compute

CSV = "projection.csv"
DEFAULT_LINKS_GBPS = (10.0, 25.0, 100.0)
FIRST_PROJECTED_W = 8
CSV_COLUMNS = ("config", "hook", "measured_world_size", "timeline_world_size", "world_size", "link_gbps", "projected_step_ms",
               "projected_time_to_target_s", "crossing_step", "error_low_pct", "error_high_pct", "matches_quality",
               "refused", "cell_winner", "cell_runner_up", "cell_decided")


# --------------------------------------------------------------------------------------------
# What a configuration measured, and its projection


@dataclass(frozen=True)
class QualityAt:
    """A configuration's quality at one world size it ran: its seeds' crossing steps (None: that
    seed never reached the target) and whether its verdict matched the baseline's."""

    world_size: int
    crossing_steps: tuple[Optional[float], ...]
    matches: bool
    spread: float = 0.0   # its measured time to target's spread there over the time (recommend's)

    @property
    def crossing_step(self) -> Optional[float]:
        """The mean crossing step over seeds; None when some seed never reached the target."""
        if not self.crossing_steps or any(s is None for s in self.crossing_steps):
            return None
        return statistics.fmean(self.crossing_steps)


@dataclass(frozen=True)
class Basis:
    """One configuration as measured: at ``measured_world_size`` its seeds' crossing steps (None:
    that seed never reached the target) and whether its quality matched; at
    ``timeline_world_size`` its trials' recorded step timelines (:func:`bases` says which W)."""

    config: str
    hook: str
    measured_world_size: int
    global_batch: int
    timelines: tuple[TrialTimeline, ...]
    crossing_steps: tuple[Optional[float], ...]
    matches_quality: bool
    timeline_world_size: int
    other_quality: tuple[QualityAt, ...] = ()   # at the other world sizes it ran
    error_feedback: Optional[bool] = None        # its hook's setting (None: the hook has none)
    spread: float = 0.0                          # its measured time to target's spread at W_m (QualityAt.spread)
    parallelism: str = "ddp"                     # ddp | fsdp (search.parallelism): which bands it takes
    all_gather: Optional[str] = None             # fsdp's parameter all-gather format (hook_params' all_gather)

    @property
    def configured(self) -> Configured:
        """Its hook, error-feedback setting and sharding as the measured bands are kept for."""
        return Configured(self.hook, self.error_feedback, self.parallelism, self.all_gather).keyed()

    @property
    def crossing_step(self) -> Optional[float]:
        return self.quality_at(self.measured_world_size).crossing_step

    def quality_at(self, world_size: int) -> QualityAt:
        """Its quality at ``world_size``: that W's own where it ran there, else W_m's."""
        own = next((q for q in self.other_quality if q.world_size == world_size), None)
        return own or QualityAt(self.measured_world_size, self.crossing_steps, self.matches_quality, self.spread)


@dataclass(frozen=True)
class CellProjection:
    """One configuration at one (W, link): its projected step and time to target, or why not."""

    basis: Basis
    world_size: int
    link_gbps: float
    step_ms: Optional[float]
    time_to_target_s: Optional[float]
    band: Optional[ErrorBand]
    refused: str = ""
    seed_steps_ms: tuple[float, ...] = ()   # each basis trial's timeline priced here (step_ms: their median)
    # the same priced with the probe's lower quartile (TransportFit.quartile): the probe's spread
    quartile_steps_ms: tuple[float, ...] = ()

    @property
    def config(self) -> str:
        return self.basis.config

    @property
    def quality(self) -> QualityAt:
        """The quality this cell rests on (:meth:`Basis.quality_at`)."""
        return self.basis.quality_at(self.world_size)

    def row(self) -> dict:
        b, q = self.basis, self.quality
        return {"config": b.config, "hook": b.hook, "measured_world_size": q.world_size,
                "timeline_world_size": b.timeline_world_size,
                "world_size": self.world_size, "link_gbps": self.link_gbps,
                "projected_step_ms": _num(self.step_ms), "projected_time_to_target_s": _num(self.time_to_target_s),
                "crossing_step": _num(q.crossing_step), "error_low_pct": _num(self.band and self.band.low_pct),
                "error_high_pct": _num(self.band and self.band.high_pct), "matches_quality": q.matches,
                "refused": self.refused}


def _num(x: Optional[float]) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x:.6g}"


def project_cell(basis: Basis, world_size: int, link_gbps: float, latency_ms: float,
                 bands: Optional[ErrorBands] = None, transport: Optional[TransportFit] = None) -> CellProjection:
    """``basis`` priced at (``world_size``, ``link_gbps``, ``latency_ms``) (the module doc's
    formulas), its collectives' transport from the sweep's ``transport`` where measured."""
    band = (bands or error_bands()).for_cell(basis.hook, basis.error_feedback, world_size, basis.parallelism,
                                             basis.all_gather)
    quartile = transport.quartile() if transport is not None else None
    try:
        steps = [t.price(basis.global_batch, world_size, link_gbps, latency_ms / 1000.0, transport).step_ms
                 for t in basis.timelines]
        low = [t.price(basis.global_batch, world_size, link_gbps, latency_ms / 1000.0, quartile).step_ms
               for t in basis.timelines] if quartile is not None else []
    except CellRefused as e:
        return CellProjection(basis, world_size, link_gbps, None, None, band, str(e))
    step = statistics.median(steps)
    crossing = basis.quality_at(world_size).crossing_step
    seconds = None if crossing is None else crossing * step / 1000.0
    return CellProjection(basis, world_size, link_gbps, step, seconds, band, seed_steps_ms=tuple(steps),
                          quartile_steps_ms=tuple(low))


def project(bases: Iterable[Basis], world_sizes: Iterable[int], links_gbps: Iterable[float], latency_ms: float,
            bands: Optional[ErrorBands] = None, transport: Optional[TransportFit] = None) -> list[CellProjection]:
    """Every basis at every (W, link), W-major, at ``latency_ms`` (and ``transport``: :func:`project_cell`)."""
    cells = [(w, g) for w in world_sizes for g in links_gbps]
    return [project_cell(b, w, g, latency_ms, bands, transport) for b in bases for w, g in cells]


def default_world_sizes(global_batch: int, first: int = FIRST_PROJECTED_W) -> list[int]:
    """W = first, 2 first, ... up to the global batch (a rank needs a sample); [first] when even
    that is more (its cells are then refused, with the reason)."""
    sizes, w = [], first
    while w <= global_batch:
        sizes.append(w)
        w *= 2
    return sizes or [first]


def cells(project_cfg, global_batch: int) -> tuple[list[int], list[float]]:
    """``report.project``'s world sizes and links, each defaulted where left out."""
    sizes = project_cfg.world_size if project_cfg.world_size else default_world_sizes(global_batch)
    links = project_cfg.link_gbps if project_cfg.link_gbps else list(DEFAULT_LINKS_GBPS)
    return sorted(sizes), sorted(links)


def write_csv(projections: list[CellProjection], path: Path, pairs: Optional[PairBands] = None) -> Path:
    """projection.csv: one row per (configuration, W, link), :data:`CSV_COLUMNS`; every row of a
    cell says that cell's answer (:func:`winner`)."""
    by_cell: dict[tuple[int, float], list[CellProjection]] = {}
    for p in projections:
        by_cell.setdefault((p.world_size, p.link_gbps), []).append(p)
    answers = {at: winner(ps, pairs) for at, ps in by_cell.items()}
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows({**p.row(), **answers[(p.world_size, p.link_gbps)].row()} for p in projections)
    return Path(path)


# --------------------------------------------------------------------------------------------
# From a sweep's trials


def bases(trials: list, recs: list, timeline_of: Callable[[str], Optional[TrialTimeline]]) -> list[Basis]:
    """One basis per configuration with ok trials that recorded their step timelines
    (``timeline_of(run_id)``: ``SweepReader.step_timeline``). ``trials``: the report's (data.Trial);
    ``recs``: its recommendations, whose verdicts at each W say whether the quality matched there.

    Quality (crossing steps, verdict) at every world size the configuration ran, W_m (its
    largest, the closest to the cluster) the one assumed elsewhere. The step timelines come
    from its smallest world size above 1 where every ok trial recorded one (W = 1 when it ran
    nothing else): on one host W ranks share its cores, so the compute a rank records grows
    with W, and that is the basis bench/projection.py checked (loopback, W = 2). Quality is a
    property of (configuration, W, seed), the step of (configuration, W, link): the two need not
    come from the same trials. At each W the crossing steps are those of the seeds every
    configuration there ran (adaptive seeds give some an extra one): the projected times are
    compared like with like."""
    by_config: dict[str, dict[int, dict[int, object]]] = {}
    for t in trials:
        if t.state == "ok":  # one trial per seed: a split sweep's joined trials share their quality run
            by_config.setdefault(t.config, {}).setdefault(t.world_size, {}).setdefault(t.seed, t)
    out = []
    for config, by_w in by_config.items():
        recorded = _timelines(by_w, timeline_of)
        if recorded is None:
            continue  # no world size where every ok trial recorded its step
        quality = {w: _quality(by_config, recs, config, w) for w in by_w}
        top = quality[max(by_w)]
        first = next(iter(by_w[top.world_size].values()))
        parallelism, all_gather = sharding_of(first.record.parallelism, first.hook_params.get("all_gather"))
        out.append(Basis(config, first.hook, top.world_size, int(first.record.params["global_batch_size"]),
                         recorded[1], top.crossing_steps, top.matches, recorded[0],
                         tuple(q for w, q in sorted(quality.items()) if w != top.world_size),
                         error_feedback_of(first.hook, first.hook_params), top.spread, parallelism, all_gather))
    out.sort(key=lambda b: (b.hook != BASELINE_HOOK, b.config))
    return _pooled(out)


def _pooled(bases: list[Basis]) -> list[Basis]:
    """The bases with their compute points pooled over every basis's trials at the same W
    (``trial.pooled_compute``: the bare module's forward and backward, the same in every trial)."""
    pooled = iter(pooled_compute(t for b in bases for t in b.timelines))
    return [replace(b, timelines=tuple(next(pooled) for _ in b.timelines)) for b in bases]


def _quality(by_config: dict, recs: list, config: str, world_size: int) -> QualityAt:
    """``config``'s quality at ``world_size``: the crossing steps of the seeds every
    configuration that ran there ran (all of its own where they share none), its verdict there."""
    at_w = [set(by_w[world_size]) for by_w in by_config.values() if world_size in by_w]
    shared = set.intersection(*at_w)
    seeds = by_config[config][world_size]
    crossing = tuple(None if t.time_to_target is None else t.time_to_target.step
                     for seed, t in sorted(seeds.items()) if seed in shared or not shared)
    return QualityAt(world_size, crossing, _matches(recs, config, world_size), _spread(recs, config, world_size))


def _spread(recs: list, config: str, world_size: int) -> float:
    """The spread of ``config``'s measured time to target at ``world_size`` over the time (the
    largest over the links it ran there): what the measured answer had to beat there, and so
    what a projected cell at that W must beat too."""
    spreads = [c.seconds_spread / c.seconds for r in recs if r.world_size == world_size for c in r.candidates
               if c.config == config and math.isfinite(c.seconds) and c.seconds > 0]
    return max(spreads, default=0.0)


def _timelines(by_w: dict, timeline_of) -> Optional[tuple[int, tuple[TrialTimeline, ...]]]:
    """(W, its trials' timelines) at the smallest W above 1 where every ok trial recorded one, else W = 1."""
    for world_size in sorted(by_w, key=lambda w: (w == 1, w)):
        timelines = tuple(timeline_of(t.run_id) for t in by_w[world_size].values())
        if all(tl is not None for tl in timelines):
            return world_size, timelines
    return None


def _matches(recs: list, config: str, world_size: int) -> bool:
    verdicts = [c.verdict for r in recs if r.world_size == world_size for c in r.candidates if c.config == config]
    return bool(verdicts) and all(v in (Verdict.MATCHES, Verdict.BASELINE) for v in verdicts)


# --------------------------------------------------------------------------------------------
# What the report says


@dataclass(frozen=True)
class CellWinner:
    """The answer at one (W, link) by the one rule (service/step_model/pairs.py's ``rule``):
    the fastest matching configuration where it wins beyond the error, else (too close to call)
    the baseline where the tie holds it; the runner-up it was weighed against; ``band``: that
    pair's ratio band."""

    world_size: int
    link_gbps: float
    winner: Optional[CellProjection]
    runner_up: Optional[CellProjection]
    too_close: bool
    band: Optional[RatioBand] = None
    margin: float = 0.0   # the answer's lead over the runner-up (pairs.Decision's)
    error: float = 0.0    # the lead the fastest needed over the runner-up

    @property
    def decided(self) -> bool:
        return self.winner is not None and not self.too_close

    def row(self) -> dict:
        """projection.csv's three cell columns."""
        return {"cell_winner": self.winner.config if self.winner else "",
                "cell_runner_up": self.runner_up.config if self.runner_up else "",
                "cell_decided": str(self.winner is not None and not self.too_close).lower()}


def _contender(p: CellProjection) -> Contender:
    """``p`` as pairs.decide weighs it: its projected time, its fastest and slowest seed's, each
    seed priced with the probe's median and its lower quartile (a decision survives both), and
    at a world size the sweep measured, widened by the measured time's spread there (a projected
    cell there cannot be surer than the measurement it stands on)."""
    crossing, q = p.quality.crossing_step, p.quality
    steps = p.seed_steps_ms + p.quartile_steps_ms
    measured = q.spread if q.world_size == p.world_size else 0.0
    return Contender(p.config, p.time_to_target_s, crossing * min(steps) / 1000.0 * max(1.0 - measured, 0.0),
                     crossing * max(steps) / 1000.0 * (1.0 + measured))


def winner(at_cell: list[CellProjection], pairs: Optional[PairBands] = None) -> CellWinner:
    """The configuration with the shortest projected time to target among those whose quality
    matched at this cell (:attr:`CellProjection.quality`) and reached the target in every seed,
    decided by service/step_model/pairs.py's rule under ``pairs`` (default: the measured ones)."""
    first = at_cell[0]
    ranked = {p.config: p for p in at_cell if p.quality.matches and p.time_to_target_s is not None}
    pairs = pair_bands() if pairs is None else pairs

    def band_of(a: str, b: str) -> RatioBand:
        pa, pb = ranked[a], ranked[b]
        return pairs.for_pair(pa.basis.configured, pb.basis.configured, first.world_size, absolute=(pa.band, pb.band))

    d = decide([_contender(p) for p in ranked.values()], band_of,
               BASELINE_HOOK if BASELINE_HOOK in ranked else None)
    best, runner = ranked.get(d.winner), ranked.get(d.runner_up)
    return CellWinner(first.world_size, first.link_gbps, best, runner,
                      best is not None and runner is not None and not d.decided, d.band, d.margin, d.error)


# --------------------------------------------------------------------------------------------
# The answer at one cell, and over the decision map's grid


MAP_LINKS_GBPS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)
FIRST_MAP_W = 2


def cell_answer(bases_: list[Basis], cell, bands: Optional[ErrorBands] = None,
                transport: Optional[TransportFit] = None,
                pairs: Optional[PairBands] = None) -> tuple[Optional[CellWinner], str]:
    """``cell``'s answer (a report.cluster or search.plan cell: world_size, link_gbps,
    latency_ms): (its :func:`winner`, ''), or (None, why it was not priced); (None, '') without a cell."""
    if cell is None or not bases_:
        return None, ""
    at = [project_cell(b, cell.world_size, cell.link_gbps, cell.latency_ms, bands, transport) for b in bases_]
    refused = next((p.refused for p in at if p.refused), "")
    return (None, refused) if refused else (winner(at, pairs), "")


def map_world_sizes(global_batch: int) -> list[int]:
    """The decision map's world sizes: 2, 4, ... up to the global batch."""
    return default_world_sizes(global_batch, FIRST_MAP_W)


def grid_answers(bases_: list[Basis], world_sizes: list[int], latency_ms: float, links_gbps=MAP_LINKS_GBPS,
                 bands: Optional[ErrorBands] = None, transport=None,
                 pairs: Optional[PairBands] = None) -> dict[tuple[int, float], CellWinner]:
    """(W, link) -> the cell's answer, every basis priced there at ``latency_ms`` with ``transport``."""
    by_cell: dict[tuple[int, float], list[CellProjection]] = {}
    for p in project(bases_, world_sizes, links_gbps, latency_ms, bands, transport):
        by_cell.setdefault((p.world_size, p.link_gbps), []).append(p)
    return {at: winner(ps, pairs) for at, ps in by_cell.items()}
