"""The sweep's answer, in one object: per world size it ran, the measured answer; for
``report.cluster``, the projected one; what is open and what would decide it. Every part of the
report renders from it (the headline, the map's measured row, projection.csv's cluster row, the
plan section), and it is written as ``answer.json`` on the parent run, the file scripts and CI
gates read:

    {"format": 1,
     "measured": {"2": {"answer": "allreduce", "runner_up": "bf16_compress", "decided": false,
                        "margin_pct": -1.9, "error_pct": 4.2, "link": "loopback"}, ...},
     "cluster": {"world_size": 32, "link_gbps": 10.0, "latency_ms": 0.025, "answer": ..., "runner_up": ...,
                 "decided": ..., "margin_pct": ..., "error_pct": ...,
                 "hosts": {"compute": [...], "transport": [...], "transport_source": "..."}},
     "open": [{"config": ..., "where": "W = 2 on loopback", "why": ..., "decides": ...}]}

``margin_pct``: the answer's lead over the runner-up (the runner-up's time to target over the
answer's, less 1; below 0 where allreduce is kept against a faster runner-up that is not faster
beyond the error); ``error_pct``: the lead the fastest needed over the runner-up to be told apart
from it; ``decided``: the answer won beyond that error (service/step_model/pairs.py's rule).
A world size the sweep ran on several links (or compiled beside eager) keeps each in ``links``,
keyed by the place, the first of them (loopback first) the entry itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from service.answer.pricing import Pricing, compute_hosts
from service.answer.recommend import LOOPBACK, Recommendation, speedup
from service.config.trial import COMPILED

ARTIFACT = "answer.json"
FORMAT = 1


@dataclass(frozen=True)
class CellAnswer:
    """One cell's answer: the configuration to use, the one it was weighed against, and how."""

    answer: Optional[str]
    runner_up: Optional[str]
    decided: bool
    margin_pct: Optional[float]
    error_pct: Optional[float]
    why_none: str = ""   # where nothing qualifies (answer None): why
    speedup: Optional[float] = None   # measured: allreduce's time to target over the answer's

    def to_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("why_none", "speedup")}
        return {**out, **({"why_none": self.why_none} if self.why_none else {}),
                **({"speedup_vs_allreduce": round(self.speedup, 4)} if self.speedup is not None else {})}


def _pct(x: float) -> Optional[float]:
    return round(100.0 * x, 2) if math.isfinite(x) else None


def measured_answer(rec: Recommendation) -> CellAnswer:
    """A measured world size's answer (service/answer/recommend.py)."""
    if rec.choice is None:
        return CellAnswer(None, None, False, None, None, rec.reason)
    runner = rec.runner_up.config if rec.runner_up is not None else None
    up = speedup(rec.choice, rec.baseline) if rec.baseline is not None and rec.choice is not rec.baseline else math.nan
    up = up if math.isfinite(up) else None
    if runner is None:
        return CellAnswer(rec.choice.config, None, True, None, None, speedup=up)
    return CellAnswer(rec.choice.config, runner, rec.decided, _pct(rec.margin), _pct(rec.error), speedup=up)


def projected_answer(cell) -> CellAnswer:
    """A projected cell's answer (service/answer/projection.py's CellWinner)."""
    if cell.winner is None:
        return CellAnswer(None, None, False, None, None,
                          "no configuration that matched the baseline's quality reached the target")
    if cell.runner_up is None:
        return CellAnswer(cell.winner.config, None, True, None, None)
    return CellAnswer(cell.winner.config, cell.runner_up.config, cell.decided, _pct(cell.margin), _pct(cell.error))


def place(rec: Recommendation) -> str:
    """'loopback', '1 Gbit/s', or 'loopback, compiled'."""
    return f"{rec.link}, {COMPILED}" if rec.compiled else rec.link


@dataclass(frozen=True)
class Measured:
    world_size: int
    link: str                                        # the entry's own place
    answer: CellAnswer
    links: dict[str, CellAnswer] = field(default_factory=dict)   # every place at this W, where more than one

    def to_json(self) -> dict:
        out = {**self.answer.to_json(), "link": self.link}
        if self.links:
            out["links"] = {k: a.to_json() for k, a in self.links.items()}
        return out


@dataclass(frozen=True)
class ClusterAnswer:
    world_size: int
    link_gbps: float
    latency_ms: float
    answer: CellAnswer
    compute_hosts: list = field(default_factory=list)     # ProbeHosts the compute was measured on
    transport_hosts: list = field(default_factory=list)   # ProbeHosts the transport was probed on
    transport_source: str = ""
    refused: str = ""                                     # why the cell was not priced
    transport_from_cluster: bool = False                  # priced with report.cluster.transport's probe

    def to_json(self) -> dict:
        hosts = {"compute": [_host(h) for h in self.compute_hosts], "transport": [_host(h) for h in self.transport_hosts],
                 "transport_source": self.transport_source, "transport_from_cluster": self.transport_from_cluster}
        out = {"world_size": self.world_size, "link_gbps": self.link_gbps, "latency_ms": self.latency_ms,
               **self.answer.to_json(), "hosts": hosts}
        return {**out, **({"refused": self.refused} if self.refused else {})}


def _host(h) -> dict:
    """A host as answer.json names it: CPU model, cores per host, ranks per host, loopback or link."""
    return {"cpu_model": h.cpu_model, "cores_per_host": h.cores, "ranks_per_host": h.ranks_per_host,
            "hosts": h.hosts, "world_size": h.world_size, "loopback": h.loopback}


@dataclass(frozen=True)
class Open:
    """A configuration whose quality verdict is undecided: where, why, and what would decide it."""

    config: str
    where: str
    why: str
    decides: str


@dataclass(frozen=True)
class SweepAnswer:
    measured: dict[int, Measured]
    cluster: Optional[ClusterAnswer] = None
    open: tuple[Open, ...] = ()

    def to_json(self) -> dict:
        return {"format": FORMAT, "measured": {str(w): m.to_json() for w, m in sorted(self.measured.items())},
                **({"cluster": self.cluster.to_json()} if self.cluster is not None else {}),
                "open": [asdict(o) for o in self.open]}


def _order(rec: Recommendation) -> tuple:
    return (rec.compiled, rec.link != LOOPBACK, rec.link)


def sweep_answer(recs: list[Recommendation], cluster=None, cluster_cell=None, refused: str = "",
                 pricing: Optional[Pricing] = None, bases: tuple = ()) -> SweepAnswer:
    """The answer from the measured recommendations and report.cluster's projected cell
    (``cluster``: the config's cell; ``cluster_cell``: its CellWinner; ``refused``: why it was not
    priced), priced with ``pricing``, the compute from ``bases``' timelines."""
    measured: dict[int, Measured] = {}
    for w in sorted({r.world_size for r in recs if r.world_size > 1} or {r.world_size for r in recs}):
        at = sorted((r for r in recs if r.world_size == w), key=_order)
        links = {place(r): measured_answer(r) for r in at} if len(at) > 1 else {}
        measured[w] = Measured(w, place(at[0]), measured_answer(at[0]), links)
    opened = tuple(Open(config, f"W = {r.world_size} on {place(r)}", why, r.decides.get(config, ""))
                   for r in sorted(recs, key=lambda r: (r.world_size, _order(r))) for config, why in r.open)
    if cluster is None:
        return SweepAnswer(measured, None, opened)
    answer = projected_answer(cluster_cell) if cluster_cell is not None else CellAnswer(None, None, False, None, None, refused)
    transport = pricing.transport if pricing is not None else None
    c = ClusterAnswer(cluster.world_size, cluster.link_gbps, cluster.latency_ms, answer,
                      compute_hosts([t for b in bases for t in b.timelines]),
                      list(transport.hosts) if transport is not None else [],
                      pricing.transport_source() if pricing is not None else "", refused,
                      pricing is not None and pricing.from_cluster)
    return SweepAnswer(measured, c, opened)
