"""What moving bytes through the collectives costs this machine, measured once per sweep
(``transport.json`` on the parent run): per collective kind and probed world size, a fixed cost
per collective and a cost per byte a rank sends, fitted over the message sizes the probe ran
(service/train/transport_probe.py).

    at a probed W:      transport(kind, n, W, count) = fixed_ms x count + per_byte_ms x wire_bytes(kind, n, W)
    at any other W:     the nearest probed W's fit per ring round, times rounds(kind, W)

rounds: the ring's (allreduce 2(W-1), the others W-1); wire_bytes: hooks/wire.py. The kinds:
hooks/wire.py's KINDS, which every probe measures, and FSDP's SHARDED_KINDS (reduce_scatter,
all_gather, their bytes the unsharded size's), which only a sweep with fsdp trials probes (and
``python -m service.probe``). A kind a transport.json lacks (the sharded ones in any file written
before them or by a sweep without fsdp trials) is not guessed from another: :meth:`TransportFit.ms`
raises a KeyError naming it, and a caller prices such collectives as it does without a
transport.json (``kind in fit.kinds`` tells which).
One form fitted across world sizes missed its own probes by up to 87 %: gloo's fixed cost does
not grow as the ring's rounds do on this machine (W ranks
time-share its cores), so each probed W keeps its own fit and only unprobed W are scaled by the
ring. A W probed with more ranks than a host has cores carries this machine's time-sharing:
a cluster cell (a core per rank) is priced from the unshared W only (:meth:`TransportFit.own_cores`).
The cost of a collective is a property of the machine and W, not of the hook or the seed:
priced from this fit, a trial's collectives no longer carry the noise of the few steps it
sampled (service/step_model/price.py uses it in place of the trial's own comm when given).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from typing import Optional

from hooks.cost import OVERLAPPING_KINDS, collective_seconds
from hooks.wire import ALL_KINDS, rounds, wire_bytes

ARTIFACT = "transport.json"
CLUSTER_ARTIFACT = "cluster_transport.json"   # report.cluster.transport's file, copied onto the parent run
FORMAT = 2  # 1: one fit per kind across world sizes


@dataclass(frozen=True)
class Sample:
    """One probe measurement: the median ms of ``repeats`` collectives of ``kind`` carrying
    ``nbytes`` of payload per rank at ``world_size`` (the slowest rank's). ``cpu_ms``: the median
    CPU time one collective cost a rank's process (every thread, gloo's included; the ranks'
    mean), what a host's cores spend where ``ms`` is also waiting. ``p25_ms``: the repeats' lower
    quartile beside their median: where the repeats are bimodal (ranks time-sharing cores, a
    host's quota), the median is either mode by chance and this one is not; the fit reads ``ms``.
    Both None in probes before them."""

    kind: str
    world_size: int
    nbytes: int
    ms: float
    repeats: int
    shared: bool = False   # more ranks than cores on a host: this machine's time-sharing is in it
    cpu_ms: Optional[float] = None
    p25_ms: Optional[float] = None


@dataclass(frozen=True)
class KindFit:
    """One kind at one probed world size: ms = fixed_ms x count + per_byte_ms x bytes sent;
    ``max_rel_error``: the worst |fit - sample| / sample over its samples."""

    world_size: int
    fixed_ms: float
    per_byte_ms: float
    max_rel_error: float
    shared: bool = False   # fitted from samples whose ranks outnumbered a host's cores

    def ms(self, kind: str, nbytes: float, world_size: int, count: float = 1.0) -> float:
        """At this fit's W as fitted; at another W its fixed cost per ring round times that W's rounds."""
        if world_size <= 1:
            return 0.0
        fixed = self.fixed_ms
        if world_size != self.world_size:
            fixed *= rounds(kind, world_size) / rounds(kind, self.world_size)
        return fixed * count + self.per_byte_ms * wire_bytes(kind, nbytes, world_size)


@dataclass(frozen=True)
class ProbeHosts:
    """Where one world size was probed: its ranks' hosts, as the ranks saw them. ``cores``: the
    fewest CPUs a host gave its process (affinity, and a cgroup's CPU quota where one is set);
    ``loopback``: every rank on one host (the collectives never left it)."""

    world_size: int
    hosts: int
    ranks_per_host: int
    cores: float
    cpu_model: str
    loopback: bool

    @property
    def time_shared(self) -> bool:
        """More ranks on a host than it has cores: its ranks take turns. (A host of a fraction of
        a core with one rank shares with nobody: that share is its rank's core.)"""
        return self.ranks_per_host > max(self.cores, 1.0)

    @classmethod
    def of(cls, ranks: list[tuple[str, float, str]]) -> "ProbeHosts":
        """From every rank's (host, cores, CPU model): how many hosts, the most ranks on one,
        the fewest cores one gives its process, the CPU models."""
        per_host: dict[str, int] = {}
        for host, _, _ in ranks:
            per_host[host] = per_host.get(host, 0) + 1
        return cls(world_size=len(ranks), hosts=len(per_host), ranks_per_host=max(per_host.values()),
                   cores=min(c for _, c, _ in ranks), cpu_model=" / ".join(sorted({m for _, _, m in ranks})),
                   loopback=len(per_host) == 1)

    def describe(self) -> str:
        where = "on loopback" if self.loopback else f"across {self.hosts} hosts"
        return (f"W = {self.world_size} {where}, {self.ranks_per_host} rank(s) per host of {self.cores:g} "
                f"core(s) ({self.cpu_model})")


@dataclass(frozen=True)
class TransportFit:
    """The machine's transport per kind and probed W, with the samples it was fitted from and
    what they cost, and the hosts each W was probed on (empty: a transport.json from before
    they were recorded)."""

    kinds: dict[str, tuple[KindFit, ...]]   # per kind, one fit per probed W, ascending
    samples: tuple[Sample, ...]
    probe_s: dict[int, float]   # wall seconds the probe took per world size
    hosts: tuple[ProbeHosts, ...] = ()
    # the link, Gbit/s, the probed collectives crossed: its wire time is inside the samples
    # (python -m service.probe --link-gbps on a cluster); None: the hosts' own work only
    # (loopback, or emulated hosts probed with their links unshaped)
    link_gbps: Optional[float] = None

    def ms(self, kind: str, nbytes: float, world_size: int, count: float = 1.0) -> float:
        """The transport of ``count`` collectives of ``kind`` carrying ``nbytes`` in all at
        ``world_size``: the fit of that W, else of the nearest probed W (the larger on a tie)."""
        if kind not in self.kinds:
            raise KeyError(f"transport.json has no {kind} (measured: {', '.join(sorted(self.kinds))})")
        nearest = min(self.kinds[kind], key=lambda f: (abs(f.world_size - world_size), -f.world_size))
        return nearest.ms(kind, nbytes, world_size, count)

    def own_ms(self, kind: str, nbytes: float, world_size: int, count: float = 1.0) -> float:
        """:meth:`ms` less the wire time of the link it was probed across (``link_gbps``): what the
        hosts themselves spend moving the bytes. Where transport and wire add up (the kinds outside
        hooks.cost.OVERLAPPING_KINDS: gloo's allgather, all_to_all, ...) the model adds each cell's own wire to this; a probe's time that already
        held its link's wire would count it twice. :meth:`ms` itself where no link is recorded."""
        probed = self.ms(kind, nbytes, world_size, count)
        if self.link_gbps is None:
            return probed
        return max(probed - 1000.0 * collective_seconds(kind, nbytes, world_size, self.link_gbps, 0.0, count), 0.0)

    def quartile(self) -> Optional["TransportFit"]:
        """The same probe read at its repeats' lower quartile (``Sample.p25_ms``) instead of their
        median, fitted alike; None where a sample lacks it (a probe before it). Where the repeats
        are bimodal (ranks time-sharing cores, a host's quota) the median is either mode by chance,
        so the report prices a cell with both readings and decides only what survives the two."""
        if not self.samples or any(s.p25_ms is None or s.p25_ms <= 0 for s in self.samples):
            return None
        again = fit([replace(s, ms=s.p25_ms) for s in self.samples], self.probe_s, self.hosts)
        kinds = {k: tuple(f for f in again.kinds[k] if f.world_size in {g.world_size for g in fits})
                 for k, fits in self.kinds.items()}
        return replace(again, kinds=kinds, link_gbps=self.link_gbps)

    def own_cores(self) -> "TransportFit":
        """The fit for a cluster cell, where every rank has a core: per kind only the world sizes
        probed without sharing cores (their fixed cost is not this machine's time-sharing),
        scaled by the ring to other W; a kind probed only shared keeps what it has."""
        kinds = {k: tuple(f for f in fits if not f.shared) or fits for k, fits in self.kinds.items()}
        return replace(self, kinds=kinds)

    def where(self) -> str:
        """Which hosts this transport was measured on, in one phrase (for the report)."""
        if not self.hosts:
            return "hosts not recorded (a transport.json from before they were)"
        adding = ", ".join(k for k in self.kinds if k not in OVERLAPPING_KINDS) or "no kind"
        link = ("" if self.link_gbps is None else
                f", across links of {self.link_gbps:g} Gbit/s (their wire taken out of {adding})")
        return "; ".join(h.describe() for h in self.hosts) + link

    @property
    def world_sizes(self) -> list[int]:
        return sorted({s.world_size for s in self.samples})

    @property
    def max_rel_error(self) -> float:
        """The worst fit's worst error over its own samples (0 with no fit)."""
        return max((f.max_rel_error for fits in self.kinds.values() for f in fits), default=0.0)

    def to_json(self) -> dict:
        return {"format": FORMAT, "kinds": {k: [asdict(f) for f in fits] for k, fits in self.kinds.items()},
                "samples": [asdict(s) for s in self.samples], "probe_s": {str(w): s for w, s in self.probe_s.items()},
                "hosts": [asdict(h) for h in self.hosts], "link_gbps": self.link_gbps}

    @classmethod
    def from_json(cls, data: dict) -> "TransportFit":
        if data.get("format") != FORMAT:
            raise ValueError(f"transport.json format {data.get('format')!r}, this reader reads {FORMAT}")
        return cls({k: tuple(KindFit(**f) for f in fits) for k, fits in data["kinds"].items()},
                   tuple(Sample(**s) for s in data["samples"]), {int(w): float(s) for w, s in data["probe_s"].items()},
                   tuple(ProbeHosts(**h) for h in data.get("hosts", ())),  # optional: format 2 before hosts
                   data.get("link_gbps"))  # optional: format 2 before a probe recorded its link


def read_file(path: str) -> TransportFit:
    """A transport.json on disk (``python -m service.probe`` writes one): OSError, ValueError
    (not JSON, another format), KeyError or TypeError (fields missing or unknown)."""
    import json

    with open(path) as f:
        return TransportFit.from_json(json.load(f))


def fit(samples: list[Sample], probe_s: dict[int, float], hosts: tuple[ProbeHosts, ...] = ()) -> TransportFit:
    """Per kind and probed W above 1, least squares of ms on (1, bytes sent) through the origin,
    each sample weighted by 1/ms (relative error: a small message's fixed cost counts as much as
    a large one's bytes); a negative coefficient is clipped to 0 and the other refitted alone."""
    kinds = {}
    for kind in ALL_KINDS:
        sizes = sorted({s.world_size for s in samples if s.kind == kind and s.world_size > 1})
        if sizes:
            kinds[kind] = tuple(_fit_kind(kind, w, [s for s in samples if s.kind == kind and s.world_size == w])
                                for w in sizes)
    return TransportFit(kinds, tuple(samples), dict(probe_s), tuple(hosts))


def _fit_kind(kind: str, world_size: int, samples: list[Sample]) -> KindFit:
    xs = [(1.0 / s.ms, wire_bytes(kind, s.nbytes, world_size) / s.ms) for s in samples]
    a11 = sum(r * r for r, _ in xs)
    a12 = sum(r * b for r, b in xs)
    a22 = sum(b * b for _, b in xs)
    y1, y2 = sum(r for r, _ in xs), sum(b for _, b in xs)  # the targets are ms / ms = 1
    det = a11 * a22 - a12 * a12
    fixed, per_byte = ((y1 * a22 - y2 * a12) / det, (a11 * y2 - a12 * y1) / det) if det > 0 else (-1.0, -1.0)
    if fixed < 0 or per_byte < 0:  # one term alone: the one that explains the samples better
        alone = [(y1 / a11, 0.0) if a11 else (0.0, 0.0), (0.0, y2 / a22) if a22 else (0.0, 0.0)]
        fixed, per_byte = min(alone, key=lambda c: _worst(kind, samples, KindFit(world_size, c[0], c[1], 0.0)))
    f = KindFit(world_size, fixed, per_byte, 0.0)
    return KindFit(world_size, fixed, per_byte, _worst(kind, samples, f), any(s.shared for s in samples))


def _worst(kind: str, samples: list[Sample], f: KindFit) -> float:
    return max(abs(f.ms(kind, s.nbytes, s.world_size) - s.ms) / s.ms for s in samples)


def medians(kind: str, world_size: int, nbytes: int, times_ms: list[float], shared: bool = False,
            cpu_ms: Optional[list[float]] = None) -> Sample:
    """One :class:`Sample` from a probe's repeated times and CPU times (the medians: one slow
    repeat is noise; and the times' lower quartile)."""
    return Sample(kind, world_size, nbytes, statistics.median(times_ms), len(times_ms), shared,
                  None if not cpu_ms else statistics.median(cpu_ms),
                  statistics.quantiles(times_ms, n=4)[0] if len(times_ms) > 1 else None)
